"""Mistakes fail at the call that made them: paths in pp.read_*, columns and fields in loader(), token chunks."""

from __future__ import annotations

import gzip
import json
import re
import traceback
from pathlib import Path

import pyarrow as pa
import pyarrow.feather as feather
import pyarrow.parquet as pq
import pytest

import padpipe as pp
from padpipe.errors import DataError

TOK = pp.examples.tokenizer()
READERS = [
    (pp.read_parquet, ".parquet/.parq/.pq"),
    (pp.read_arrow, ".arrow/.arrows/.feather/.ipc"),
    (pp.read_jsonl, ".jsonl/.ndjson/.json/.jsonl.gz"),
]


@pytest.fixture
def table() -> pa.Table:
    return pa.table({"text": ["a b", "c"], "label": [0, 1]})


def _raised(call) -> BaseException:
    with pytest.raises(Exception) as info:
        call()
    return info.value


@pytest.mark.parametrize("read, suffixes", READERS)
def test_read_raises_error_at_once_when_a_local_path_names_nothing(tmp_path: Path, read, suffixes: str) -> None:
    missing = str(tmp_path / "data" / "trian.parquet")
    with pytest.raises(FileNotFoundError, match=rf"^No such file or folder: {re.escape(repr(missing))}\.$"):
        read(missing)
    pattern = str(tmp_path / "data" / "train-*")
    with pytest.raises(
        FileNotFoundError,
        match=rf"^{re.escape(repr(pattern))} matches no files; expected at least one "
        rf"{re.escape(suffixes)}",
    ):
        read(pattern)
    (tmp_path / "empty" / "_hidden").mkdir(parents=True)
    (tmp_path / "empty" / "notes.txt").write_text("x")
    (tmp_path / "empty" / "_hidden" / "x.parquet").write_text("x")  # readers skip _ and . names in folders
    folder = str(tmp_path / "empty")
    good = tmp_path / f"ok{suffixes.split('/')[0]}"
    good.write_text("x")  # only whether it is there is checked at the call
    with pytest.raises(FileNotFoundError, match=rf"^{re.escape(repr(folder))} matches no files; "):
        read([str(good), folder])  # every path of a list is checked


def test_read_error_is_one_message_with_no_chained_exception(tmp_path: Path) -> None:
    error = _raised(lambda: pp.read_parquet(str(tmp_path / "*.parquet")))
    assert error.__cause__ is None and error.__context__ is None
    frames = [Path(f.filename) for f in traceback.extract_tb(error.__traceback__)]
    inside = [f.name for f in frames if f.parent.name == "padpipe"]
    assert inside == ["sources.py", "sources.py", "_checks.py"]  # raised by the call itself, not 20 frames deep


def test_read_accepts_what_the_reader_reads(tmp_path: Path, table: pa.Table) -> None:
    pq.write_table(table, tmp_path / "a.parquet")
    (tmp_path / "deep" / "er").mkdir(parents=True)
    feather.write_feather(table, str(tmp_path / "deep" / "er" / "b.arrow"))
    (tmp_path / ".c.jsonl").write_text('{"text": "a"}\n')  # a glob matches dot-files, as fsspec's does
    assert pp.read_parquet(str(tmp_path / "*.parquet")).source.name == "read_parquet"
    assert pp.read_arrow(str(tmp_path)).source.name == "read_arrow"  # found in a subfolder
    assert pp.read_jsonl(str(tmp_path / "*.jsonl")).source.name == "read_jsonl"
    assert pp.read_parquet(f"file://{tmp_path}/a.parquet").source.name == "read_parquet"


def test_read_checks_cheap_arguments_before_paths(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match=r"^`retries` must be an int or a Retry, but is '3' instead\.$"):
        pp.read_parquet(str(tmp_path / "nope.parquet"), retries="3")
    with pytest.raises(TypeError, match=r"^`paths` must be a path, a glob or a list of them, but is 3 instead\.$"):
        pp.read_parquet(3)


def test_remote_paths_are_not_listed_at_the_call() -> None:
    pipe = pp.read_parquet("memory://nothing-here/*.parquet")  # listed when first read, as before
    with pytest.raises(FileNotFoundError, match=r"matches no files"):
        next(iter(pipe.loader()))


