import gzip
import json
import re

import fsspec
import pyarrow as pa
import pytest
import zstandard

import padpipe as pp
from padpipe import Consumer, DataError
from padpipe.readers.jsonl import JsonlReader
from tests.contract import check_loader_resume, check_node_resume
from tests.readers.checks import check_split, epoch_batches, rows


def records(start, n):
    return [{"id": i, "text": f"doc {i} " + "word " * (i % 9), "label": i % 2} for i in range(start, start + n)]


def jsonl(recs, *, blank_every=0):
    lines = []
    for i, rec in enumerate(recs):
        lines.append(json.dumps(rec))
        if blank_every and i % blank_every == 0:
            lines.append("  " if i % 2 else "")
    return ("\n".join(lines) + "\n").encode()


@pytest.fixture
def folder(tmp_path):
    """Plain (ids 0-39, blank lines), gzip (40-64) and zstd (65-79, no final newline) files."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data/a.jsonl").write_bytes(jsonl(records(0, 40), blank_every=7))
    (tmp_path / "data/b.jsonl.gz").write_bytes(gzip.compress(jsonl(records(40, 25))))
    (tmp_path / "data/c.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(jsonl(records(65, 15)).rstrip()))
    return tmp_path / "data"


def reader(paths, **options):
    options.setdefault("unit_bytes", 400)
    options.setdefault("block_bytes", 150)
    return JsonlReader(paths=paths if isinstance(paths, list) else str(paths), consumer=Consumer(), **options)


def ids(batches):
    return [r["id"] for r in rows(batches)]


def test_read_jsonl_works(folder):
    node = reader(folder, chunk_rows=3)
    [batches] = epoch_batches(node)
    assert rows(batches) == records(0, 80)
    assert max(b.num_rows for b in batches) == 3
    plain = [u for u in node._units if u.path.endswith("a.jsonl")]
    assert len(plain) > 3 and len(node._units) == len(plain) + 2  # byte ranges; compressed files are one unit


@pytest.mark.parametrize("unit_bytes, block_bytes", [(1, 1), (37, 11), (400, 5000), (64 << 20, 2 << 20)])
def test_read_jsonl_works_whatever_the_unit_and_block_sizes(folder, unit_bytes, block_bytes):
    [batches] = epoch_batches(reader(folder / "a.jsonl", unit_bytes=unit_bytes, block_bytes=block_bytes))
    assert rows(batches) == records(0, 40)


def test_read_jsonl_works_with_columns(folder):
    [batches] = epoch_batches(reader(folder, columns=["text", "id"]))
    assert all(b.schema.names == ["text", "id"] for b in batches)
    assert rows(batches) == [{"text": r["text"], "id": r["id"]} for r in records(0, 80)]


def test_read_jsonl_works_on_fsspec_urls(folder):
    fs = fsspec.filesystem("memory")
    fs.pipe("/jsonl_test/a.jsonl", (folder / "a.jsonl").read_bytes())
    fs.pipe("/jsonl_test/b.jsonl.gz", (folder / "b.jsonl.gz").read_bytes())
    [batches] = epoch_batches(reader("memory://jsonl_test"))
    assert rows(batches) == records(0, 65)


def test_read_jsonl_keeps_one_schema_when_keys_drift(tmp_path):
    lines = [{"id": i, "text": "t", "meta": {"src": "a"}, "date": "2024-01-02"} for i in range(10)]
    lines += [{"id": i, "text": None} for i in range(10, 20)]  # keys missing, a value null
    lines += [{"id": i, "text": "u", "extra": 1, "date": "soon"} for i in range(20, 30)]
    (tmp_path / "d.jsonl").write_bytes(jsonl(lines))
    [batches] = epoch_batches(reader(tmp_path / "d.jsonl", block_bytes=100))
    schema = batches[0].schema
    assert schema.names == ["id", "text", "meta", "date"] and schema.field("date").type == pa.string()
    assert all(b.schema.equals(schema) for b in batches) and len(batches) > 3
    got = rows(batches)
    assert got[0] == {"id": 0, "text": "t", "meta": {"src": "a"}, "date": "2024-01-02"}
    assert got[10] == {"id": 10, "text": None, "meta": None, "date": None}
    assert got[29] == {"id": 29, "text": "u", "meta": None, "date": "soon"}
    [picked] = epoch_batches(reader(tmp_path / "d.jsonl", block_bytes=100, columns=["extra", "id"]))
    assert [r["extra"] for r in rows(picked)] == [None] * 20 + [1] * 10


def test_read_jsonl_shuffles_units_per_epoch(folder):
    first, second = epoch_batches(reader(folder, seed=3), epochs=2)
    assert sorted(ids(first)) == list(range(80)) == sorted(ids(second))
    assert ids(first) != ids(second)
    assert ids(epoch_batches(reader(folder, seed=3))[0]) == ids(first)


def test_read_jsonl_splits_one_file_between_consumers(folder):
    for seed in (None, 1):
        check_split(
            lambda c: JsonlReader(paths=str(folder / "a.jsonl"), unit_bytes=200, seed=seed, consumer=c),
            records(0, 40),
            "id",
            count=3,
        )


@pytest.mark.slow  # seconds alone: make test runs it, test-fast leaves it out
def test_read_jsonl_saves_and_restores_its_state(folder):
    check_node_resume(lambda: reader(folder, chunk_rows=4, seed=2))
    check_node_resume(lambda: reader(folder, chunk_rows=3, columns=["id"], unit_bytes=64 << 20, block_bytes=100))


def test_read_jsonl_resumes_at_the_saved_block(folder):
    node = reader(folder / "a.jsonl", chunk_rows=2, unit_bytes=64 << 20, block_bytes=200)
    node.reset()
    read = sum(next(node).num_rows for _ in range(6))
    state = node.state_dict()
    offset, first_row = state["block"]
    assert 0 < offset and 0 < first_row <= state["row"] == read
    fresh = reader(folder / "a.jsonl", chunk_rows=2, unit_bytes=64 << 20, block_bytes=200)
    fresh.reset(state)
    assert ids(list(fresh)) == list(range(read, 40))


SKIP_HINT = r"; pass on_error='skip' to read_jsonl to skip such lines \(counted per file\)\.$"


def test_read_jsonl_raises_error_naming_the_line_of_invalid_json(tmp_path):
    good = jsonl(records(0, 60)).decode().splitlines()
    for name, bad_line, problem in [
        (
            "x.jsonl",
            '{"id": 1, "text": "unclosed}',
            r"invalid JSON: Unterminated string starting at \(column 19\)" + SKIP_HINT,
        ),
        ("y.jsonl.gz", "[1, 2]", r"invalid JSON: expected an object, found an array" + SKIP_HINT),
        (
            "z.jsonl",
            '{"id": "one", "text": "a", "label": 0}',
            r"key 'id' is a string, expected a number; keys keep the types of the first block of .*z\.jsonl"
            + SKIP_HINT,
        ),
    ]:
        lines = good[:47] + [bad_line] + good[47:]
        data = ("\n".join(lines) + "\n").encode()
        (tmp_path / name).write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
        node = reader(tmp_path / name, unit_bytes=1000, block_bytes=120)
        with pytest.raises(DataError, match=rf"^{re.escape(str(tmp_path / name))} line 48: ({problem})"):
            epoch_batches(node)


def test_read_jsonl_raises_error_when_arguments_are_wrong(folder):
    with pytest.raises(ValueError, match=r"^`block_bytes` must be greater than zero, but is 0 instead\.$"):
        JsonlReader(paths=str(folder), block_bytes=0)
    with pytest.raises(FileNotFoundError, match=r"^'.*\*\.ndjson' matches no files; expected at least one \.jsonl/"):
        reader(folder / "*.ndjson").reset()


def test_read_jsonl_loader_yields_record_batches(folder):
    batches = list(pp.read_jsonl(str(folder), chunk_rows=16).loader())
    assert all(isinstance(b, pa.RecordBatch) for b in batches)
    assert rows(batches) == records(0, 80)


def test_read_jsonl_loader_saves_and_restores_its_state(folder):
    check_loader_resume(lambda: pp.read_jsonl(str(folder), chunk_rows=16).loader())


def first_error(path, **tokenize):
    pipe = pp.read_jsonl(str(path)).tokenize(pp.examples.TOKENIZER_JSON, **tokenize).batch(8).pad()
    with pytest.raises(DataError) as info:
        for _ in pipe.loader():
            pass
    return str(info.value)


@pytest.mark.parametrize("block_bytes", [64, 2 << 20])
@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_read_jsonl_raises_error_naming_the_line_of_bytes_that_are_not_utf8(tmp_path, block_bytes, on_error):
    lines = [json.dumps(r).encode() for r in records(0, 80)]
    lines[50] = b'{"id": 50, "text": "ab\xffcd", "label": 0}'
    (tmp_path / "bad.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    reader = JsonlReader(paths=str(tmp_path / "bad.jsonl"), block_bytes=block_bytes, consumer=Consumer())
    pattern = (
        rf"^{re.escape(str(tmp_path / 'bad.jsonl'))} line 51: invalid UTF-8 \(byte 23 of the line is 0xff\); "
        r"JSON Lines files must be UTF-8 \(re-encode the file, e.g. with iconv\)" + SKIP_HINT
    )
    with pytest.raises(DataError, match=pattern):
        reader.reset()  # the first block is read when listing
        list(reader)
    assert re.match(pattern, first_error(tmp_path / "bad.jsonl", on_error=on_error))


def test_read_jsonl_raises_error_naming_a_truncated_gzip_file(tmp_path):
    data = gzip.compress(jsonl(records(0, 300)))
    (tmp_path / "cut.jsonl.gz").write_bytes(data[: len(data) // 2])
    message = first_error(tmp_path / "cut.jsonl.gz")
    assert message == f"{tmp_path / 'cut.jsonl.gz'}: cannot read the file (Truncated compressed stream)."


def test_read_jsonl_blames_line_1_for_a_wrong_type_on_line_1(tmp_path):
    recs = records(0, 30)
    recs[0]["text"] = 5
    (tmp_path / "first.jsonl").write_bytes(jsonl(recs))
    assert first_error(tmp_path / "first.jsonl") == (
        f"{tmp_path / 'first.jsonl'} line 1: key 'text' is a number, but a string on 29 other line(s) (first: line 2); "
        "expected one type per key; pass on_error='skip' to read_jsonl to skip such lines (counted per file)."
    )
    recs = records(0, 30)
    recs[4]["text"] = 5  # the rarer type is blamed wherever it is
    (tmp_path / "fifth.jsonl").write_bytes(jsonl(recs))
    assert first_error(tmp_path / "fifth.jsonl").startswith(
        f"{tmp_path / 'fifth.jsonl'} line 5: key 'text' is a number"
    )


def test_read_jsonl_raises_error_on_an_empty_file_as_parquet_does(tmp_path):
    (tmp_path / "empty.jsonl").write_bytes(b"")
    (tmp_path / "empty.parquet").write_bytes(b"")
    assert (
        first_error(tmp_path / "empty.jsonl")
        == f"{tmp_path / 'empty.jsonl'}: empty file (0 bytes); expected JSON Lines."
    )
    with pytest.raises(
        DataError, match=r"empty\.parquet: not a readable Parquet file \(Parquet file size is 0 bytes\)\.$"
    ):
        next(iter(pp.read_parquet(str(tmp_path / "empty.parquet")).loader()))
    (tmp_path / "blank.jsonl").write_bytes(b"\n  \n")  # lines, but no rows: nothing to read, as a 0-row Parquet file
    assert list(pp.read_jsonl(str(tmp_path / "blank.jsonl")).loader()) == []
