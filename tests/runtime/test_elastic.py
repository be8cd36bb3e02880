"""Elastic resume: a state saved on R x W consumers continues on R' x W', nothing lost or repeated.

Ranks are simulated with explicit ``Consumer(rank=..., world_size=...)`` loaders in this process
(their DataLoader workers are real processes). Every old rank takes some batches and saves; every
new rank loads the list of all old states; the rows that came out before the save plus those after
it, in that epoch, are the epoch exactly once; the next epochs follow the new layout's plan.
"""

from __future__ import annotations

import collections
import pickle

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import padpipe as pp
from padpipe import Consumer

ROWS = 900
WORDS = "the cat sat on a mat and then ran far away from the big dog".split()
MAX_TOKENS = 512


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, str]:
    folder = tmp_path_factory.mktemp("elastic")
    paths = {}
    for name, start, rows in (("a", 0, ROWS), ("b", 10_000, 300)):
        texts = [" ".join(WORDS[(i + j) % len(WORDS)] for j in range(1 + (i * 7) % 40)) for i in range(rows)]
        table = pa.table({"text": texts, "rid": list(range(start, start + rows))})
        paths[name] = str(folder / f"{name}.parquet")
        pq.write_table(table, paths[name], row_group_size=160)  # uneven: 6 groups of 160 and 1 of 60
    paths["masked"] = str(folder / "masked.parquet")
    pq.write_table(pa.table(masked_rows()), paths["masked"], row_group_size=160)
    return paths


def masked_rows() -> dict[str, list]:
    """SFT-like token rows: a prompt masked with -100, then trained tokens; ``rid`` names each row."""
    ids = [[2 + (i * 13 + j * 7) % 500 for j in range(2 + (i * 11) % 40)] for i in range(ROWS)]
    labels = [[-100] * (1 + i % (len(row) - 1)) + row[1 + i % (len(row) - 1) :] for i, row in enumerate(ids)]
    return {"input_ids": ids, "labels": labels, "rid": list(range(ROWS))}


def bucketed(data) -> pp.Pipeline:
    return (
        pp.read_parquet(data["a"], chunk_rows=50)
        .shuffle(buffer_size=200, seed=1)
        .tokenize(pp.examples.tokenizer(), max_length=48, num_threads=1)
        .bucket(max_tokens=MAX_TOKENS, buffer_size=150)
        .pad()
    )


def packed(data) -> pp.Pipeline:
    return (
        pp.read_parquet(data["a"], chunk_rows=50)
        .shuffle(buffer_size=200, seed=2)
        .tokenize(pp.examples.tokenizer(), max_length=48, num_threads=1)
        .pack(64, batch_size=4, buffer_size=40)
    )


def packed_masked(data) -> pp.Pipeline:
    return (
        pp.read_parquet(data["masked"], chunk_rows=50)
        .shuffle(buffer_size=200, seed=3)
        .tokens(pad_id=0)
        .pack(64, batch_size=4, buffer_size=40, keep=("rid",))
    )


def mixed(data) -> pp.Pipeline:
    tok = pp.examples.tokenizer()
    a = pp.read_parquet(data["a"], chunk_rows=50).tokenize(tok, max_length=48, num_threads=1)
    b = pp.read_parquet(data["b"], chunk_rows=50).tokenize(tok, max_length=48, num_threads=1)
    return (
        pp.mix({"a": a, "b": b}, weights={"a": 3, "b": 1}, seed=4, chunk_rows=40)
        .bucket(max_tokens=MAX_TOKENS, buffer_size=100)
        .pad()
    )


def rows_of(batch: dict) -> list:
    """Row identities of a batch: ``rid`` when it has one, else a packed batch's documents as token tuples.

    A packed batch that keeps ``rid`` gives ``(rid, ids, labels)`` for each of its documents.
    """
    if isinstance(batch.get("rid"), list):
        flat, bounds = batch["input_ids"].flatten().tolist(), batch["cu_seq_lens_q"].tolist()
        labels, rids = batch["labels"].flatten().tolist(), [r for row in batch["rid"] for r in row]
        docs = [(tuple(flat[a:b]), tuple(labels[a:b])) for a, b in zip(bounds, bounds[1:]) if flat[a] != 0]
        assert len(docs) == len(rids), "one rid for each document of the batch, row by row"
        return [(rid, *doc) for rid, doc in zip(rids, docs)]
    if "rid" in batch:
        assert batch["input_ids"].numel() <= MAX_TOKENS
        return batch["rid"].tolist()
    flat, bounds = batch["input_ids"].flatten().tolist(), batch["cu_seq_lens_q"].tolist()
    docs = [tuple(flat[a:b]) for a, b in zip(bounds, bounds[1:])]
    return [d for d in docs if d[0] != 0]  # the padding run is made of the pad id (0)


