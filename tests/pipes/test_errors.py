"""Errors reach the consumer unchanged (13.7), and a pipeline that raised stays failed (13.8).

An error raised in one of padpipe's threads (tokenize's reader thread and pool, the prefetch
thread) arrives as the original exception object with padpipe's one-line message, its traceback
chained through the thread; never torchdata's "Caught DataError in _populate_queue. Original
Traceback ..." text. After an error every later ``next()`` raises the same exception again, and
nothing is skipped unless a stage's own policy says so.
"""

from __future__ import annotations

import copy
import traceback

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from torch.utils.data import DataLoader

import padpipe as pp
from padpipe import DataError
from tests.contract import normalize
from tests.worker_errors import raises_in_workers

TOK = pp.examples.TOKENIZER_JSON


@pytest.fixture
def files(tmp_path):
    """``good.parquet`` (400 rows, row groups of 50), ``none.parquet`` (a None text at row 130)."""
    texts = [f"row {i} " + "word " * (i % 9) for i in range(400)]
    pq.write_table(pa.table({"text": texts, "idx": np.arange(400)}), tmp_path / "good.parquet", row_group_size=50)
    bad = [None if i == 130 else t for i, t in enumerate(texts)]
    pq.write_table(pa.table({"text": bad, "idx": np.arange(400)}), tmp_path / "none.parquet", row_group_size=50)
    return tmp_path


def corrupt_row_group(path, group: int) -> None:
    """Zero the middle of row group ``group``'s data pages (its footer stays readable)."""
    meta = pq.ParquetFile(path).metadata.row_group(group).column(0)
    start = meta.data_page_offset
    data = bytearray(path.read_bytes())
    data[start + 8 : start + meta.total_compressed_size - 8] = bytes(meta.total_compressed_size - 16)
    path.write_bytes(bytes(data))


def first_error(loader) -> BaseException:
    with pytest.raises(Exception) as info:
        for _ in loader:
            pass
    return info.value


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("prefetch", [False, True])
def test_a_read_error_reaches_the_consumer_as_the_original_one_line_error(files, threads, prefetch) -> None:
    path = files / "good.parquet"
    corrupt_row_group(path, 3)
    pipe = pp.read_parquet(str(path), chunk_rows=20).tokenize(TOK, num_threads=threads).batch(8).pad()
    error = first_error((pipe.prefetch(2) if prefetch else pipe).loader())
    assert type(error) is DataError
    assert str(error).startswith(f"{path}: cannot read unit 3 from row 0: ")
    assert "Caught" not in str(error) and "Traceback" not in str(error)  # Arrow's own text may span lines
    frames = [frame.name for frame in traceback.extract_tb(error.__traceback__)]
    assert "_read" in frames  # the reader's own frame, chained through the threads


def test_an_error_in_a_tokenize_thread_names_the_file(files) -> None:
    pipe = pp.read_parquet(str(files / "none.parquet"), chunk_rows=20).tokenize(TOK, num_threads=2).batch(8).pad()
    error = first_error(pipe.loader())
    assert type(error) is DataError
    assert str(error) == (
        f"tokenize: field 'text' at row 130 of {files / 'none.parquet'} (idx=130; row 10 of the chunk) is None; "
        "expected a string. 1 row(s) of this chunk have bad text; pass on_error='skip' to drop them."
    )


def test_a_dataloader_worker_error_names_the_file(files) -> None:
    pipe = pp.read_parquet(str(files / "none.parquet"), chunk_rows=20).tokenize(TOK).batch(8).pad()
    with raises_in_workers(
        DataError,
        match=r"at row 130 of \S+/none\.parquet \(idx=130; row 10 of the chunk\) is None; "
        r"expected a string\.",
    ):
        for _ in DataLoader(pipe, batch_size=None, num_workers=2):
            pass


def test_a_shuffle_schema_error_reaches_the_consumer_unchanged(files) -> None:
    pq.write_table(pa.table({"text": pa.array(np.arange(50)), "idx": np.arange(50)}), files / "ints.parquet")
    pipe = pp.read_parquet(str(files), chunk_rows=25).shuffle(buffer_size=40, seed=0).tokenize(TOK).batch(8).pad()
    error = first_error(pipe.loader())
    assert type(error) is DataError and str(error).startswith("shuffle: column 'text' is ")


