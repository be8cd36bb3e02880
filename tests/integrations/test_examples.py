"""The scripts in examples/ run as the README shows them (on a small slice of the sample)."""

from __future__ import annotations

import gzip
import os
import re
from importlib.util import find_spec

import pyarrow.parquet as pq
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import padpipe as pp  # noqa: E402
from tests.integrations.tiny import ROOT, run_script, write_mrpc  # noqa: E402


def require(*modules: str) -> None:
    """Skip unless ``modules`` are installed: found, not imported (the scripts import them in their own processes;
    importing Lightning here too would cost the test process about 3 CPU-s)."""
    for module in modules:
        if find_spec(module) is None:
            pytest.skip(f"needs {module}")


pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(find_spec("transformers") is None, reason="needs transformers"),
]
EXAMPLES = ROOT / "examples"
ROWS = 1000
MAX_STEPS, LOG_EVERY = 30, 15  # the Trainer example saves every 30 steps: one run stops, logs twice and checkpoints


@pytest.fixture(scope="module")
def parquet(tmp_path_factory):
    path = tmp_path_factory.mktemp("examples") / "train.parquet"
    pq.write_table(pq.read_table(pp.examples.SAMPLE_PARQUET).slice(0, ROWS), path, row_group_size=250)
    return str(path)


@pytest.fixture(scope="module")
def one_row(tmp_path_factory):
    """One row for two ranks: under torchrun, one rank trains it and the other a filler each epoch."""
    path = tmp_path_factory.mktemp("one") / "one.parquet"
    pq.write_table(pq.read_table(pp.examples.SAMPLE_PARQUET).slice(0, 1), path)
    return str(path)


@pytest.fixture(scope="module")
def trainer_run(tmp_path_factory):
    """train_hf_trainer.py on one process, stopped at ``MAX_STEPS`` and logging every ``LOG_EVERY`` steps: one run for
    the max-steps test and the train/evaluate/predict test. Returns the MRPC folder, the output folder and stdout."""
    require("datasets")
    folder = tmp_path_factory.mktemp("trainer")
    data = write_mrpc(folder / "mrpc", train_rows=1200, val_rows=100)
    steps = ("--max-steps", str(MAX_STEPS), "--log-every", str(LOG_EVERY))
    out = run_script(EXAMPLES / "train_hf_trainer.py", str(data), str(folder / "run"), *steps, processes=1).stdout
    return data, folder / "run", out


def test_ddp_example_under_torchrun_takes_equal_steps_over_every_row(parquet):
    """1,000 rows on 2 ranks: shares that bucket into unequal step counts (on one row they are equal by construction)."""
    out = run_script(EXAMPLES / "train_ddp.py", parquet, "--log-every", "10").stdout
    lines = out.splitlines()
    found = [re.fullmatch(r"rank (\d)/2 epoch (\d): (\d+) steps, ([\d,]+) rows", line) for line in lines]
    counts = [m.groups() for m in found if m]
    assert [(rank, epoch) for rank, epoch, _, _ in counts] == [("0", "0"), ("1", "0"), ("0", "1"), ("1", "1")], out
    for epoch in "01":
        pairs = [(int(steps), int(rows.replace(",", ""))) for _, e, steps, rows in counts if e == epoch]
        assert pairs[0][0] == pairs[1][0] and pairs[0][1] + pairs[1][1] == ROWS
    logs = [line for line, m in zip(lines, found) if not m]  # rank 0 alone prints: whole lines, in step order
    assert logs and all(re.fullmatch(r"epoch [01] step \d+: loss \d+\.\d{4} \(rank 0\)", line) for line in logs), out


@pytest.mark.parametrize(
    ("script", "extra"),
    [
        ("train_ddp.py", "[hf]"),
        ("train_accelerate.py", "[hf,accelerate]"),
        ("train_lightning.py", "[hf,lightning]"),
        ("train_hf_trainer.py", "[hf]"),
        ("train_sft.py", "[hf]"),
    ],
)
def test_examples_name_their_extra(script, extra):
    assert f"pip install 'padpipe{extra}'" in (EXAMPLES / script).read_text()


def test_trainer_example_stops_at_max_steps_and_logs_every_n_steps(trainer_run):
    _, run, out = trainer_run
    assert len(re.findall(r"'loss': ", out)) == 2, out  # the Trainer's own log lines, at steps 15 and 30
    assert not (run / f"checkpoint-{2 * MAX_STEPS}").exists()