def expected_rows(pipe_name: str, data) -> collections.Counter:
    if pipe_name == "packed_masked":  # each document whole, with its own labels, -100 at its first token
        rows = masked_rows()
        return collections.Counter(
            (rid, tuple(ids), (-100, *labels[1:]))
            for rid, ids, labels in zip(rows["rid"], rows["input_ids"], rows["labels"])
        )
    if pipe_name != "packed":
        total = list(range(ROWS)) + (list(range(10_000, 10_300)) if pipe_name == "mixed" else [])
        return collections.Counter(total)
    pipe = pp.read_parquet(data["a"]).tokenize(pp.examples.tokenizer(), max_length=48, num_threads=1).batch(ROWS).pad()
    batch = next(iter(pipe.loader()))
    return collections.Counter(
        tuple(ids[m.bool()].tolist()) for ids, m in zip(batch["input_ids"], batch["attention_mask"])
    )


PIPELINES = {"bucketed": bucketed, "packed": packed, "packed_masked": packed_masked, "mixed": mixed}


def loader(pipe: pp.Pipeline, rank: int, ranks: int, workers: int):
    return pipe.loader(num_workers=workers, consumer=Consumer(rank=rank, world_size=ranks))


def save_old(pipe: pp.Pipeline, ranks: int, workers: int, take: int) -> tuple[list, collections.Counter]:
    """Each old rank takes ``take`` batches of epoch 0 and saves: the states and the rows that came out."""
    states, seen = [], collections.Counter()
    for rank in range(ranks):
        old = loader(pipe, rank, ranks, workers)
        it = iter(old)
        for _ in range(take):
            seen.update(rows_of(next(it)))
        states.append(pickle.loads(pickle.dumps(old.state_dict())))
    return states, seen


def resume_new(pipe: pp.Pipeline, states: list, ranks: int, workers: int, epochs: int = 1) -> list[collections.Counter]:
    """Every new rank loads all old states: the rows of the rest of epoch 0, then of each later epoch."""
    per_epoch = [collections.Counter() for _ in range(1 + epochs)]
    for rank in range(ranks):
        new = loader(pipe, rank, ranks, workers)
        new.load_state_dict(states)
        for e in range(1 + epochs):
            for batch in new:
                per_epoch[e].update(rows_of(batch))
    return per_epoch


@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")  # 3 workers on 2 cores, on purpose
@pytest.mark.parametrize(
    ("name", "old", "new"),
    [
        # the layouts tests/runtime/test_elastic_torchrun.py does not run (more workers than cores, 1 rank)
        ("bucketed", (2, 2), (1, 3)),
        ("packed", (2, 2), (1, 3)),
        ("packed", (2, 1), (4, 1)),
        ("packed_masked", (2, 1), (3, 0)),
        ("packed_masked", (3, 0), (2, 2)),
        ("mixed", (4, 0), (2, 2)),
    ],
)
def test_elastic_resume_yields_the_rest_of_the_epoch_exactly_once(data, name, old, new):
    pipe = PIPELINES[name](data)
    every = expected_rows(name, data)
    states, before = save_old(pipe, *old, take=3)
    assert 0 < sum(before.values()) < sum(every.values())
    rest, *later = resume_new(pipe, states, *new)
    assert before + rest == every, "the epoch, before and after the change, has every row exactly once"
    for epoch in later:
        assert epoch == every, "later epochs read every row once on the new layout"


def test_elastic_resume_of_a_finished_epoch_starts_the_next(data):
    pipe = bucketed(data)
    states = []
    for rank in range(2):
        old = loader(pipe, rank, 2, 0)
        list(old)  # the loop ended: the state says so
        states.append(old.state_dict())
    new = loader(pipe, 0, 1, 0)
    new.load_state_dict(states)
    reference = loader(pipe, 0, 1, 0)
    list(reference)
    assert [b["rid"].tolist() for b in new] == [b["rid"].tolist() for b in reference]  # epoch 1 of the new layout


