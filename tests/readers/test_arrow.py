import json
import re

import datasets
import fsspec
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

import padpipe as pp
from padpipe import Consumer, DataError
from padpipe.readers.arrow import ArrowReader
from tests.contract import check_node_resume
from tests.readers.checks import check_split, epoch_batches, rows


def table(start, n):
    ids = list(range(start, start + n))
    return pa.table({"id": ids, "text": [f"row {i}" for i in ids]})


def write(path, tbl, *, stream, batch_rows=4):
    path.parent.mkdir(parents=True, exist_ok=True)
    with (ipc.new_stream if stream else ipc.new_file)(str(path), tbl.schema) as writer:
        for batch in tbl.to_batches(max_chunksize=batch_rows):
            writer.write_batch(batch)


@pytest.fixture
def folder(tmp_path):
    """A file-format file (ids 0-9) and a stream-format file (ids 10-20), record batches of 4."""
    write(tmp_path / "data/a.arrow", table(0, 10), stream=False)
    write(tmp_path / "data/b.arrow", table(10, 11), stream=True)
    return tmp_path / "data"


def reader(paths, **options):
    return ArrowReader(paths=str(paths), consumer=Consumer(), **options)


def ids(batches):
    return [r["id"] for r in rows(batches)]


def test_read_arrow_works_on_file_and_stream_formats(folder):
    [batches] = epoch_batches(reader(folder, chunk_rows=3))
    assert rows(batches) == table(0, 21).to_pylist()
    assert [b.num_rows for b in batches] == [3, 1, 3, 1, 2] + [3, 1, 3, 1, 3]


def test_read_arrow_lists_one_unit_per_record_batch(folder):
    node = reader(folder)
    node.reset()
    assert [(u.path.rsplit("/", 1)[1], u.index) for u in node._units] == [("a.arrow", i) for i in range(3)] + [
        ("b.arrow", i) for i in range(3)
    ]


def test_read_arrow_works_with_columns(folder):
    [batches] = epoch_batches(reader(folder, columns=["text", "id"]))
    assert batches[0].schema.names == ["text", "id"]
    assert rows(batches) == [{"text": r["text"], "id": r["id"]} for r in table(0, 21).to_pylist()]


def test_read_arrow_works_on_a_save_to_disk_folder(tmp_path):
    ds = datasets.Dataset.from_dict({"id": list(range(30)), "text": [str(i) for i in range(30)]})
    ds.save_to_disk(str(tmp_path / "saved"), num_shards=3)
    state = json.loads((tmp_path / "saved/state.json").read_text())
    names = [f["filename"] for f in state["_data_files"]]
    state["_data_files"] = [{"filename": n} for n in reversed(names)]  # the state's order wins over sorting
    (tmp_path / "saved/state.json").write_text(json.dumps(state))
    [batches] = epoch_batches(reader(tmp_path / "saved", columns=["id"], chunk_rows=4))
    assert ids(batches) == list(range(20, 30)) + list(range(10, 20)) + list(range(10))


def test_read_arrow_works_on_a_datasets_cache_file(tmp_path):
    ds = datasets.Dataset.from_dict({"id": list(range(25))})
    cache = tmp_path / "cache-x.arrow"
    mapped = ds.map(lambda r: {"double": r["id"] * 2}, cache_file_name=str(cache), writer_batch_size=6)
    assert cache.read_bytes()[:6] != b"ARROW1"  # datasets writes the stream format
    node = reader(cache, chunk_rows=4)
    [batches] = epoch_batches(node)
    assert rows(batches) == mapped.to_list()
    assert len(node._units) == 5  # one unit per record batch of 6 rows


def test_read_arrow_works_on_remote_files(folder):
    fs = fsspec.filesystem("memory")
    fs.pipe("/arrow_test/a.arrow", (folder / "a.arrow").read_bytes())
    fs.pipe("/arrow_test/b.arrow", (folder / "b.arrow").read_bytes())
    node = reader("memory://arrow_test", chunk_rows=3)
    [batches] = epoch_batches(node)
    assert ids(batches) == list(range(21))
    assert len(node._units) == 4  # the remote stream file is one unit
    check_node_resume(lambda: reader("memory://arrow_test", chunk_rows=3, seed=2))


