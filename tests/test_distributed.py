"""Two real ranks (torchrun, gloo on CPU) through every loader path: equal steps, every row once, exact resume.

Runs tests/dist_scripts/loaders_run.py with ``torch.distributed.run --nproc_per_node=2`` twice: once
for the matrix of loaders (each rank writes what it read to JSON), once in fresh processes that
resume from the states the first run saved with ``torch.save``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch.distributed as dist

import padpipe as pp

SCRIPT = Path(__file__).parent / "dist_scripts" / "loaders_run.py"
UNEVEN_ROWS = 2100
SAMPLE_ROWS = 20_000
HELD_BACK = 0.01  # at most 1% of an epoch's rows may be held back by equal_steps="drop"


def torchrun(mode: str, data: Path, out: Path) -> subprocess.CompletedProcess:
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        str(SCRIPT),
        mode,
        str(data),
        str(out),
    ]
    try:
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=450,
            env={**__import__("os").environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"},  # loopback only
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"torchrun {mode} did not finish in 450 s (a hang?):\n{exc.stdout!s:.3000}{exc.stderr!s:.3000}")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-15000:]  # (a stalled rank's stacks included)
    return done


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    tmp = tmp_path_factory.mktemp("dist")
    table = pq.read_table(pp.examples.SAMPLE_PARQUET).slice(0, UNEVEN_ROWS)
    pq.write_table(table, tmp / "uneven.parquet", row_group_size=700)  # 3 row groups over 2 ranks x 2 workers
    matrix = torchrun("matrix", tmp, tmp)
    ranks = [json.loads((tmp / f"matrix-rank{r}.json").read_text()) for r in range(2)]
    return {"ranks": ranks, "stderr": matrix.stderr, "dir": tmp}


def epochs(runs: dict, *path: str) -> list[list[dict]]:
    """``[epoch][rank]`` records of one run."""
    per_rank = []
    for rank in runs["ranks"]:
        for key in path:
            rank = rank[key]
        per_rank.append(rank)
    return [list(e) for e in zip(*per_rank)]


def check_epoch(epoch: list[dict], total: int, *, exact: bool) -> None:
    assert epoch[0]["steps"] == epoch[1]["steps"], "equal steps on both ranks"
    seen = epoch[0]["rids"] + epoch[1]["rids"]
    assert len(seen) == len(set(seen)), "a row was read twice in one epoch"
    assert set(seen) <= set(range(total))
    held_back = total - len(set(seen))
    assert held_back == 0 if exact else held_back <= HELD_BACK * total, f"{held_back} rows held back"
    dropped = sum(rank.get("skipped", {}).get("equal_steps.dropped_rows", 0) for rank in epoch)
    if "skipped" in epoch[0]:
        assert dropped == held_back, "every row held back is counted in stats"


@pytest.mark.parametrize(("name", "total"), [("uneven", UNEVEN_ROWS), ("sample", SAMPLE_ROWS)])
def test_loader_with_workers_under_ddp_takes_equal_steps_and_reads_every_row_once(runs, name, total):
    records = epochs(runs, "loader_ddp", name)
    assert len(records) == (2 if name == "uneven" else 1)  # the sample's 20,000 rows: one epoch
    for epoch in records:
        check_epoch(epoch, total, exact=True)
        assert all(rank["skipped"] == {} for rank in epoch), "nothing dropped by default"
    if name == "uneven":
        assert records[0][0]["rids"] != records[1][0]["rids"], "epochs differ"


@pytest.mark.parametrize("workers", ["persistent", "fresh"])
@pytest.mark.parametrize("policy", ["balance", "repeat", "drop", "off"])
def test_dataloader_with_equal_steps_reads_every_row_once_per_epoch(runs, policy, workers):
    records = epochs(runs, "dataloader", f"{policy}-{workers}")
    assert len(records) == 2
    for epoch in records:
        if policy == "off":
            seen = epoch[0]["rids"] + epoch[1]["rids"]
            assert sorted(seen) == list(range(UNEVEN_ROWS))
        else:
            check_epoch(epoch, UNEVEN_ROWS, exact=policy != "drop")
    assert records[0][0]["rids"] != records[1][0]["rids"], "epochs differ"


def test_plain_dataloader_under_ddp_warns_about_the_hang(runs):
    assert runs["ranks"][0]["plain_rows"] > 0
    assert "pipe.loader(num_workers=N)" in runs["stderr"] and "pp.equal_steps(dataloader)" in runs["stderr"]
    assert runs["stderr"].count("DDP hangs at the end of an epoch") == 1  # rank 0's first worker only


def test_loader_with_workers_resumes_from_a_torch_saved_state_in_fresh_processes(runs):
    torchrun("resume", runs["dir"], runs["dir"])
    for rank in range(2):
        resumed = json.loads((runs["dir"] / f"resume-rank{rank}.json").read_text())["resumed"]
        saved = runs["ranks"][rank]["saved"]
        assert saved[0], "batches were left after the save"
        assert resumed == saved
