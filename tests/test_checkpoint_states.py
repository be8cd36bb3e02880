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
