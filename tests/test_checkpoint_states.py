"""A list of loader states must be one checkpoint of one run: refused, naming what differs, otherwise.

The attacks a mixed-up checkpoint folder makes: two steps of one rank, ranks from two steps, a rank
twice, states of two layouts. Each would have resumed onto rows some rank had already trained on.
"""

from __future__ import annotations

import pickle

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import padpipe as pp
from padpipe import Consumer
from tests.runtime.fake_group import run_ranks


@pytest.fixture(scope="module")
def pipe(tmp_path_factory) -> pp.Pipeline:
    path = tmp_path_factory.mktemp("ckpt") / "a.parquet"
    pq.write_table(
        pa.table({"text": [f"row {i} " * (1 + i % 9) for i in range(400)], "rid": list(range(400))}),
        path,
        row_group_size=100,
    )
    return pp.read_parquet(str(path), chunk_rows=50).tokenize(pp.examples.tokenizer(), max_length=32).batch(8).pad()


def states_at(pipe: pp.Pipeline, ranks: int, steps: list[int], monkeypatch=None) -> list[dict]:
    """Rank r takes ``steps[r]`` batches and saves (in lockstep threads when ``monkeypatch`` is given)."""

    def work(rank: int) -> dict:
        loader = pipe.loader(consumer=Consumer(rank=rank, world_size=ranks))
        it = iter(loader)
        for _ in range(steps[rank]):
            next(it)
        return pickle.loads(pickle.dumps(loader.state_dict()))

    if monkeypatch is None:
        return [work(r) for r in range(ranks)]
    return run_ranks(monkeypatch, [lambda r=r: work(r) for r in range(ranks)])


def test_loader_state_records_its_epoch_step_and_lockstep(pipe, monkeypatch):
    alone = states_at(pipe, 1, [3])[0]
    assert (alone["epoch"], alone["step"], alone["lockstep"]) == (0, 3, False)
    synced = states_at(pipe, 2, [4, 4], monkeypatch)
    assert [(s["epoch"], s["step"], s["lockstep"]) for s in synced] == [(0, 4, True), (0, 4, True)]


def test_two_steps_of_one_rank_are_refused(pipe):
    early, late = states_at(pipe, 1, [10])[0], states_at(pipe, 1, [20])[0]
    with pytest.raises(
        pp.StateMismatchError, match=r"^PipelineLoader states hold rank 0 more than once \(ranks \[0, 0\]\)"
    ):
        pipe.loader().load_state_dict([early, late])


def test_ranks_saved_at_different_steps_are_refused_on_any_layout(pipe, monkeypatch):
    step10 = states_at(pipe, 2, [10, 10], monkeypatch)
    step20 = states_at(pipe, 2, [20, 20], monkeypatch)
    mixed = [step10[0], step20[1]]
    for ranks in (2, 3):
        with pytest.raises(
            pp.StateMismatchError,
            match=r"^PipelineLoader states come from different checkpoints: "
            r"rank 0 at epoch 0 step 10, rank 1 at epoch 0 step 20; pass the states of one checkpoint",
        ):
            pipe.loader(consumer=Consumer(rank=0, world_size=ranks)).load_state_dict(mixed)


def test_ranks_saved_in_lockstep_at_different_steps_are_refused_even_if_called_independent(pipe, monkeypatch):
    mixed = [states_at(pipe, 2, [10, 10], monkeypatch)[0], states_at(pipe, 2, [20, 20], monkeypatch)[1]]
    with pytest.raises(
        pp.StateMismatchError,
        match=r"^PipelineLoader states come from different checkpoints: rank 0 at epoch 0 step 10, rank 1 at epoch 0 "
        r"step 20; pass the states of one checkpoint \(every rank's, saved at the same step\)\.$",
    ):
        pipe.loader().load_state_dict(mixed, independent=True)