def test_read_arrow_shuffles_units_per_epoch(folder):
    first, second = epoch_batches(reader(folder, seed=5), epochs=2)
    assert sorted(ids(first)) == list(range(21)) == sorted(ids(second))
    assert ids(first) != ids(second)
    assert ids(epoch_batches(reader(folder, seed=5))[0]) == ids(first)


def test_read_arrow_splits_units_between_consumers(tmp_path):
    everything = table(0, 50).to_pylist()
    for stream in (False, True):
        write(tmp_path / f"{stream}/one.arrow", table(0, 50), stream=stream, batch_rows=3)
        for seed in (None, 4):
            check_split(
                lambda c: ArrowReader(paths=str(tmp_path / f"{stream}"), seed=seed, consumer=c), everything, "id"
            )


def test_read_arrow_saves_and_restores_its_state(folder):
    check_node_resume(lambda: reader(folder, chunk_rows=3, seed=1))
    check_node_resume(lambda: reader(folder, chunk_rows=2, columns=["id"]))


def test_read_arrow_raises_error_when_a_column_is_missing(folder):
    name = re.escape(str(folder / "a.arrow"))
    with pytest.raises(DataError, match=rf"^{name}: no column 'txt'; available columns: \['id', 'text'\]\.$"):
        reader(folder, columns=["txt"]).reset()
    name = re.escape(str(folder / "b.arrow"))
    with pytest.raises(DataError, match=rf"^{name}: no column 'txt'; available columns: \['id', 'text'\]\.$"):
        reader(folder / "b.arrow", columns=["txt"]).reset()


@pytest.mark.parametrize("stream", [False, True])
def test_read_arrow_raises_error_when_a_file_is_truncated(folder, tmp_path, stream):
    data = (folder / ("b.arrow" if stream else "a.arrow")).read_bytes()
    bad = tmp_path / "bad.arrow"
    bad.write_bytes(data[: len(data) - 40])
    with pytest.raises(DataError, match=rf"^{re.escape(str(bad))}: not a readable Arrow IPC file or stream \("):
        reader(bad).reset()


def test_read_arrow_raises_error_when_a_file_is_not_arrow_or_empty(tmp_path):
    (tmp_path / "x.arrow").write_text('{"id": 1}\n')
    with pytest.raises(DataError, match=rf"^{re.escape(str(tmp_path / 'x.arrow'))}: not a readable Arrow IPC"):
        reader(tmp_path / "x.arrow").reset()
    (tmp_path / "x.arrow").write_bytes(b"")
    with pytest.raises(DataError, match=r"^.*x\.arrow: empty file; expected an Arrow IPC file or stream\.$"):
        reader(tmp_path / "x.arrow").reset()


def test_read_arrow_raises_error_when_given_a_saved_dataset_dict(tmp_path):
    ds = datasets.Dataset.from_dict({"id": [1, 2]})
    datasets.DatasetDict({"train": ds, "test": ds}).save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(
        DataError,
        match=r"^.*dd: is a saved DatasetDict, not one dataset; pass one split's folder, one of \['train', 'test'\]\.$",
    ):
        reader(tmp_path / "dd").reset()
    assert ids(epoch_batches(reader(tmp_path / "dd/test"))[0]) == [1, 2]


def test_read_arrow_loader_yields_record_batches(folder):
    batches = list(pp.read_arrow(str(folder), chunk_rows=5).loader())
    assert all(isinstance(b, pa.RecordBatch) for b in batches)
    assert ids(batches) == list(range(21))


def test_read_arrow_raises_error_on_a_save_to_disk_state_without_its_file_list(tmp_path):
    datasets.Dataset.from_dict({"id": [1, 2]}).save_to_disk(str(tmp_path / "saved"))
    state = json.loads((tmp_path / "saved/state.json").read_text())
    del state["_data_files"]  # what a datasets release that renamed it would write
    (tmp_path / "saved/state.json").write_text(json.dumps(state))
    with pytest.raises(
        DataError, match=r"state\.json: a Dataset\.save_to_disk state must list its data files under '_data_files'"
    ):
        epoch_batches(reader(tmp_path / "saved"))