@pytest.mark.parametrize("kind", ["parquet", "arrow file", "arrow stream"])
def test_loader_raises_error_when_a_field_is_not_in_a_local_file(tmp_path: Path, table: pa.Table, kind: str) -> None:
    if kind == "parquet":
        path = tmp_path / "a.parquet"
        pq.write_table(table, path)
        read = pp.read_parquet
    else:
        path = tmp_path / "a.arrow"
        with pa.OSFile(str(path), "wb") as sink:
            make = pa.ipc.new_file if kind == "arrow file" else pa.ipc.new_stream
            with make(sink, table.schema) as writer:
                writer.write_table(table)
        read = pp.read_arrow
    pipe = read(str(path)).shuffle(10).tokenize(TOK, fields="txt").batch(2).pad()
    message = r"^tokenize: text field 'txt' is not in the data; expected one of the columns \['text', 'label'\]\.$"
    with pytest.raises(DataError, match=message):
        pipe.loader()
    with pytest.raises(DataError, match=message):
        iter(pipe)
    with pytest.raises(
        DataError, match=rf"^{re.escape(str(path))}: no column 'lable'; available columns: \['text', 'label'\]\.$"
    ):
        read(str(path), columns=["text", "lable"]).loader()
    columns_message = r"^tokenize: text field 'label2' is not in the data; expected one of the columns \['text'\]\.$"
    with pytest.raises(DataError, match=columns_message):  # columns= narrows what tokenize can see
        read(str(path), columns=["text"]).tokenize(TOK, fields=("text", "label2")).batch(2).pad().loader()
    assert next(iter(read(str(path)).tokenize(TOK).batch(2).pad().loader()))["labels"].tolist() == [0, 1]


def test_loader_raises_error_when_a_field_is_not_in_a_dataset() -> None:
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_dict({"sentence": ["a", "b"]})
    with pytest.raises(
        DataError,
        match=r"^tokenize: text field 'text' is not in the data; expected one of the columns \['sentence'\]\.$",
    ):
        pp.from_hf(ds).tokenize(TOK).batch(2).pad().loader()


@pytest.mark.parametrize("name", ["a.jsonl", "a.jsonl.gz"])
def test_loader_raises_error_when_a_field_is_not_in_the_first_row_of_a_local_jsonl_file(
    tmp_path: Path, name: str
) -> None:
    """Issue 30 item 7: the pretrain CLI's wrong --text-field on JSONL said "is None ... pass on_error='skip'"."""
    lines = b'\n{"text": "a", "path": "p"}\n{"body": "b"}\n'  # a blank line first; "body" only later
    (tmp_path / name).write_bytes(gzip.compress(lines) if name.endswith(".gz") else lines)
    path = str(tmp_path / name)
    message = (
        rf"^tokenize: text field 'body' is not in the first row of {re.escape(path)}; expected one of its keys "
        r"\['text', 'path'\]\.$"
    )
    for pipe in (pp.read_jsonl(path), pp.read_jsonl(path, columns=["body"]).shuffle(4)):
        with pytest.raises(DataError, match=message):
            pipe.tokenize(TOK, fields="body").batch(1).pad().loader()
    pp.read_jsonl(path).tokenize(TOK, fields="body", on_error="skip").batch(1).pad().loader()  # rows without: skipped