@pytest.mark.parametrize("ranks", [2, 3])
def test_independent_ranks_saved_at_different_steps_are_refused_unless_said(pipe, ranks):
    states = states_at(pipe, 2, [10, 20])  # Consumer ranks, no lockstep: each saved at its own step
    assert [(s["step"], s["lockstep"]) for s in states] == [(10, False), (20, False)]
    with pytest.raises(
        pp.StateMismatchError,
        match=r"^PipelineLoader states come from different checkpoints: rank 0 at epoch 0 step 10, rank 1 at epoch 0 "
        r"step 20; pass the states of one checkpoint \(every rank's, saved at the same step\), or pass "
        r"independent=True if the ranks ran independently \(no equal steps\), each saving at a step of its own\.$",
    ):
        pipe.loader(consumer=Consumer(rank=0, world_size=ranks)).load_state_dict(states)


@pytest.mark.parametrize("ranks", [2, 3])
def test_independent_ranks_saved_at_different_steps_resume_every_row_once_when_said(pipe, ranks):
    steps = [10, 20]
    states = states_at(pipe, 2, steps)
    seen = []
    for rank, steps_taken in enumerate(steps):
        loader = pipe.loader(consumer=Consumer(rank=rank, world_size=2))
        seen += [r for b, _ in zip(loader, range(steps_taken)) for r in b["rid"].tolist()]
    rest = []
    for rank in range(ranks):
        loader = pipe.loader(consumer=Consumer(rank=rank, world_size=ranks))
        loader.load_state_dict(states, independent=True)
        rest += [r for b in loader for r in b["rid"].tolist()]
        assert loader.epoch == 0
    assert len(seen) == 8 * 30 and sorted(seen + rest) == list(range(400))  # every row once
    with pytest.raises(TypeError, match=r"^`independent` must be a bool, but is 'yes' instead\.$"):
        pipe.loader().load_state_dict(states, independent="yes")


def test_ranks_that_each_ended_their_share_at_different_steps_are_one_checkpoint(tmp_path):
    path = tmp_path / "uneven.parquet"
    texts = [f"row {i} " * (2 if i < 200 else 12) for i in range(400)]  # rank 1's share is 6x longer by tokens
    pq.write_table(pa.table({"text": texts}), path, row_group_size=100)
    pipe = pp.read_parquet(str(path)).tokenize(pp.examples.tokenizer(), max_length=64).pack(64, batch_size=4)
    states = []
    for rank in range(2):
        loader = pipe.loader(consumer=Consumer(rank=rank, world_size=2))
        for _ in loader:
            pass
        states.append(loader.state_dict())
    assert states[0]["step"] < states[1]["step"] and all(s["finished"] for s in states)
    resumed = pipe.loader(consumer=Consumer(rank=0, world_size=3))
    resumed.load_state_dict(states)
    assert list(resumed) and resumed.epoch == 1  # nothing was left of epoch 0: the next one


def test_states_of_two_layouts_are_refused(pipe):
    two, three = states_at(pipe, 2, [2, 2]), states_at(pipe, 3, [2, 2, 2])
    with pytest.raises(
        pp.StateMismatchError,
        match=r"^PipelineLoader states come from different runs: saved on "
        r"2 ranks x 0 workers, 3 ranks x 0 workers",
    ):
        pipe.loader().load_state_dict([two[0], three[1], three[2]])


def test_one_checkpoint_in_any_order_resumes_exactly(pipe):
    states = states_at(pipe, 2, [3, 3])
    reference = pipe.loader()
    seen = [
        r
        for batch in (pipe.loader(consumer=Consumer(rank=r, world_size=2)) for r in range(2))
        for b, _ in zip(batch, range(3))
        for r in b["rid"].tolist()
    ]
    resumed = pipe.loader()
    resumed.load_state_dict(list(reversed(states)))
    rest = [r for b in resumed for r in b["rid"].tolist()]
    assert sorted(seen + rest) == list(range(400))
    assert resumed.epoch == 0 and len(list(resumed)) == len(list(reference))
    assert resumed.epoch == 1