@pytest.mark.parametrize("name", ["bucketed", "packed", "packed_masked", "mixed"])
def test_a_run_resized_twice_in_one_epoch_reads_every_row_once(data, name):
    """2 x 0 -> 3 x 0 (a state saved while the plan's batches and pieces come out) -> 1 x 2, then 2 x 1."""
    pipe = PIPELINES[name](data)
    old, seen = save_old(pipe, 2, 0, take=2)
    mids = []
    for rank in range(3):
        new = loader(pipe, rank, 3, 0)
        new.load_state_dict(old)
        it = iter(new)
        for _ in range(2):
            seen.update(rows_of(next(it)))
        mid = pickle.loads(pickle.dumps(new.state_dict()))
        rest = [rows_of(b) for b in it] + [rows_of(b) for b in new]
        again = loader(pipe, rank, 3, 0)
        again.load_state_dict(mid)
        assert [rows_of(b) for b in again] + [rows_of(b) for b in again] == rest, "same layout: exact"
        mids.append(mid)
    for layout in ((1, 2), (2, 1)):
        rest, later = resume_new(pipe, mids, *layout, epochs=1)
        assert seen + rest == expected_rows(name, data), f"resized again to {layout}: every row once"
        assert later == expected_rows(name, data)


def test_elastic_resume_asks_for_every_old_rank_once(data):
    pipe = bucketed(data)
    states, _ = save_old(pipe, 2, 0, take=1)
    with pytest.raises(
        pp.StateMismatchError,
        match=r"^PipelineLoader states hold rank 0 more than once \(ranks \[0, 0\]\): "
        r"pass each rank's state of one checkpoint once\.$",
    ):
        loader(pipe, 0, 3, 0).load_state_dict([states[0], states[0]])
    with pytest.raises(pp.StateMismatchError, match=r"pass the states of all 2 saved ranks"):
        loader(pipe, 0, 3, 0).load_state_dict([states[1]])


def test_elastic_resume_refuses_a_source_without_work_units():
    pipe = pp.from_iterable([{"text": "a b"}] * 40).tokenize(pp.examples.tokenizer()).batch(4).pad()
    states = []
    for rank in range(2):
        old = loader(pipe, rank, 2, 0)
        next(iter(old))
        states.append(old.state_dict())
    with pytest.raises(pp.StateMismatchError, match=r"^elastic resume cannot re-share a IterableReader"):
        loader(pipe, 0, 1, 0).load_state_dict(states)
    assert torch.is_tensor(next(iter(loader(pipe, 0, 1, 0)))["input_ids"])


def test_elastic_resume_yields_the_batches_equal_steps_had_read_ahead(data, monkeypatch):
    """Under torch.distributed, equal steps holds batches read ahead; they go to new rank r % R'."""
    from tests.runtime.fake_group import run_ranks

    pipe = bucketed(data)

    def old_rank(rank: int):
        old = loader(pipe, rank, 2, 0)
        it, seen = iter(old), collections.Counter()
        for _ in range(3):
            seen.update(rows_of(next(it)))
        return pickle.loads(pickle.dumps(old.state_dict())), seen

    saved = run_ranks(monkeypatch, [lambda r=r: old_rank(r) for r in range(2)])
    states = [state for state, _ in saved]
    assert all(state["root"]["lockstep"]["held"] for state in states), "equal steps had batches read ahead"
    monkeypatch.undo()  # the new run: one process, no torch.distributed
    rest, later = resume_new(pipe, states, 3, 0, epochs=1)
    assert saved[0][1] + saved[1][1] + rest == expected_rows("bucketed", data)
    assert later == expected_rows("bucketed", data)


def test_lightning_loader_resumes_a_two_rank_checkpoint_on_one_rank(data):
    pytest.importorskip("lightning")
    from padpipe.checkpoints import CHECKPOINT
    from padpipe.integrations.lightning import LightningLoader

    pipe = bucketed(data)
    ranks, seen = [], collections.Counter()
    for rank in range(2):
        old = loader(pipe, rank, 2, 0)
        it = iter(old)
        for _ in range(2):
            seen.update(rows_of(next(it)))
        ahead = next(it)  # fetched by Lightning's loop, not trained: it comes again after the resume
        ranks.append({"loader": old.state_dict(), "ahead": [ahead]})
    new = LightningLoader(pipe.loader())
    new.load_state_dict(pickle.loads(pickle.dumps(CHECKPOINT.make({}, ranks=ranks))))
    rest = collections.Counter()
    for batch in new:
        new.taken()  # what ExactResume does for every batch the loop trains on
        rest.update(rows_of(batch))
    assert seen + rest == expected_rows("bucketed", data)
