import re

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import padpipe as pp
from padpipe import Consumer, DataError
from padpipe.readers.parquet import ParquetReader
from tests.contract import check_loader_resume, check_node_resume
from tests.readers.checks import check_split, epoch_batches, rows


def table(start, n):
    ids = list(range(start, start + n))
    return pa.table({"id": ids, "text": [f"row {i} " + "x" * (i % 7) for i in ids], "label": [i % 3 for i in ids]})


@pytest.fixture
def folder(tmp_path):
    """Three files of 10, 7 and 12 rows in row groups of 4."""
    for name, start, n in [("b.parquet", 10, 7), ("a.parquet", 0, 10), ("sub/c.parquet", 17, 12)]:
        (tmp_path / name).parent.mkdir(exist_ok=True)
        pq.write_table(table(start, n), tmp_path / name, row_group_size=4)
    return tmp_path


def expected(folder):
    files = [folder / "a.parquet", folder / "b.parquet", folder / "sub/c.parquet"]
    return pa.concat_tables([pq.read_table(f) for f in files]).to_pylist()


def reader(paths, **options):
    return ParquetReader(paths=str(paths) if not isinstance(paths, list) else paths, consumer=Consumer(), **options)


def test_read_parquet_works(folder):
    [batches] = epoch_batches(reader(folder, chunk_rows=3))
    assert rows(batches) == expected(folder)
    assert max(b.num_rows for b in batches) == 3
    assert [b.num_rows for b in batches][:4] == [3, 1, 3, 1]  # row groups of 4 cut in chunks of 3


def test_read_parquet_works_with_columns_globs_and_lists(folder):
    [batches] = epoch_batches(reader(folder / "*.parquet", columns=["label", "id"]))
    assert batches[0].schema.names == ["label", "id"]
    assert rows(batches) == [{"label": r["label"], "id": r["id"]} for r in expected(folder)[:17]]
    listed = reader([str(folder / "sub/c.parquet"), str(folder / "a.parquet")], columns=["id"])
    assert [r["id"] for r in rows(epoch_batches(listed)[0])] == list(range(17, 29)) + list(range(10))


def test_read_parquet_works_on_fsspec_urls(folder):
    fs = fsspec.filesystem("memory")
    fs.pipe("/pq_test/a.parquet", (folder / "a.parquet").read_bytes())
    [batches] = epoch_batches(reader("memory://pq_test", columns=["id"], chunk_rows=5))
    assert [r["id"] for r in rows(batches)] == list(range(10))


def test_read_parquet_shuffles_row_groups_per_epoch(folder):
    first, second = epoch_batches(reader(folder, seed=7), epochs=2)
    ids = sorted(r["id"] for r in expected(folder))
    assert sorted(r["id"] for r in rows(first)) == ids == sorted(r["id"] for r in rows(second))
    assert rows(first) != rows(second)
    assert rows(epoch_batches(reader(folder, seed=7))[0]) == rows(first)
    assert rows(epoch_batches(reader(folder, seed=8))[0]) != rows(first)


def test_read_parquet_splits_row_groups_between_consumers(tmp_path):
    pq.write_table(table(0, 50), tmp_path / "one.parquet", row_group_size=3)  # one file, 17 row groups
    everything = table(0, 50).to_pylist()
    for seed in (None, 3):
        check_split(lambda c: ParquetReader(paths=str(tmp_path), seed=seed, consumer=c, chunk_rows=2), everything, "id")
        check_split(lambda c: ParquetReader(paths=str(tmp_path), seed=seed, consumer=c), everything, "id", count=5)


def test_read_parquet_saves_and_restores_its_state(folder):
    check_node_resume(lambda: reader(folder, chunk_rows=3, seed=1))
    check_node_resume(lambda: reader(folder, chunk_rows=3, columns=["id"]))


def test_read_parquet_raises_error_when_a_column_is_missing(folder):
    name = re.escape(str(folder / "a.parquet"))
    with pytest.raises(DataError, match=rf"^{name}: no column 'txt'; available columns: \['id', 'text', 'label'\]\.$"):
        reader(folder, columns=["id", "txt"]).reset()


def test_read_parquet_raises_error_when_a_file_is_not_parquet_or_truncated(folder, tmp_path):
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad/x.parquet").write_text("id,text\n1,hello\n")
    with pytest.raises(
        DataError, match=rf"^{re.escape(str(tmp_path / 'bad/x.parquet'))}: not a readable Parquet file \("
    ):
        reader(tmp_path / "bad").reset()
    data = (folder / "a.parquet").read_bytes()
    (tmp_path / "bad/x.parquet").write_bytes(data[: len(data) // 2])
    with pytest.raises(
        DataError, match=rf"^{re.escape(str(tmp_path / 'bad/x.parquet'))}: not a readable Parquet file \("
    ):
        reader(tmp_path / "bad").reset()


def test_read_parquet_raises_error_when_arguments_are_wrong(folder):
    with pytest.raises(ValueError, match=r"^`chunk_rows` must be greater than zero, but is 0 instead\.$"):
        ParquetReader(paths=str(folder), chunk_rows=0)
    with pytest.raises(TypeError, match=r"^`columns` must be None or a list of column names, but is 'id' instead\.$"):
        ParquetReader(paths=str(folder), columns="id")
    with pytest.raises(FileNotFoundError, match=r"^No such file or folder: '.*nope\.parquet'\.$"):
        ParquetReader(paths=str(folder / "nope.parquet")).reset()


def test_read_parquet_loader_yields_record_batches(folder):
    batches = list(pp.read_parquet(str(folder), columns=["id"], chunk_rows=4).loader())
    assert all(isinstance(b, pa.RecordBatch) for b in batches)
    assert [r["id"] for r in rows(batches)] == [r["id"] for r in expected(folder)]


def test_read_parquet_loader_saves_and_restores_its_state(folder):
    check_loader_resume(lambda: pp.read_parquet(str(folder), chunk_rows=3).loader())
