"""Preference pairs under real ``torchrun`` (2 ranks, gloo, CPU), each with 2 DataLoader workers: every pair once
per epoch over the ranks, both of its members in one batch, every rank the same steps, ``num_items_in_batch`` the
pairs of each accumulation window on all ranks, and exact resume; padded (TRL's layout) and packed."""

from __future__ import annotations

import collections
import json

import pytest
import torch.distributed as dist

import padpipe as pp
from tests.runtime.launchers import run_launchers, torchrun_command

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

SCRIPT = "tests/dist_scripts/preference_run.py"
PAIRS = 61


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    data, out = tmp_path_factory.mktemp("pairs"), tmp_path_factory.mktemp("out")
    rows = pp.examples.preferences(PAIRS, seed=3)
    for part in range(3):  # three files: work units for the ranks and workers to share
        (data / f"part{part}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[part::3]))
    run_launchers([torchrun_command(SCRIPT, str(data), str(out), nproc=2)], timeout=540, what="preference")
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.parametrize("kind", ["padded", "packed"])
def test_every_pair_comes_once_per_epoch_whole_and_ranks_take_equal_steps(ranks, kind):
    for epoch in range(2):
        steps = [rank[kind]["epochs"][epoch] for rank in ranks]
        assert len(steps[0]) == len(steps[1]) > 2
        seen = collections.Counter(i for rank in steps for s in rank for i in s["pairs"])
        assert seen == collections.Counter(range(PAIRS))
        for k in range(0, len(steps[0]), 2):  # accumulation windows of 2 steps: the pairs of both ranks
            window = [s for rank in steps for s in rank[k : k + 2]]
            assert {s["items"] for s in window} == {sum(len(s["pairs"]) for s in window)}
    moved = collections.Counter()
    for rank in ranks:
        moved.update(rank[kind]["equal_steps"])
    assert moved["equal_steps.split_batches"] > 0, "the tail was evened out by splitting a batch of pairs"


@pytest.mark.parametrize("kind", ["padded", "packed"])
def test_a_loader_resumed_from_a_state_gives_the_same_steps(ranks, kind):
    for rank in ranks:
        assert rank[kind]["resumed"] == rank[kind]["epochs"][0]