def test_field_check_passes_what_it_cannot_know(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text("[1, 2]\n" + '{"text": "a"}\n' * 3)  # the reader names a line that is no row
    pp.read_jsonl(str(tmp_path / "a.jsonl")).tokenize(TOK, fields="body").batch(1).pad().loader()
    (tmp_path / "long.jsonl").write_text(json.dumps({"text": "a" * (2 << 20)}) + "\n")  # a first row past 1 MiB
    pp.read_jsonl(str(tmp_path / "long.jsonl")).tokenize(TOK, fields="body").batch(1).pad().loader()
    renamed = pp.from_iterable([{"body": "a"}]).add_stage("rename", lambda up, ctx: up, output="records")
    renamed.tokenize(TOK).batch(1).pad().loader()
    (tmp_path / "broken.parquet").write_bytes(b"not parquet")  # the reader names the broken file when it reads
    pp.read_parquet(str(tmp_path / "broken.parquet")).tokenize(TOK).batch(1).pad().loader()


@pytest.mark.parametrize(
    "end, message",
    [
        (
            lambda p: p,
            r"^This pipeline ends in tokens \(padpipe's internal TokenChunk objects\): add \.batch\(n\)\.pad\(\), "
            r"\.bucket\(\.\.\.\)\.pad\(\) or \.pack\(seq_len\) to get batches of tensors\.$",
        ),
        (
            lambda p: p.bucket(4),
            r"^This pipeline ends in token batches \(padpipe's internal TokenChunk objects\): "
            r"add \.pad\(\) to get batches of tensors\.$",
        ),
        (lambda p: p.batch(4), r"^This pipeline ends in token batches .*: add \.pad\(\) to get batches of tensors\.$"),
    ],
)
def test_loader_raises_error_when_the_pipeline_ends_in_token_chunks(end, message: str) -> None:
    pipe = end(pp.from_iterable([{"text": "a b"}]).tokenize(TOK))
    with pytest.raises(ValueError, match=message):
        pipe.loader()
    with pytest.raises(ValueError, match=message):
        iter(pipe)  # what DataLoader(pipe) calls


def test_loader_still_yields_record_batches_and_tensors() -> None:
    records = pp.from_iterable([{"text": "a b"}])
    assert isinstance(next(iter(records.loader())), pa.RecordBatch)
    assert next(iter(records.tokenize(TOK).pack(8).loader()))["input_ids"].shape == (1, 8)


# -- stages in the wrong order or that cannot fit, at the call ---------------------------------------
@pytest.mark.parametrize(
    "make, method, add",
    [
        (lambda p: p.pad(), "pad", r"\.tokenize\(tokenizer, \.\.\.\) and then \.batch\(n\) or \.bucket\(\.\.\.\)"),
        (lambda p: p.batch(8), "batch", r"\.tokenize\(tokenizer, \.\.\.\)"),
        (lambda p: p.tokenize(TOK).pad(), "pad", r"\.batch\(n\) or \.bucket\(\.\.\.\)"),
    ],
)
def test_a_stage_before_its_input_names_the_stages_to_add(make, method, add) -> None:
    pipe = pp.from_iterable([{"text": "a b"}])
    with pytest.raises(
        ValueError,
        match=rf"^\.{method}\(\) needs token(?:s| batches) as input, but this pipeline "
        rf"yields (?:records|tokens) here: add {add} before it\.$",
    ):
        make(pipe)


def test_a_shuffle_after_the_rows_became_tokens_says_where_to_shuffle() -> None:
    """Issue 30 item 7: pp.from_hf(ds, tokens="input_ids").shuffle(...) did not say how to shuffle such rows."""
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_dict({"input_ids": [[2, 7, 3], [2, 3]]})
    head = r"^\.shuffle\(\) needs records as input, but this pipeline yields (tokens|tensors) here: shuffle the rows "
    for pipe, fix in (
        (
            pp.from_hf(ds, tokens="input_ids"),
            r"before they become tokens, pp\.from_hf\(ds\)\.shuffle\(buffer_size, seed=0\)\.tokens\('input_ids'\) "
            r"\(pp\.from_hf\(ds, tokens='input_ids'\) is pp\.from_hf\(ds\)\.tokens\('input_ids'\)\)\.$",
        ),
        (
            pp.from_hf(ds).shuffle(4).tokens("input_ids", pad_id=0).batch(2).pad(),
            r"before \.tokens\(\), e\.g\. pipe\.shuffle\(buffer_size, seed=0\)\.tokens\('input_ids'\)\.$",
        ),
        (
            pp.from_iterable([{"text": "a"}]).tokenize(TOK),
            r"before \.tokenize\(\), e\.g\. pipe\.shuffle\(buffer_size, seed=0\)\.tokenize\(\.\.\.\)\.$",
        ),
    ):
        with pytest.raises(ValueError, match=head + fix):
            pipe.shuffle(8)
    fixed = pp.from_hf(ds).shuffle(8).tokens("input_ids").batch(1).pad(pad_id=0)
    assert sorted(b["input_ids"].tolist() for b in fixed.loader()) == [[[2, 3]], [[2, 7, 3]]]  # the fix given works


def test_a_token_budget_that_cannot_hold_a_full_length_row_fails_when_the_pipeline_is_built() -> None:
    tokenized = pp.from_iterable([{"text": "a b"}]).tokenize(TOK, max_length=512)
    with pytest.raises(
        ValueError,
        match=r"^`max_tokens` must hold one row of max_length=512 tokens \(the tokenize "
        r"stage's truncation\), but is 10 instead; raise it, lower max_length, or pass "
        r"on_oversize='truncate' or 'drop'\.$",
    ):
        tokenized.bucket(max_tokens=10)
    for fine in (
        tokenized.bucket(max_tokens=512),
        tokenized.bucket(max_tokens=10, on_oversize="truncate"),
        pp.from_iterable([{"text": "a b"}]).tokenize(TOK).bucket(max_tokens=10),
    ):  # no max_length: data decides
        assert fine.output == "token batches"
