"""The shape of torchdata's StatefulDataLoader state that elastic resume reads (``WorkerProcesses.worker_graphs``).

An elastic resume reads each worker's graph state out of the snapshot StatefulDataLoader saves. These
tests pin that shape for the installed torchdata, so an upgrade that moves it fails here, by name,
instead of resharing from a wrong position.
"""

from __future__ import annotations

import copy
import pickle

import pytest

import padpipe as pp
from padpipe.runtime.workers import WorkerProcesses
from padpipe.state import StateMismatchError, seal


@pytest.fixture
def pipe() -> pp.Pipeline:
    rows = [{"text": f"row {i} " * (1 + i % 5), "rid": i} for i in range(64)]
    return pp.from_iterable(rows).tokenize(pp.examples.tokenizer(), max_length=16).batch(4).pad()


def test_statefuldataloader_snapshot_holds_each_workers_iterator_state(pipe):
    node = WorkerProcesses(pipe, num_workers=2)
    node.reset()
    for _ in range(3):
        next(node)
    loader = node.get_state()["dataloader"]
    assert loader["_steps_since_snapshot"] == 0, "a snapshot at every step (snapshot_every_n_steps=1)"
    workers = loader["_snapshot"]["_worker_snapshots"]
    assert sorted(workers) == ["worker_0", "worker_1"]
    for worker in workers.values():
        iterator = worker["fetcher_state"]["dataset_iter_state"]
        assert set(iterator) >= {"epoch", "node"}, "PipelineIterator.state_dict() as each worker saved it"
    node.close()


def test_worker_graphs_reads_every_workers_graph_and_the_epoch(pipe):
    node = WorkerProcesses(pipe, num_workers=2)
    node.reset()
    for _ in range(3):
        next(node)
    state = pickle.loads(pickle.dumps(node.get_state()))
    graphs, epoch = WorkerProcesses.worker_graphs(state, 2)
    assert epoch == 0 and len(graphs) == 2 and all(isinstance(g, dict) and "version" in g for g in graphs)
    for _ in node:
        pass
    done, _ = WorkerProcesses.worker_graphs(node.get_state(), 2)
    assert done == [WorkerProcesses.DONE] * 2
    node.close()


def test_worker_graphs_refuses_a_state_of_another_number_of_workers(pipe):
    node = WorkerProcesses(pipe, num_workers=2)
    node.reset()
    next(node)
    state = node.get_state()
    node.close()
    with pytest.raises(
        StateMismatchError,
        match=r"^PipelineLoader state is invalid: 'layout' says 3 worker process\(es\) a rank, but its root is no "
        r"state of them \(WorkerProcesses state doesn't match this pipeline: setting 'num_workers' found 2 instead of "
        r"3\.\)$",
    ):
        WorkerProcesses.worker_graphs(state, 3)


MUST = "WorkerProcesses state is invalid: 'dataloader' must be None or a StatefulDataLoader state"


def resealed(state: dict, edit) -> dict:
    """``state`` with ``edit`` applied to a copy of its StatefulDataLoader state, the checksum recomputed."""
    loader = copy.deepcopy(state["dataloader"])
    return seal({**state, "dataloader": edit(loader)})


def at_iterator(loader: dict, edit) -> dict:
    """``loader`` with ``edit`` applied to worker 0's iterator state."""
    edit(loader["_snapshot"]["_worker_snapshots"]["worker_0"]["fetcher_state"]["dataset_iter_state"])
    return loader


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda s: "x", r", but is 'x' instead"),
        (lambda s: -1, r", but is -1 instead"),
        (lambda s: {"a": 1}, r" with '_steps_since_snapshot' an int >= 0, but is missing instead"),
        (lambda s: {**s, "_iterator_finished": 1}, r" with '_iterator_finished' a bool, but is 1 instead"),
        (
            lambda s: {**s, "_snapshot": {**s["_snapshot"], "_worker_snapshots": [1]}},
            r" with '_snapshot/_worker_snapshots' a dict, but is \[1\] instead",
        ),
        (
            lambda s: {**s, "_snapshot": {**s["_snapshot"], "_worker_snapshots": {"worker_0": {"fetcher_state": 5}}}},
            r" with '_snapshot/_worker_snapshots/worker_0/fetcher_state' None or a dict, but is 5 instead",
        ),
        (
            lambda s: at_iterator(s, lambda it: it.update(epoch={"x": 1})),
            r" with '_snapshot/_worker_snapshots/worker_0/fetcher_state/dataset_iter_state/epoch' an int >= 0, but is "
            r"\{'x': 1\} instead",
        ),
        (
            lambda s: at_iterator(s, lambda it: it["stats"].update(rows=b"x" * 10**6)),
            r" with '_snapshot/_worker_snapshots/worker_0/fetcher_state/dataset_iter_state/stats' a dict of rows, "
            r"batches, real_tokens, padded_tokens, wall_seconds \(numbers >= 0\) and skipped, seconds, counters "
            r"\(names to numbers >= 0\), but is \{'batches': .{40,60} instead",
        ),
        (
            lambda s: {**s, "_snapshot": {**s["_snapshot"], "_main_snapshot": {"_num_workers": 2}}},
            r" with '_snapshot/_main_snapshot/_sampler_iter_yielded' an int >= 0, but is missing instead",
        ),
    ],
    ids=["str", "int", "keys", "finished", "workers", "fetcher", "epoch", "stats", "main"],
)
def test_worker_processes_raises_state_mismatch_for_a_resealed_loader_state(pipe, edit, message):
    """torchdata checks its own state with assert and indexing: a hand-edited one is refused first, by key."""
    node = WorkerProcesses(pipe, num_workers=2)
    node.reset()
    next(node)
    state = node.get_state()
    node.close()
    with pytest.raises(StateMismatchError, match=rf"^{MUST}{message}\.$"):
        WorkerProcesses(pipe, num_workers=2).reset(resealed(state, edit))
    with pytest.raises(StateMismatchError, match=rf"^{MUST}"):
        WorkerProcesses.STATE.check(resealed(state, edit), {"num_workers": 2})