def none_pipe(files, threads: int, prefetch: bool) -> pp.Pipeline:
    pipe = pp.read_parquet(str(files / "none.parquet"), chunk_rows=20).tokenize(TOK, num_threads=threads).batch(8).pad()
    return pipe.prefetch(2) if prefetch else pipe


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("prefetch", [False, True])
def test_a_pipeline_that_raised_raises_the_same_error_until_it_is_reset(files, threads, prefetch) -> None:
    node = none_pipe(files, threads, prefetch).build()
    node.reset(None)
    with pytest.raises(DataError) as first:
        for _ in node:
            pass
    for _ in range(3):  # never a silent skip of the failed chunk
        with pytest.raises(DataError) as again:
            next(node)
        assert again.value is first.value
    with pytest.raises(
        RuntimeError,
        match=r"^the pipeline failed with DataError: tokenize: field 'text' .*; a state saved after that would not resume exactly\. Load a state saved before the error, or start a new epoch\.$",
    ):
        node.state_dict()
    node.reset(None)  # a new epoch clears it
    assert normalize(next(node))["idx"][2] == list(range(8))


def test_a_loader_that_raised_raises_the_same_error_on_every_later_next(files) -> None:
    it = iter(none_pipe(files, 2, False).loader())
    with pytest.raises(DataError) as first:
        for _ in it:
            pass
    with pytest.raises(DataError) as again:
        next(it)
    assert again.value is first.value


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("prefetch", [False, True])
def test_a_state_saved_before_an_error_resumes_exactly_up_to_it(files, threads, prefetch) -> None:
    pipe = none_pipe(files, threads, prefetch)
    loader = pipe.loader()
    it = iter(loader)
    before = [normalize(next(it)) for _ in range(3)]
    state = loader.state_dict()
    with pytest.raises(DataError):
        for _ in it:
            pass
    with pytest.raises(RuntimeError, match=r"^the pipeline failed with DataError: "):
        loader.state_dict()
    assert loader.stats().skipped == {}
    fresh = pipe.loader()
    fresh.load_state_dict(state)
    rest = []
    with pytest.raises(DataError, match=r"^tokenize: field 'text' at row 130 of \S+ \(idx=130; row 10 of the chunk\)"):
        for batch in fresh:
            rest.append(normalize(batch))
    reference = pp.read_parquet(str(files / "good.parquet"), chunk_rows=20).tokenize(TOK).batch(8).pad().loader()
    rows = [r for b in before for r in b["idx"][2]] + [r for b in rest for r in b["idx"][2]]
    good = [r for b in reference for r in b["idx"].tolist()]
    assert rows == good[: len(rows)] and len(rows) == 120  # everything before the bad chunk, once


def test_on_error_skip_counts_what_it_drops(files) -> None:
    loader = (
        pp.read_parquet(str(files / "none.parquet"), chunk_rows=20)
        .tokenize(TOK, on_error="skip")
        .batch(8)
        .pad()
        .loader()
    )
    rows = [r for b in loader for r in b["idx"].tolist()]
    assert rows == [r for r in range(400) if r != 130]
    assert loader.stats().skipped == {"tokenize.bad_text": 1}


def test_a_loader_whose_state_was_rejected_stays_failed_until_a_good_state_or_a_new_epoch(files) -> None:
    pipe = pp.read_parquet(str(files / "good.parquet"), chunk_rows=20).tokenize(TOK).batch(8).pad()
    loader = pipe.loader()
    it = iter(loader)
    next(it)
    good = loader.state_dict()
    bad = copy.deepcopy(good)
    reader = bad["root"]
    while "unit" not in reader:
        reader = reader["source"]
    reader["unit"] = 99
    fresh = pipe.loader()
    fresh.load_state_dict(bad)
    with pytest.raises(
        pp.StateMismatchError,
        match=r"^ParquetReader state is invalid: 'unit' must be an int from 0 to 8, but is 99 instead\.$",
    ):
        iter(fresh)
    fresh.load_state_dict(good)
    assert [normalize(b) for b in fresh] == [normalize(b) for b in it]
