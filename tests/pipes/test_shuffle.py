"""ShuffleBuffer: every row once per epoch, seeded order, bounded displacement, exact resume."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from padpipe.errors import DataError
from padpipe.pipes.shuffle import ShuffleBuffer
from padpipe.state import StateMismatchError
from tests.contract import check_node_resume
from tests.pipes.nodes import ListNode


def record_batches(total: int, chunk: int) -> list[pa.RecordBatch]:
    return [
        pa.record_batch(
            {"rid": list(range(s, min(s + chunk, total))), "text": [f"t{i}" for i in range(s, min(s + chunk, total))]}
        )
        for s in range(0, total, chunk)
    ]


def run_epoch(node: ShuffleBuffer) -> list[pa.RecordBatch]:
    node.reset(None)
    return list(node)


def rids(batches: list[pa.RecordBatch]) -> list[int]:
    out = []
    for b in batches:
        assert b.column("text").to_pylist() == [f"t{i}" for i in b.column("rid").to_pylist()]
        out.extend(b.column("rid").to_pylist())
    return out


def test_shuffle_works() -> None:
    node = ShuffleBuffer(ListNode(record_batches(200, 10)), buffer_size=32, seed=0)
    batches = run_epoch(node)
    order = rids(batches)
    assert sorted(order) == list(range(200))
    assert order != list(range(200))
    # about the input chunk size: the first eviction is partial, the drain uses the chunk size
    assert all(1 <= b.num_rows <= 10 for b in batches)
    assert sum(b.num_rows == 10 for b in batches) >= len(batches) - 2
    # a buffer shuffle never emits a row before it arrives: row r (chunk start s) has position >= s - 32
    position = np.empty(200, dtype=np.int64)
    position[order] = np.arange(200)
    chunk_start = np.arange(200) // 10 * 10
    assert (position >= chunk_start - 32).all()
    # ... and it mixes: some rows of the first chunks come out well after their neighbours
    assert position[:10].max() > 42


def test_shuffle_works_when_the_buffer_is_smaller_or_larger_than_the_input() -> None:
    small = rids(run_epoch(ShuffleBuffer(ListNode(record_batches(100, 25)), buffer_size=3, seed=1)))
    large = rids(run_epoch(ShuffleBuffer(ListNode(record_batches(100, 25)), buffer_size=1000, seed=1)))
    assert sorted(small) == sorted(large) == list(range(100))
    assert small != list(range(100)) and large != list(range(100))


def test_shuffle_works_across_epochs_and_seeds() -> None:
    node = ShuffleBuffer(ListNode(record_batches(120, 8)), buffer_size=20, seed=7)
    first, second = rids(run_epoch(node)), rids(run_epoch(node))
    again = ShuffleBuffer(ListNode(record_batches(120, 8)), buffer_size=20, seed=7)
    other = ShuffleBuffer(ListNode(record_batches(120, 8)), buffer_size=20, seed=8)
    assert sorted(first) == sorted(second) == list(range(120))
    assert first != second
    assert rids(run_epoch(again)) == first and rids(run_epoch(again)) == second
    assert rids(run_epoch(other)) != first


def test_shuffle_works_on_empty_input_and_empty_batches() -> None:
    empty = pa.record_batch({"rid": pa.array([], pa.int64()), "text": pa.array([], pa.string())})
    assert run_epoch(ShuffleBuffer(ListNode([]), buffer_size=4, seed=0)) == []
    batches = [empty, *record_batches(6, 3), empty]
    assert sorted(rids(run_epoch(ShuffleBuffer(ListNode(batches), buffer_size=2, seed=0)))) == list(range(6))


def test_shuffle_works_when_a_later_batch_has_a_castable_schema() -> None:
    first = pa.record_batch({"rid": pa.array([0, 1], pa.int64()), "text": ["t0", "t1"]})
    second = pa.record_batch({"text": ["t2", "t3"], "rid": pa.array([2, 3], pa.int32())})
    out = run_epoch(ShuffleBuffer(ListNode([first, second]), buffer_size=1, seed=0))
    assert sorted(rids(out)) == [0, 1, 2, 3]
    assert all(b.schema.equals(first.schema) for b in out)


def test_shuffle_raises_error_when_a_batch_has_other_columns() -> None:
    first = pa.record_batch({"rid": [0], "text": ["t0"]})
    second = pa.record_batch({"other": [1]})
    with pytest.raises(
        DataError,
        match=r"^shuffle: the rows of an input record batch have columns \['other'\], but the rows buffered before have \['rid', 'text'\]; expected the same columns in every input \(pass `columns=` to the reader\)\.$",
    ):
        run_epoch(ShuffleBuffer(ListNode([first, second]), buffer_size=4, seed=0))


def test_shuffle_raises_error_when_an_item_is_not_a_record_batch() -> None:
    with pytest.raises(TypeError, match=r"^ShuffleBuffer expects pyarrow.RecordBatch items, but got dict instead\.$"):
        run_epoch(ShuffleBuffer(ListNode([{"text": "a"}]), buffer_size=4, seed=0))


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"buffer_size": 0, "seed": 0}, ValueError, r"^`buffer_size` must be greater than zero, but is 0 instead\.$"),
        ({"buffer_size": 4, "seed": -1}, ValueError, r"^`seed` must be a non-negative int, but is -1 instead\.$"),
        ({"buffer_size": 4, "seed": "x"}, TypeError, r"^`seed` must be an int, but is 'x' of type str instead\.$"),
    ],
)
def test_shuffle_raises_error_when_an_argument_is_bad(kwargs: dict, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        ShuffleBuffer(ListNode([]), **kwargs)


def test_shuffle_raises_error_when_the_state_has_another_seed() -> None:
    node = ShuffleBuffer(ListNode(record_batches(10, 5)), buffer_size=4, seed=1)
    state = node.state_dict()
    with pytest.raises(
        StateMismatchError,
        match=r"^ShuffleBuffer state doesn't match this pipeline: setting 'seed' found 1 instead of 2\.$",
    ):
        ShuffleBuffer(ListNode(record_batches(10, 5)), buffer_size=4, seed=2).reset(state)


@pytest.mark.parametrize(("total", "chunk", "buffer_size"), [(40, 5, 12), (30, 10, 3), (12, 4, 100)])
def test_shuffle_saves_and_restores_its_state(total: int, chunk: int, buffer_size: int) -> None:
    items = check_node_resume(
        lambda: ShuffleBuffer(ListNode(record_batches(total, chunk)), buffer_size=buffer_size, seed=5)
    )
    for epoch in items:
        assert sorted(r["rid"] for _, rows in epoch for r in rows) == list(range(total))


@pytest.mark.parametrize("seed", range(6))
def test_shuffle_raises_error_naming_file_and_column_when_a_file_has_another_type(tmp_path, seed: int) -> None:
    import pyarrow.parquet as pq

    import padpipe as pp

    for i in range(3):
        pq.write_table(
            pa.table({"text": [f"t{i}-{j}" for j in range(100)], "rid": range(100)}), tmp_path / f"g{i}.parquet"
        )
    pq.write_table(pa.table({"text": pa.array(range(1000, 1100)), "rid": range(100)}), tmp_path / "g3.parquet")
    pipe = pp.read_parquet(str(tmp_path), chunk_rows=25).shuffle(buffer_size=150, seed=seed)
    pipe = pipe.tokenize(pp.examples.TOKENIZER_JSON).batch(8).pad()
    pattern = (
        r"^shuffle: column 'text' is (int64|string) in the rows from \S+/g\d\.parquet, but (string|int64) in "
        r"the rows buffered before; expected one type per column in every input\.$"
    )
    with pytest.raises(DataError, match=pattern) as info:
        for _ in pipe.loader():
            pass
    assert ("int64 in the rows from" in str(info.value)) == ("g3.parquet" in str(info.value))


def test_shuffle_casts_within_a_kind_of_type_only() -> None:
    first = pa.record_batch({"text": pa.array(["a", "b"], pa.large_string()), "n": pa.array([1, 2], pa.int32())})
    second = pa.record_batch({"n": pa.array([3, 4], pa.int64()), "text": ["c", "d"]})
    out = run_epoch(ShuffleBuffer(ListNode([first, second]), buffer_size=1, seed=0))
    assert sorted(r for b in out for r in b.column("n").to_pylist()) == [1, 2, 3, 4]
    floats = pa.record_batch({"text": ["e"], "n": pa.array([0.5])})
    with pytest.raises(
        DataError,
        match=r"^shuffle: column 'n' is double in the rows of an input record batch, but int32 in the rows buffered before; expected one type per column in every input\.$",
    ):
        run_epoch(ShuffleBuffer(ListNode([first, floats]), buffer_size=4, seed=0))
