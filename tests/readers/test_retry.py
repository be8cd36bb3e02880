"""Retries of transient storage errors: the policy, the error classes, and the readers recovering exactly."""

from __future__ import annotations

import errno
import gzip
import io
import json
import re

import fsspec
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest
from fsspec.implementations.memory import MemoryFile

import padpipe as pp
from padpipe import Consumer, DataError
from padpipe.readers import files
from padpipe.readers.arrow import ArrowReader
from padpipe.readers.jsonl import JsonlReader
from padpipe.readers.listing import SharedListing
from padpipe.readers.parquet import ParquetReader
from padpipe.readers.retry import Attempts, Retry, call, is_transient
from tests.contract import check_node_resume

pytestmark = pytest.mark.timeout(60)

NO_WAIT = Retry(retries=2, backoff=0.0)


class Status(Exception):
    """An HTTP client error carrying a status, as aiohttp's ``ClientResponseError`` does."""

    def __init__(self, status):
        super().__init__(f"HTTP {status}")
        self.status = status


class ServerDisconnectedError(Exception):
    """Named like aiohttp's: recognized by name, not type."""


def s3_style(status):
    """An ``OSError(EIO)`` caused by a botocore-style error with a response dict, as s3fs raises."""
    cause = Exception("ClientError")
    cause.response = {"ResponseMetadata": {"HTTPStatusCode": status}}
    err = OSError(errno.EIO, "We encountered an internal error")
    err.__cause__ = cause
    return err


@pytest.mark.parametrize(
    "exc, transient",
    [
        (ConnectionResetError("reset"), True),
        (TimeoutError("timed out"), True),
        (OSError(errno.EIO, "I/O error"), True),
        (OSError(errno.ECONNRESET, "reset"), True),
        (ServerDisconnectedError("closed"), True),
        (Status(503), True),
        (Status(429), True),
        (Status(404), False),
        (Status(403), False),
        (s3_style(500), True),
        (s3_style(400), False),
        (OSError("Couldn't deserialize thrift: invalid data"), False),  # pyarrow on a corrupt file
        (FileNotFoundError(errno.ENOENT, "gone"), False),
        (PermissionError(errno.EACCES, "denied"), False),
        (DataError("bad row"), False),
        (ValueError("bad value"), False),
        (pa.ArrowInvalid("Parquet magic bytes not found"), False),
    ],
)
def test_is_transient_works(exc, transient):
    assert is_transient(exc) is transient


def test_retry_works_with_exponential_backoff():
    waits = []
    attempts = Attempts(Retry(retries=4, backoff=1.0, max_backoff=3.0), sleep=waits.append)
    for _ in range(4):
        attempts.failed(ConnectionResetError("reset"), "a.parquet: read")
    assert attempts.count == 4
    for wait, base in zip(waits, [1.0, 2.0, 3.0, 3.0]):  # doubled, capped, +-25% jitter
        assert 0.75 * base <= wait <= 1.25 * base
    attempts.succeeded()
    attempts.failed(ConnectionResetError("reset"), "a.parquet: read")
    assert attempts.count == 1  # a success starts a fresh count


def test_retry_raises_error_when_retries_run_out():
    attempts = Attempts(Retry(retries=2, backoff=0.0))
    attempts.failed(ConnectionResetError("reset"), "s3://b/a.parquet: read")
    attempts.failed(ConnectionResetError("reset"), "s3://b/a.parquet: read")
    pattern = (
        r"^s3://b/a\.parquet: read: gave up after 3 attempts in \d+\.\d s \(retries=2\); "
        r"last error: ConnectionResetError: reset; if the store is only busy, allow more with "
        r"retries=pp\.Retry\(retries=\.\.\., max_seconds=\.\.\.\)\.$"
    )
    with pytest.raises(DataError, match=pattern):
        attempts.failed(ConnectionResetError("reset"), "s3://b/a.parquet: read")


