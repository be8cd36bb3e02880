"""Rows a reader or tokenize cannot use: skippable where the reader finds them, located where tokenize does.

One bad line in 300 (invalid UTF-8, invalid JSON, not an object, a value of the wrong type):
``read_jsonl(on_error="skip")`` gives the other 299 rows exactly once, counted per file, with
worker processes, the token cache and resume too; ``"raise"`` names the file and the line. A
``None`` text found by tokenize names the file and its row there, as the readers do.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import re

import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest

import padpipe as pp
from tests.contract import normalize

pytestmark = pytest.mark.timeout(120)

ROWS, BAD = 300, 150
TOK = pp.examples.tokenizer()
BAD_LINES = {
    "invalid UTF-8": b'{"idx": 150, "text": "caf\xe9 au lait"}',
    "invalid JSON": b'{"idx": 150, "text": "unclosed}',
    "not an object": b'[150, "text"]',
    "wrong type": b'{"idx": "one-fifty", "text": "a"}',
}
PROBLEMS = {
    "invalid UTF-8": r"invalid UTF-8 \(byte 26 of the line is 0xe9\)",
    "invalid JSON": r"invalid JSON: Unterminated string",
    "not an object": r"invalid JSON: expected an object, found an array",
    "wrong type": r"key 'idx' is a string, expected a number",
}


def write(tmp_path, bad: str, name: str = "data.jsonl"):
    lines = [json.dumps({"idx": i, "text": f"row {i} " + "word " * (i % 7)}).encode() for i in range(ROWS)]
    lines[BAD] = BAD_LINES[bad]
    data = b"\n".join(lines) + b"\n"
    path = tmp_path / name
    path.write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    return path


def read(path, *, small_blocks=True, **options):
    pipe = pp.read_jsonl(str(path), chunk_rows=16, **options)
    if not small_blocks:
        return pipe
    source = dataclasses.replace(pipe.source, options={**pipe.source.options, "unit_bytes": 4000, "block_bytes": 700})
    return dataclasses.replace(pipe, source=source)  # several byte ranges and blocks: the bad line is not in the first


def idx_of(loader) -> list[int]:
    return [i for batch in loader for i in batch.column("idx").to_pylist()]


@pytest.mark.parametrize("bad", list(BAD_LINES))
@pytest.mark.parametrize("name", ["data.jsonl", "data.jsonl.gz"])
@pytest.mark.parametrize("small_blocks", [True, False])
def test_read_jsonl_skips_a_bad_line_and_counts_it_for_its_file(tmp_path, bad, name, small_blocks):
    path = write(tmp_path, bad, name)
    loader = read(path, small_blocks=small_blocks, on_error="skip").loader()
    got = idx_of(loader)
    assert sorted(got) == [i for i in range(ROWS) if i != BAD] and len(got) == ROWS - 1
    assert loader.stats().skipped == {f"read.bad_row:{path}": 1}


@pytest.mark.parametrize("bad", list(BAD_LINES))
def test_read_jsonl_raises_error_naming_the_file_and_line_of_a_bad_line(tmp_path, bad):
    path = write(tmp_path, bad)
    pattern = (
        rf"^{re.escape(str(path))} line {BAD + 1}: {PROBLEMS[bad]}.*; pass on_error='skip' to read_jsonl to "
        r"skip such lines \(counted per file\)\.$"
    )
    with pytest.raises(pp.DataError, match=pattern):
        idx_of(read(path).loader())


def test_read_jsonl_skips_bad_lines_through_worker_processes(tmp_path):
    path = write(tmp_path, "invalid UTF-8")
    loader = read(path, on_error="skip").loader(num_workers=2)
    got = idx_of(loader)
    assert sorted(got) == [i for i in range(ROWS) if i != BAD]
    assert loader.stats().skipped == {f"read.bad_row:{path}": 1}


def test_read_jsonl_skipping_resumes_exactly_after_the_bad_line(tmp_path):
    path = write(tmp_path, "invalid JSON")
    pipe = read(path, on_error="skip").shuffle(buffer_size=50, seed=1)
    loader = pipe.loader()
    reference, states = [], []
    for batch in loader:
        reference.append(batch.column("idx").to_pylist())
        states.append(loader.state_dict())
    for k in (2, len(states) // 2, len(states) - 3):
        fresh = pipe.loader()
        fresh.load_state_dict(states[k])
        assert [b.column("idx").to_pylist() for b in fresh] == reference[k + 1 :]


def test_read_jsonl_skipping_gives_the_same_batches_with_the_token_cache(tmp_path):
    path = write(tmp_path, "wrong type")

    def pipe(cache=None):
        return read(path, on_error="skip").tokenize(TOK, fields="text", cache=cache).batch(16).pad()

    reference = [normalize(b) for b in pipe().loader()]
    cache = str(tmp_path / "cache")
    for _ in range(2):  # fills, then reads the cache
        loader = pipe(cache).loader()
        assert [normalize(b) for b in loader] == reference
    assert loader.stats().counters["cache.hit_rows"] == ROWS - 1


def test_tokenize_error_on_a_none_text_names_the_file_and_its_row(tmp_path):
    rows = [{"idx": i, "text": f"row {i}"} for i in range(ROWS)]
    rows[210]["text"] = None
    parquet = tmp_path / "data.parquet"
    pq.write_table(pa.Table.from_pylist(rows), parquet, row_group_size=70)
    pipe = pp.read_parquet(str(parquet), chunk_rows=16).tokenize(TOK, fields="text").batch(8).pad()
    with pytest.raises(
        pp.DataError,
        match=rf"^tokenize: field 'text' at row 210 of {re.escape(str(parquet))} "
        r"\(idx=210; row \d+ of the chunk\) is None; expected a string\. ",
    ):
        list(pipe.loader())
    jsonl = tmp_path / "data.jsonl"
    jsonl.write_bytes(b"".join(json.dumps(r).encode() + b"\n" for r in rows))
    with pytest.raises(
        pp.DataError,
        match=r"^tokenize: field 'text' at row \d+ of its byte range from byte \d+ of "
        rf"{re.escape(str(jsonl))} \(idx=210; row \d+ of the chunk\) is None",
    ):
        list(read(jsonl).tokenize(TOK, fields="text").batch(8).pad().loader())
    with pytest.raises(
        pp.DataError,
        match=rf"^tokenize: field 'text' at row 210 of {re.escape(str(jsonl))} "
        r"\(idx=210; row \d+ of the chunk\) is None",
    ):
        list(read(jsonl, small_blocks=False).tokenize(TOK, fields="text").batch(8).pad().loader())


@pytest.mark.parametrize("bad", [40, 210])  # 40: in the small first chunks tokenize cuts an epoch's first rows into
def test_tokenize_error_on_a_none_text_names_the_file_and_its_row_after_a_shuffle(tmp_path, bad: int):
    """Issue 30 item 7: after a shuffle a None text named only the chunk's row (asked before)."""
    rows = [{"idx": i, "text": f"row {i}"} for i in range(ROWS)]
    rows[bad]["text"] = None
    parquet, jsonl = tmp_path / "data.parquet", tmp_path / "data.jsonl"
    pq.write_table(pa.Table.from_pylist(rows), parquet, row_group_size=70)
    jsonl.write_bytes(b"".join(json.dumps(r).encode() + b"\n" for r in rows))
    for path, pipe in (
        (parquet, pp.read_parquet(str(parquet))),
        (parquet, pp.read_parquet(str(parquet), chunk_rows=16).shuffle(64, seed=1)),
        (parquet, pp.read_parquet(str(parquet)).shuffle(1000, seed=1)),  # a buffer larger than the input
        (jsonl, pp.read_jsonl(str(jsonl)).shuffle(64, seed=2)),
    ):
        with pytest.raises(
            pp.DataError,
            match=rf"^tokenize: field 'text' at row {bad} of {re.escape(str(path))} \(idx={bad}; row \d+ of the "
            r"chunk\) is None; expected a string\. 1 row\(s\) of this chunk have bad text; ",
        ):
            list(pipe.tokenize(TOK, fields="text").batch(8).pad().loader())


