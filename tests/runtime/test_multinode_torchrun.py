"""Two nodes simulated on one host: two ``torchrun`` launchers meet at a c10d rendezvous on 127.0.0.1.

Each launcher is one node of 2 ranks (``--nnodes=2 --node_rank=0/1 --nproc_per_node=2``), each
rank reading with ``pipe.loader(num_workers=2)``: 4 ranks x 2 workers. One launch of the two
nodes (tests/dist_scripts/elastic_run.py) takes a few steps, saves every rank's state and runs on
to the end of that epoch and one more; the saved states then resume twice: on the same two nodes
(every rank continues exactly as the uninterrupted run did) and on one node of 2 ranks (an
elastic resume, 4 ranks -> 2). The commands are those docs/distributed.md shows.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
import torch.distributed as dist

from tests.docs_blocks import ROOT
from tests.runtime.launchers import free_port, run_launchers, torchrun_command
from tests.runtime.test_elastic_torchrun import SCRIPT, check_resumed, expected, rows, write_corpus

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]  # the module fixture runs 3 launches, each bounded

KINDS = ("bucket", "pack")  # budget batches (ranks get unequal counts) and packing, both shuffled
NODES, PER_NODE, WORKERS, TAKE = 2, 2, 2, 3
TIMEOUT = 240


def launch(data: Path, tag: str, *extra: str, nnodes: int = NODES) -> list[dict]:
    """``nnodes`` launchers of ``PER_NODE`` ranks each at one rendezvous; every rank's record, by global rank."""
    endpoint = f"127.0.0.1:{free_port()}"
    args = (str(data), str(data), tag, "--workers", str(WORKERS), "--kinds", ",".join(KINDS), *extra)
    commands = [
        torchrun_command(SCRIPT, *args, nproc=PER_NODE, nnodes=nnodes, node_rank=n, endpoint=endpoint)
        for n in range(nnodes)
    ]
    run_launchers(commands, timeout=TIMEOUT, what=tag)
    return [json.loads((data / f"{tag}-rank{r}.json").read_text()) for r in range(nnodes * PER_NODE)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    data = write_corpus(tmp_path_factory.mktemp("multinode"))
    saved = data / "saved"
    saved.mkdir()
    return {
        "data": data,
        "whole": launch(data, "two-nodes", "--take", str(TAKE), "--save", str(saved)),  # then the rest and one more
        "again": launch(data, "two-nodes-resumed", "--load", str(saved)),
        "one-node": launch(data, "one-node", "--load", str(saved), nnodes=1),
    }


@pytest.mark.parametrize("kind", KINDS)
def test_two_nodes_read_every_row_once_per_epoch_with_equal_steps(runs, kind):
    every, records = expected(kind, runs["data"]), runs["whole"]
    assert rows(records, kind, "before") + rows(records, kind, "epochs", 0) == every
    assert rows(records, kind, "epochs", 1) == every
    for epoch in range(2):
        steps = [len(r[kind]["epochs"][epoch]) + (TAKE if epoch == 0 else 0) for r in records]
        assert len(set(steps)) == 1, f"every rank takes the same number of steps (epoch {epoch}: {steps})"
    assert [r[kind]["dropped"] for r in records] == [0] * 4, "equal steps dropped no row"


def test_two_nodes_share_by_global_rank_not_local_rank(runs):
    records = runs["whole"]
    env = [r["env"] for r in records]
    assert [(e["RANK"], e["WORLD_SIZE"], e["LOCAL_WORLD_SIZE"]) for e in env] == [(str(r), "4", "2") for r in range(4)]
    assert sorted(e["LOCAL_RANK"] for e in env) == ["0", "0", "1", "1"] and {e["GROUP_RANK"] for e in env} == {"0", "1"}
    for kind in KINDS:
        assert [r[kind]["layout"] for r in records] == [[rank, 4, WORKERS] for rank in range(4)]
    by_local: dict[str, list[set]] = {}  # ranks of the same local rank on the two nodes read other rows
    for record, e in zip(records, env):
        by_local.setdefault(e["LOCAL_RANK"], []).append(set(rows([record], "bucket", "epochs", 1)))
    assert all(a and b and not a & b for a, b in by_local.values())


@pytest.mark.parametrize("kind", KINDS)
def test_every_rank_of_two_nodes_resumes_exactly_from_its_own_state(runs, kind):
    for rank, (whole, again) in enumerate(zip(runs["whole"], runs["again"])):
        assert again[kind]["layout"] == [rank, 4, WORKERS]
        assert again[kind]["epochs"] == whole[kind]["epochs"], f"rank {rank}: the same batches after the save"


@pytest.mark.parametrize("kind", KINDS)
def test_two_nodes_resume_elastically_on_one_node(runs, kind):
    records = runs["one-node"]
    assert [r[kind]["layout"] for r in records] == [[0, 2, WORKERS], [1, 2, WORKERS]]
    check_resumed(rows(runs["whole"], kind, "before"), records, kind, expected(kind, runs["data"]))


def test_the_docs_show_the_commands_this_test_runs():
    page = (ROOT / "docs" / "distributed.md").read_text()
    endpoint = "127.0.0.1:29400"
    for nnodes, node in ((NODES, 0), (NODES, 1), (1, 0)):
        flags = torchrun_command("train.py", nproc=PER_NODE, nnodes=nnodes, node_rank=node, endpoint=endpoint)[3:-1]
        command = f"torchrun {' '.join(flags)} train.py"
        assert re.search(rf"^{re.escape(command)}( &)?$", page, flags=re.MULTILINE), (
            f"docs/distributed.md shows {command}"
        )


def test_a_launch_past_its_time_is_killed_with_every_process_it_started(tmp_path):
    pids = [tmp_path / f"node{n}.pid" for n in range(2)]
    commands = [["bash", "-c", f"sleep 60 & echo $! > {pid}; wait"] for pid in pids]  # a launcher and its rank
    with pytest.raises(pytest.fail.Exception, match=r"^torchrun sleepers did not finish in 3 s \(a hang\?\):"):
        run_launchers(commands, timeout=3, what="sleepers")
    for pid in pids:  # a killed process may take a moment to die on a loaded machine: wait up to 10 s
        status = Path(f"/proc/{int(pid.read_text())}/status")
        deadline = time.monotonic() + 10
        while status.exists() and "\nState:\tZ" not in status.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not status.exists() or "\nState:\tZ" in status.read_text(), "the rank was killed with its launcher"
