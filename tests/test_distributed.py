"""Two real ranks (torchrun, gloo on CPU): every row once per epoch, equal steps, no hang.

Runs tests/dist_scripts/equal_steps_run.py with ``torch.distributed.run --nproc_per_node=2``; each rank
writes what it read (through ``DataLoader(pipe, num_workers=2)`` and ``pipe.loader()``) to a JSON file.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch.distributed as dist

SCRIPT = Path(__file__).parent / "dist_scripts" / "equal_steps_run.py"
ROWS, GROUP = 160, 10
WORDS = "the cat sat on a mat and then ran far away".split()


def write_dataset(path: Path) -> None:
    """16 row groups of 10 rows; every 4th group has long texts, so rank 0 gets more batches."""
    with pq.ParquetWriter(str(path), pa.schema([("text", pa.string()), ("rid", pa.int64())])) as writer:
        for g in range(ROWS // GROUP):
            words = 50 if g % 4 == 0 else 3
            rids = list(range(g * GROUP, (g + 1) * GROUP))
            texts = [" ".join(WORDS[(r + j) % len(WORDS)] for j in range(words)) for r in rids]
            writer.write_table(pa.table({"text": texts, "rid": rids}))


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    tmp = tmp_path_factory.mktemp("dist")
    write_dataset(tmp / "data.parquet")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
               str(SCRIPT), str(tmp / "data.parquet"), str(tmp)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"torchrun did not finish in 120 s (a hang?):\n{(exc.stdout or '')[-3000:]}{(exc.stderr or '')[-3000:]}")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return [json.loads((tmp / f"rank{r}.json").read_text()) for r in range(2)]


def per_epoch(ranks: list[dict], run: str, key: str) -> list[list]:
    """``[epoch][rank] -> value`` of ``key`` in ``run``."""
    return [[rank[run][e][key] for rank in ranks] for e in range(len(ranks[0][run]))]


@pytest.mark.parametrize("run", ["dataloader_off", "loader_off", "loader_repeat", "dataloader_repeat"])
def test_distributed_reads_every_row_once_per_epoch(ranks, run):
    for epoch in per_epoch(ranks, run, "rids"):
        assert sorted(epoch[0] + epoch[1]) == list(range(ROWS))


@pytest.mark.parametrize("source", ["loader", "dataloader"])
def test_distributed_equal_steps_stops_every_rank_at_the_first_end(ranks, source):
    off, stop = per_epoch(ranks, f"{source}_off", "steps"), per_epoch(ranks, f"{source}_stop_first", "steps")
    dropped = per_epoch(ranks, f"{source}_stop_first", "dropped")
    off_rids, stop_rids = per_epoch(ranks, f"{source}_off", "rids"), per_epoch(ranks, f"{source}_stop_first", "rids")
    for e in range(2):
        assert off[e][0] != off[e][1]  # token budgets made unequal batch counts
        assert stop[e] == [min(off[e])] * 2
        assert dropped[e] == [n - min(off[e]) for n in off[e]]
        assert all(stop_rids[e][r] == off_rids[e][r][: len(stop_rids[e][r])] for r in range(2))


@pytest.mark.parametrize("source", ["loader", "dataloader"])
def test_distributed_equal_steps_repeats_until_the_last_rank_ends(ranks, source):
    off, steps = per_epoch(ranks, f"{source}_off", "steps"), per_epoch(ranks, f"{source}_repeat", "steps")
    repeats = per_epoch(ranks, f"{source}_repeat", "repeats")
    for e in range(len(steps)):
        assert steps[e] == [max(off[e])] * 2
        assert repeats[e] == [max(off[e]) - n for n in off[e]]


def test_distributed_equal_steps_resumes_exactly_on_every_rank(ranks):
    for rank in ranks:
        assert rank["resume"] == {"stop_first": [True] * 4, "repeat": [True] * 4}