@pytest.mark.parametrize("cache", [False, True])
def test_tokenize_raises_or_skips_a_row_of_invalid_utf8_in_an_arrow_file(tmp_path, cache):
    values = [f"row {i}".encode() for i in range(ROWS)]
    values[123] = b"caf\xe9"  # Arrow IPC readers do not check UTF-8
    table = pa.table({"idx": list(range(ROWS)), "text": pa.array(values, pa.binary()).view(pa.string())})
    path = tmp_path / "data.arrow"
    with ipc.new_file(str(path), table.schema) as writer:
        for batch in table.to_batches(max_chunksize=64):
            writer.write_batch(batch)
    where = str(tmp_path / "cache") if cache else None

    def pipe(on_error):
        return pp.read_arrow(str(path), chunk_rows=16).tokenize(TOK, fields="text", on_error=on_error, cache=where)

    with pytest.raises(
        pp.DataError,
        match=rf"^tokenize: field 'text' at row 123 of {re.escape(str(path))} \(idx=123; "
        r"row 11 of the chunk\) is not valid UTF-8; expected a string\. ",
    ):
        list(pipe("raise").batch(8).pad().loader())
    loader = pipe("skip").batch(8).pad().loader()
    got = [i for batch in loader for i in batch["idx"].tolist()]
    assert sorted(got) == [i for i in range(ROWS) if i != 123] and loader.stats().skipped == {"tokenize.bad_text": 1}