def test_trainer_example_trains_evaluates_and_predicts_in_row_order(trainer_run):
    data, run, out = trainer_run
    assert re.search(r"^eval: 100 rows, loss \d\.\d{4}, accuracy \d\.\d{3}$", out, re.M), out
    labels = pq.read_table(data / "validation-00000-of-00001.parquet").column("label").to_pylist()[:8]
    assert f"predict: 100 rows in split order, labels [{' '.join(map(str, labels))}]" in out
    assert (run / f"checkpoint-{MAX_STEPS}" / "padpipe_loader.pt").is_file()


def test_sft_example_trains_packed_conversations_under_torchrun_and_resumes(tmp_path):
    script = EXAMPLES / "train_sft.py"
    data = tmp_path / "chats.jsonl"
    with gzip.open(pp.examples.CHATS_JSONL, "rt") as f:
        data.write_text("".join(line for line, _ in zip(f, range(300))))
    run = str(tmp_path / "run")
    out = run_script(script, str(data), run, "--seq-len", "512", "--max-steps", "4", "--log-every", "2").stdout
    assert len(re.findall(r"'loss': ", out)) == 2, out  # the Trainer's own log lines, at steps 2 and 4 (rank 0)
    assert re.search(r"^trained 4 steps: loss \d+\.\d{4}, [\d,]+ tokens seen$", out, re.M), out
    assert (tmp_path / "run" / "checkpoint-4" / "padpipe_loader.pt").is_file()
    out = run_script(script, str(data), run, "--seq-len", "512", "--max-steps", "6", "--log-every", "2").stdout
    assert re.search(r"^trained 6 steps: ", out, re.M) and len(re.findall(r"'loss': ", out)) == 1, out


@pytest.mark.parametrize("script", ["train_ddp.py", "train_accelerate.py", "train_lightning.py"])
def test_examples_under_torchrun_weigh_a_filler_by_zero_stop_at_max_steps_and_log_every_n_steps(
    script, one_row, tmp_path
):
    """One row for two ranks: each epoch is one step, one rank training the row and the other a filler, which the
    loops weigh by 0 and count no row of. ``--max-steps 4`` ends the 5 epochs after the fourth (the fifth never
    starts) and ``--log-every 2`` logs steps 2 and 4. (One launch for both promises: a launch costs ~15 CPU-s.)"""
    require({"train_accelerate.py": "accelerate", "train_lightning.py": "lightning"}.get(script, "torch"))
    args = [one_row] + ([str(tmp_path / "checkpoints")] if script == "train_lightning.py" else [])
    out = run_script(EXAMPLES / script, *args, "--epochs", "5", "--max-steps", "4", "--log-every", "2").stdout
    # (the ranks print at once, so one rank's line may run into the other's: the patterns anchor on no line)
    if script == "train_ddp.py":  # each epoch: one rank trains the row, the other a filler it counts no row of
        lines = out.splitlines()  # rank 0 alone prints (the ranks' counts gathered): whole lines, in order
        found = [re.fullmatch(r"rank (\d)/2 epoch (\d): (\d+) steps, (\d+) rows", line) for line in lines]
        counts = [m.groups() for m in found if m]
        expected = [(rank, epoch, "1") for epoch in "0123" for rank in "01"]  # equal steps; no epoch 4
        assert [(rank, epoch, steps) for rank, epoch, steps, _ in counts] == expected, out
        for epoch in range(4):
            assert sorted(rows for *_, rows in counts[2 * epoch : 2 * epoch + 2]) == ["0", "1"], out
        logs = [line for line, m in zip(lines, found) if not m]  # at steps 2 and 4 in all: each epoch's only step
        assert len(logs) == 2 and all(
            re.fullmatch(rf"epoch {epoch} step 1: loss \d+\.\d{{4}} \(rank 0\)", line)
            for epoch, line in zip((1, 3), logs)
        ), out
    elif script == "train_accelerate.py":  # (Accelerate under torchrun with cpu=True names each rank 0/1)
        found = re.findall(r"rank (\d)/\d: (\d+) steps, (\d+) rows", out)
        assert sorted((steps, rows) for _, steps, rows in found) == [("4", "0"), ("4", "4")], out
        mains = sum(rank == "0" for rank, _, _ in found)  # each rank that calls itself the main process logs
        steps = sorted(int(n) for n in re.findall(r"step (\d+): loss \d+\.\d{4} \(main process\)", out))
        assert steps == sorted([2, 4] * mains), out
    else:  # ending with a last checkpoint
        assert re.findall(r"step (\d+): loss \d+\.\d{4} \(rank 0\)", out) == ["2", "4"], out
        assert len(re.findall(r"rank \d/2: 4 steps, 4 epochs", out)) == 2, out
        assert (tmp_path / "checkpoints" / "last.ckpt").is_file()