def test_retry_raises_error_when_the_time_budget_is_spent():
    attempts = Attempts(Retry(retries=100, backoff=1.0, max_backoff=100.0, max_seconds=2.5), sleep=lambda s: None)
    attempts.failed(TimeoutError("slow"), "a.jsonl: read")  # waits ~1 s
    attempts.failed(TimeoutError("slow"), "a.jsonl: read")  # waits ~2 s: still within 2.5 s
    with pytest.raises(
        DataError,
        match=r"^a\.jsonl: read: gave up after 3 attempts in .*(retries=100).*TimeoutError: slow; if the store is only busy",
    ):
        attempts.failed(TimeoutError("slow"), "a.jsonl: read")  # the next wait (>= 3 s) passes the budget


def test_retry_raises_error_when_arguments_are_bad(tmp_path):
    with pytest.raises(ValueError, match=r"^`retries` must be a non-negative int, but is -1 instead\.$"):
        Retry(retries=-1)
    with pytest.raises(ValueError, match=r"^`backoff` must be a non-negative number, but is -0\.5 instead\.$"):
        Retry(backoff=-0.5)
    with pytest.raises(TypeError, match=r"^`retries` must be an int or a Retry, but is '3' instead\.$"):
        pp.read_parquet("x.parquet", retries="3")
    with pytest.raises(
        ValueError, match=r"^`on_missing` must be one of \('raise', 'skip'\), but is 'ignore' instead\.$"
    ):
        pp.read_jsonl("x.jsonl", on_missing="ignore")
    with pytest.raises(ValueError, match=r"^`on_missing` must be one of"):
        ParquetReader(paths="x.parquet", on_missing="warn")
    with pytest.raises(TypeError, match=r"^`listing` must be a SharedListing, but is \{\} instead\.$"):
        ArrowReader(paths="x.arrow", listing={})


def test_call_works():
    outcomes = [ConnectionResetError("reset"), Status(502), 7]

    def flaky():
        outcome = outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    retried = []
    assert call(NO_WAIT, "a.arrow: open", flaky, on_retry=lambda: retried.append(1)) == 7 and len(retried) == 2
    with pytest.raises(ValueError, match=r"^not transient$"):
        call(NO_WAIT, "a.arrow: open", lambda: (_ for _ in ()).throw(ValueError("not transient")))


# -- the readers: a fault at any read position is retried and the output is unchanged ----------------
RECORDS = [{"id": i, "text": f"doc {i} " + "w " * (i % 7)} for i in range(90)]


def write_inputs(root):
    """Parquet, JSONL (plain and gzip) and Arrow files of ``RECORDS`` on the memory filesystem."""
    fs = fsspec.filesystem("memory")
    table = pa.Table.from_pylist(RECORDS)
    for name, part in (("a", table.slice(0, 50)), ("b", table.slice(50))):
        buf = io.BytesIO()
        pq.write_table(part, buf, row_group_size=12)
        fs.pipe(f"/{root}/pq/{name}.parquet", buf.getvalue())
        sink = io.BytesIO()
        with ipc.new_file(sink, table.schema) as writer:
            for batch in part.to_batches(max_chunksize=16):
                writer.write_batch(batch)
        fs.pipe(f"/{root}/arrow/{name}.arrow", sink.getvalue())
    lines = [json.dumps(r).encode() + b"\n" for r in RECORDS]
    fs.pipe(f"/{root}/jsonl/a.jsonl", b"".join(lines[:50]))
    fs.pipe(f"/{root}/jsonl/b.jsonl.gz", gzip.compress(b"".join(lines[50:])))


READERS = {
    "parquet": lambda root, **kw: ParquetReader(paths=f"memory://{root}/pq", chunk_rows=5, **kw),
    "jsonl": lambda root, **kw: JsonlReader(
        paths=f"memory://{root}/jsonl", chunk_rows=5, unit_bytes=900, block_bytes=300, **kw
    ),
    "arrow": lambda root, **kw: ArrowReader(paths=f"memory://{root}/arrow", chunk_rows=5, **kw),
}


@pytest.fixture
def flaky_reads(monkeypatch):
    """Make the ``fail``-th read of a memory file (after arming) raise ``ConnectionResetError``, ``times`` times."""
    plan = {"calls": 0, "fail": None, "times": 1, "failed": 0}
    original = MemoryFile.read

    def read(self, *args):
        plan["calls"] += 1
        if plan["fail"] is not None and plan["calls"] >= plan["fail"] and plan["failed"] < plan["times"]:
            plan["failed"] += 1
            raise ConnectionResetError("injected")
        return original(self, *args)

    monkeypatch.setattr(MemoryFile, "read", read)
    return plan


