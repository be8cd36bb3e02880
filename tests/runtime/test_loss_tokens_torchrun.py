"""``num_items_in_batch`` under real ``torchrun`` (2 ranks, gloo, CPU): accumulation gives the all-at-once gradient.

The identity checked, per optimizer step (a window of K batches on each of R ranks, holding N label
tokens in all, ``num_items_in_batch == N`` on every batch):

    sum over ranks r, batches b of grad(sum_loss(b) / N)  ==  grad(sum over all tokens of the loss / N)

that is, the gradient of the mean loss over all of the window's tokens at once. DDP *averages*
gradients over ranks, so under DDP the accumulated gradient is this sum divided by R: multiply the
loss by R to get the mean's gradient (HF ``Trainer`` does, ``loss *= num_processes``, when
``average_tokens_across_devices``). The script sums the gradients itself (``all_reduce(SUM)``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed as dist

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

SCRIPT = Path(__file__).parent.parent / "dist_scripts" / "accum_run.py"
TIMEOUT = 90
STEPS, SAVE_AT = 3, 4  # saved after the first batch of the second window (inside it)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    """Every rank's record of one launch; the launch is killed whole (its process group) on timeout."""
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    out = tmp_path_factory.mktemp("accum_torchrun")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(SCRIPT)]
    command += [str(out), "--steps", str(STEPS), "--save-at", str(SAVE_AT)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True
    )
    try:
        stdout, stderr = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        pytest.fail(f"torchrun did not finish in {TIMEOUT} s (a hang?):\n{stdout[-2000:]}{stderr[-3000:]}")
    assert proc.returncode == 0, f"torchrun:\n{stdout[-2000:]}{stderr[-5000:]}"
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


def check(windows: list[dict]) -> None:
    assert len(windows) >= 2
    for w in windows:
        assert w["items"] == [w["tokens"]], "every batch of the window carries the label tokens of all ranks' window"
        assert w["batches"][0] == w["batches"][1] and 1 <= w["batches"][0] <= STEPS
        assert w["diff"] <= 1e-12 * max(w["scale"], 1.0), "accumulated gradient == gradient of the mean at once"


@pytest.mark.parametrize("kind", ["padded", "packed"])
def test_accumulated_gradient_over_ranks_equals_the_gradient_of_the_mean_over_all_tokens(ranks, kind):
    for rank in ranks:
        check(rank[kind]["windows"])
    assert ranks[0][kind]["windows"] == ranks[1][kind]["windows"]  # both ranks agree on every window
    assert any(w["batches"][0] < STEPS for w in ranks[0][kind]["windows"]), "a short last window is checked too"


@pytest.mark.parametrize("kind", ["padded", "packed"])
def test_a_loader_resumed_inside_a_window_gives_the_same_batches_counts_and_gradients(ranks, kind):
    for rank in ranks:
        assert rank[kind]["resumed_same"] is True
        assert rank[kind]["resumed_windows"] == rank[kind]["windows"]
        check(rank[kind]["resumed_windows"])


def test_accumulation_steps_without_equal_steps_is_refused_on_several_ranks(ranks):
    for rank in ranks:
        assert rank["padded"]["off_refused"].startswith(
            "`accumulation_steps` sums each window's loss tokens over the ranks, so every rank must take the same "
            "steps: `equal_steps` must be 'balance', 'repeat' or 'drop' under torch.distributed, but is 'off' instead."
        )
