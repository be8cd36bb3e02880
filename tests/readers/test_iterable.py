import pyarrow as pa
import pytest

import padpipe as pp
from padpipe import Consumer, DataError
from padpipe.readers.iterable import IterableReader
from tests.contract import check_node_resume
from tests.readers.checks import check_split, epoch_batches, rows

RECORDS = [{"id": i, "text": f"text {i}", "label": i % 3} for i in range(23)]


def reader(iterable=RECORDS, **options):
    options.setdefault("consumer", Consumer())
    return IterableReader(iterable=iterable, **options)


def test_from_iterable_works():
    first, second = epoch_batches(reader(chunk_rows=5), epochs=2)
    assert rows(first) == RECORDS == rows(second)
    assert [b.num_rows for b in first] == [5, 5, 5, 5, 3]


def test_from_iterable_works_on_any_reiterable():
    class Numbers:
        def __iter__(self):
            return ({"n": i} for i in range(4))

    assert rows(epoch_batches(reader(Numbers()), epochs=2)[1]) == [{"n": i} for i in range(4)]


def test_from_iterable_keeps_one_schema_when_keys_drift():
    items = [
        {"id": 0, "text": "a"},
        {"id": 1, "note": "n"},
        {"id": 2, "text": None},
        {"id": 3, "text": "d", "extra": 1.5},
    ]
    batches = epoch_batches(reader(items, chunk_rows=2))[0]
    assert all(b.schema == batches[0].schema for b in batches)
    assert batches[0].schema.names == ["id", "text", "note"]
    assert rows(batches)[2:] == [{"id": 2, "text": None, "note": None}, {"id": 3, "text": "d", "note": None}]


def test_from_iterable_splits_rows_between_consumers():
    check_split(lambda c: IterableReader(iterable=RECORDS, chunk_rows=4, consumer=c), RECORDS, "id")
    check_split(lambda c: IterableReader(iterable=RECORDS, chunk_rows=4, consumer=c), RECORDS, "id", count=3)
    assert [r["id"] for r in rows(epoch_batches(reader(consumer=Consumer(worker=1, num_workers=3)))[0])] == list(
        range(1, 23, 3)
    )


def test_from_iterable_saves_and_restores_its_state():
    check_node_resume(lambda: reader(chunk_rows=4))
    check_node_resume(lambda: reader(chunk_rows=3, consumer=Consumer(worker=1, num_workers=2)))


def test_from_iterable_raises_error_when_an_item_is_not_a_dict():
    with pytest.raises(TypeError, match=r"^from_iterable item 2 is a str; expected a dict of column values\.$"):
        epoch_batches(reader([{"text": "a"}, {"text": "b"}, "c"]))
    with pytest.raises(TypeError, match=r"^`iterable` must be an iterable of dicts, but is a dict instead\.$"):
        IterableReader(iterable={"text": "a"})


def test_from_iterable_raises_error_when_values_do_not_make_a_column():
    with pytest.raises(DataError, match=r"^from_iterable items 0-1: cannot make a column from the values \("):
        epoch_batches(reader([{"n": 1}, {"n": "one"}]))


def test_from_iterable_raises_error_when_a_generator_is_read_twice():
    node = reader({"n": i} for i in range(3))
    assert rows(epoch_batches(node)[0]) == [{"n": 0}, {"n": 1}, {"n": 2}]
    with pytest.raises(
        ValueError, match=r"^from_iterable got a one-shot iterator \(such as a generator\), which cannot be read again"
    ):
        node.reset(None)


def test_from_iterable_loader_yields_record_batches():
    batches = list(pp.from_iterable(RECORDS, chunk_rows=10).loader())
    assert all(isinstance(b, pa.RecordBatch) for b in batches)
    assert rows(batches) == RECORDS