def ids(reader):
    return [row["id"] for batch in reader for row in batch.to_pylist()]


@pytest.mark.parametrize("fmt", sorted(READERS))
def test_readers_retry_a_fault_at_any_read_and_lose_or_repeat_no_row(fmt, flaky_reads):
    write_inputs(f"retry_{fmt}")
    clean = READERS[fmt](f"retry_{fmt}", consumer=Consumer())
    clean.reset()
    flaky_reads["calls"] = 0
    assert ids(clean) == list(range(90))
    reads = flaky_reads["calls"]
    assert reads >= 4
    for fail in range(1, reads + 1):  # a fault at every read of the epoch, one at a time
        reader = READERS[fmt](f"retry_{fmt}", consumer=Consumer(), retries=NO_WAIT, listing=clean.listing)
        reader.reset()
        flaky_reads.update(calls=0, fail=fail, failed=0)
        assert ids(reader) == list(range(90)), f"fault at read {fail}"
        assert flaky_reads["failed"] == 1 and reader.stats.snapshot().counters["read.retries"] == 1


@pytest.mark.parametrize("fmt", sorted(READERS))
def test_readers_raise_error_when_reads_keep_failing(fmt, flaky_reads):
    write_inputs(f"fail_{fmt}")
    reader = READERS[fmt](f"fail_{fmt}", consumer=Consumer(), retries=NO_WAIT)
    reader.reset()  # lists
    flaky_reads.update(calls=0, fail=1, times=10**9)
    first = {"parquet": "pq/a.parquet", "jsonl": "jsonl/a.jsonl", "arrow": "arrow/a.arrow"}[fmt]
    pattern = (
        rf"^memory:///fail_{fmt}/{re.escape(first)}: cannot read unit 0 from row 0: gave up after 3 attempts "
        r"in \d+\.\d s \(retries=2\); last error: ConnectionResetError: injected; if the store is only busy, "
        r"allow more with retries=pp\.Retry\(retries=\.\.\., max_seconds=\.\.\.\)\.$"
    )
    with pytest.raises(DataError, match=pattern):
        next(reader)


def test_readers_retry_listing(flaky_reads, monkeypatch):
    write_inputs("listing")
    failures = [ConnectionResetError("injected"), TimeoutError("injected")]
    original = files.expand_paths

    def flaky_expand(*args, **kwargs):
        if failures:
            raise failures.pop(0)
        return original(*args, **kwargs)

    monkeypatch.setattr(files, "expand_paths", flaky_expand)
    reader = READERS["parquet"]("listing", consumer=Consumer(), retries=NO_WAIT)
    reader.reset()
    assert ids(reader) == list(range(90)) and reader.stats.snapshot().counters["read.retries"] == 2
    flaky_reads.update(calls=0, fail=1, times=1)  # the first footer read fails once
    reader = READERS["parquet"]("listing", consumer=Consumer(), retries=NO_WAIT)
    reader.reset()
    assert ids(reader) == list(range(90)) and flaky_reads["failed"] == 1


def test_readers_save_and_restore_their_state_across_retries(flaky_reads):
    write_inputs("resume")
    listing = SharedListing()
    check_node_resume(lambda: READERS["jsonl"]("resume", consumer=Consumer(), retries=NO_WAIT, listing=listing))
    reference = READERS["jsonl"]("resume", consumer=Consumer(), listing=listing)
    reference.reset()
    for _ in range(7):
        next(reference)
    state = reference.state_dict()
    expected = ids(reference)
    for fail in range(1, 6):  # resumed, then a fault at one of the first reads: still exactly the rest
        resumed = READERS["jsonl"]("resume", consumer=Consumer(), retries=NO_WAIT, listing=listing)
        resumed.reset(state)
        flaky_reads.update(calls=0, fail=fail, times=1, failed=0)
        assert ids(resumed) == expected and flaky_reads["failed"] == 1
