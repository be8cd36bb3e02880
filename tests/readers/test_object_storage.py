"""The file readers on object storage: a real S3-compatible server (moto) on 127.0.0.1, no network.

Covers reading every row once through ``s3://`` globs (and ``http://``, ``file://`` URLs), a
connection fault in the middle of a stream (retried, output unchanged), persistent faults (a
``DataError`` naming the file, no hang), files that vanish or change after listing, streaming
(only the bytes needed are fetched) and one listing shared by DataLoader workers.
"""

from __future__ import annotations

import gzip
import io
import json
import logging
import os
import re

import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest
import torch.utils.data

import padpipe as pp
from padpipe import Consumer, DataError
from padpipe.readers import files, jsonl_blocks
from padpipe.readers.arrow import ArrowReader
from padpipe.readers.jsonl import JsonlReader
from padpipe.readers.listing import SharedListing
from padpipe.readers.parquet import ParquetReader
from padpipe.readers.retry import Retry
from tests.contract import check_loader_resume, check_node_resume
from tests.s3_server import reset_moto

pytestmark = pytest.mark.timeout(60)

s3fs = pytest.importorskip("s3fs")
moto_server = pytest.importorskip("moto.server")

FAST = Retry(retries=2, backoff=0.01, max_backoff=0.02)
ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
    "NO_PROXY": "127.0.0.1",
}


def records(start, n):
    return [{"id": i, "text": f"doc {i} " + "word " * (i % 11)} for i in range(start, start + n)]


def parquet_bytes(recs, row_group_size=40):
    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(recs), buf, row_group_size=row_group_size)
    return buf.getvalue()


def jsonl_bytes(recs):
    return b"".join(json.dumps(r).encode() + b"\n" for r in recs)


def arrow_bytes(recs, *, stream=False):
    table = pa.Table.from_pylist(recs)
    sink = io.BytesIO()
    with (ipc.new_stream if stream else ipc.new_file)(sink, table.schema) as writer:
        for batch in table.to_batches(max_chunksize=30):
            writer.write_batch(batch)
    return sink.getvalue()


@pytest.fixture(scope="module")
def s3():
    """A moto S3 server on 127.0.0.1 (free port) with a bucket of Parquet, JSONL(.gz) and Arrow files."""
    with pytest.MonkeyPatch.context() as env:
        for name, value in ENV.items():
            env.setenv(name, value)
        env.delenv("AWS_PROFILE", raising=False)
        logging.getLogger("werkzeug").setLevel(logging.ERROR)
        server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        options = {"key": "testing", "secret": "testing", "client_kwargs": {"endpoint_url": endpoint}}
        reset_moto(endpoint)  # a bucket another module left in moto's per-process backend
        fs = s3fs.S3FileSystem(**options)
        fs.mkdir("bucket")
        fs.pipe("bucket/pq/a.parquet", parquet_bytes(records(0, 130)))
        fs.pipe("bucket/pq/b.parquet", parquet_bytes(records(130, 70)))
        fs.pipe("bucket/pq/notes.txt", b"not data")
        fs.pipe("bucket/jsonl/a.jsonl.gz", gzip.compress(jsonl_bytes(records(0, 120))))
        fs.pipe("bucket/jsonl/b.jsonl", jsonl_bytes(records(120, 80)))
        fs.pipe("bucket/arrow/a.arrow", arrow_bytes(records(0, 100)))
        fs.pipe("bucket/arrow/b.arrows", arrow_bytes(records(100, 100), stream=True))
        for path in ["bucket/pq/a.parquet", "bucket/jsonl/a.jsonl.gz"]:
            fs.chmod(path, acl="public-read")  # for the plain-HTTP test
        yield {"fs": fs, "options": options, "endpoint": endpoint}
        reset_moto(endpoint)
        server.stop()


def everything():
    return records(0, 200)


FORMATS = {
    "parquet": (pp.read_parquet, "s3://bucket/pq/*.parquet"),
    "jsonl": (pp.read_jsonl, "s3://bucket/jsonl/"),
    "arrow": (pp.read_arrow, "s3://bucket/arrow/*"),
}


def read_all(pipe):
    return [row for batch in pipe.loader() for row in batch.to_pylist()]


def pipeline(s3, fmt, **options):
    read, url = FORMATS[fmt]
    return read(url, storage_options=s3["options"], chunk_rows=16, **options)


@pytest.fixture
def faults(monkeypatch):
    """Make the ``fail``-th and later range requests of s3fs files raise ``ConnectionResetError``, ``times`` times."""
    plan = {"calls": 0, "fail": None, "times": 0, "failed": 0}
    original = s3fs.core.S3File._fetch_range

    def fetch_range(self, start, end):
        plan["calls"] += 1
        if plan["fail"] is not None and plan["calls"] >= plan["fail"] and plan["failed"] < plan["times"]:
            plan["failed"] += 1
            raise ConnectionResetError("injected: connection reset by peer")
        return original(self, start, end)

    monkeypatch.setattr(s3fs.core.S3File, "_fetch_range", fetch_range)
    return plan


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_object_storage_works(s3, fmt):
    assert read_all(pipeline(s3, fmt)) == everything()


def test_object_storage_works_with_http_and_file_urls(s3, tmp_path):
    url = s3["endpoint"] + "/bucket"
    assert read_all(pp.read_parquet(f"{url}/pq/a.parquet", chunk_rows=50)) == records(0, 130)
    assert read_all(pp.read_jsonl(f"{url}/jsonl/a.jsonl.gz")) == records(0, 120)
    (tmp_path / "b.parquet").write_bytes(parquet_bytes(records(130, 70)))
    assert read_all(pp.read_parquet(f"file://{tmp_path}/*.parquet")) == records(130, 70)


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_object_storage_retries_a_fault_in_the_middle_of_a_stream(s3, fmt, faults):
    read_all(pipeline(s3, fmt))  # count the range requests of a clean run
    faults.update(fail=faults["calls"] // 2 + 1, times=1, calls=0)
    loader = pipeline(s3, fmt, retries=FAST).loader()
    got = [row for batch in loader for row in batch.to_pylist()]
    assert faults["failed"] == 1
    assert got == everything()  # every row exactly once, in order
    assert loader.stats().counters["read.retries"] == 1


def test_object_storage_retries_from_the_current_row_inside_a_unit(s3, faults, monkeypatch):
    monkeypatch.setattr(jsonl_blocks, "READ_AHEAD_BYTES", 256)  # many small range requests per unit
    reader = JsonlReader(
        paths="s3://bucket/jsonl/b.jsonl",
        storage_options=s3["options"],
        chunk_rows=7,
        block_bytes=200,
        consumer=Consumer(),
        retries=FAST,
    )
    reader.reset()
    first = [next(reader) for _ in range(3)]  # 21 rows of the file's one unit
    faults.update(fail=1, times=1, calls=0)  # the next range request fails
    rest = list(reader)
    assert faults["failed"] == 1 and reader.stats.snapshot().counters["read.retries"] == 1
    assert [r["id"] for b in first + rest for r in b.to_pylist()] == list(range(120, 200))


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_object_storage_raises_error_when_faults_persist(s3, fmt, faults):
    pipe = pipeline(s3, fmt, retries=FAST)
    assert read_all(pipe) == everything()  # listed; the pipeline keeps the listing
    faults.update(fail=1, times=10**9, calls=0)  # from now on every range request fails
    first = {
        "parquet": "s3://bucket/pq/a.parquet",
        "jsonl": "s3://bucket/jsonl/a.jsonl.gz",
        "arrow": "s3://bucket/arrow/a.arrow",
    }[fmt]
    pattern = (
        rf"^{re.escape(first)}: cannot read unit 0 from row 0: gave up after 3 attempts in \d+\.\d s "
        r"\(retries=2\); last error: ConnectionResetError: injected: connection reset by peer; if the store is only "
        r"busy, allow more with retries=pp\.Retry\(retries=\.\.\., max_seconds=\.\.\.\)\.$"
    )
    with pytest.raises(DataError, match=pattern):
        read_all(pipe)


def test_object_storage_raises_error_when_a_file_vanished_or_changed(s3):
    fs = s3["fs"]
    fs.pipe("bucket/gone/a.parquet", parquet_bytes(records(0, 50)))
    fs.pipe("bucket/gone/b.parquet", parquet_bytes(records(50, 50)))
    pipe = pp.read_parquet("s3://bucket/gone/", storage_options=s3["options"])
    assert len(read_all(pipe)) == 100  # listed now; the listing is kept by the pipeline
    fs.rm("bucket/gone/b.parquet")
    with pytest.raises(
        DataError,
        match=r"^s3://bucket/gone/b\.parquet: vanished since it was listed \(.*\); pass on_missing='skip' to skip such files\.$",
    ):
        read_all(pipe)
    fs.pipe("bucket/gone/b.parquet", parquet_bytes(records(50, 60)))
    with pytest.raises(
        DataError,
        match=r"^s3://bucket/gone/b\.parquet: is \d+ bytes, but was \d+ bytes when it was listed; it changed since; pass on_missing='skip'",
    ):
        read_all(pipe)


def test_object_storage_skips_a_vanished_file_when_asked(s3):
    fs = s3["fs"]
    fs.pipe("bucket/skip/a.jsonl", jsonl_bytes(records(0, 30)))
    fs.pipe("bucket/skip/b.jsonl", jsonl_bytes(records(30, 30)))
    fs.pipe("bucket/skip/c.jsonl", jsonl_bytes(records(60, 30)))
    pipe = pp.read_jsonl("s3://bucket/skip/", storage_options=s3["options"], chunk_rows=8, on_missing="skip")
    assert len(read_all(pipe)) == 90
    fs.rm("bucket/skip/b.jsonl")
    loader = pipe.loader()
    assert [r["id"] for b in loader for r in b.to_pylist()] == list(range(30)) + list(range(60, 90))
    assert loader.stats().skipped == {"read.missing_file": 1}
    check_loader_resume(pipe.loader, epochs=1, steps=[0, 3, 4, 5, 7])


def test_object_storage_streams_only_the_bytes_it_needs(s3, monkeypatch):
    fs = s3["fs"]
    wide = [{"id": i, "blob": os.urandom(2000).hex()} for i in range(400)]
    fs.pipe("bucket/wide/w.parquet", parquet_bytes(wide, row_group_size=100))
    size = fs.size("bucket/wide/w.parquet")
    fetched = []
    original = s3fs.core.S3File._fetch_range

    def counting(self, start, end):
        fetched.append(end - start)
        return original(self, start, end)

    monkeypatch.setattr(s3fs.core.S3File, "_fetch_range", counting)
    pipe = pp.read_parquet("s3://bucket/wide/", columns=["id"], storage_options=s3["options"])
    assert [r["id"] for r in read_all(pipe)] == list(range(400))
    assert 0 < sum(fetched) < size / 10  # footers and the id column chunks, not the blobs


@pytest.mark.slow  # seconds alone: make test runs it, test-fast leaves it out
def test_object_storage_saves_and_restores_its_state(s3):
    options = s3["options"]
    check_node_resume(
        lambda: ParquetReader(
            paths="s3://bucket/pq/*.parquet", storage_options=options, chunk_rows=25, seed=3, consumer=Consumer()
        ),
        steps=[0, 1, 4, 7, 9],
    )
    check_loader_resume(pipeline(s3, "jsonl").loader, epochs=2, steps=[0, 5, 12, 17])


def test_object_storage_lists_once_for_all_loaders_and_dataloader_workers(s3, tmp_path, monkeypatch):
    calls = tmp_path / "listings"
    original = files.expand_paths

    def counted(*args, **kwargs):
        with open(calls, "a") as f:  # a file: forked DataLoader workers count too
            f.write(f"{os.getpid()}\n")
        return original(*args, **kwargs)

    monkeypatch.setattr(files, "expand_paths", counted)

    def listings():
        return len(calls.read_text().split()) if calls.exists() else 0

    pipe = pipeline(s3, "parquet")
    loader = torch.utils.data.DataLoader(pipe, batch_size=None, num_workers=2, multiprocessing_context="fork")
    ids = sorted(r["id"] for batch in loader for r in batch.to_pylist())
    assert ids == list(range(200))  # the two workers split the row groups
    assert listings() == 1  # one worker listed, the other read its listing
    assert read_all(pipe) == everything() and read_all(pipe) == everything()
    assert listings() == 1  # the main process read it too, for both loaders
    assert sorted(r["id"] for batch in loader for r in batch.to_pylist()) == list(range(200))
    assert listings() == 1  # new workers got the listing with the pipeline
    read_all(pipeline(s3, "parquet"))
    assert listings() == 2  # a new pipeline lists afresh


# -- local files: vanished or changed since listing ---------------------------------------------------
LOCAL = {
    "parquet": (ParquetReader, ".parquet", lambda recs: parquet_bytes(recs, row_group_size=6)),
    "jsonl": (JsonlReader, ".jsonl", jsonl_bytes),
    "arrow": (ArrowReader, ".arrow", arrow_bytes),
}


def local_files(tmp_path, fmt):
    """Files a, b, c of 20 rows each and a reader factory sharing one listing, made now."""
    reader, suffix, encode = LOCAL[fmt]
    for i, name in enumerate("abc"):
        (tmp_path / f"{name}{suffix}").write_bytes(encode(records(20 * i, 20)))
    listing = SharedListing()

    def make(**options):
        return reader(paths=str(tmp_path), chunk_rows=6, consumer=Consumer(), listing=listing, **options)

    make().reset()  # list while all three files are there
    return tmp_path / f"b{suffix}", make


@pytest.mark.parametrize("fmt", sorted(LOCAL))
def test_local_files_raise_error_when_a_file_vanished_or_changed(tmp_path, fmt):
    path, make = local_files(tmp_path, fmt)
    data = path.read_bytes()
    path.unlink()
    reader = make()
    reader.reset()
    pattern = (
        rf"^{re.escape(str(path))}: vanished since it was listed \(.*\); pass on_missing='skip' to skip such files\.$"
    )
    with pytest.raises(DataError, match=pattern):
        list(reader)
    path.write_bytes(data + b"\n")
    reader = make()
    reader.reset()
    pattern = rf"^{re.escape(str(path))}: is {len(data) + 1} bytes, but was {len(data)} bytes when it was listed; it changed since"
    with pytest.raises(DataError, match=pattern):
        list(reader)


@pytest.mark.parametrize("fmt", sorted(LOCAL))
def test_local_files_skip_a_vanished_file_and_resume_exactly(tmp_path, fmt):
    path, make = local_files(tmp_path, fmt)
    path.unlink()
    reader = make(on_missing="skip")
    reader.reset()
    assert [r["id"] for b in reader for r in b.to_pylist()] == list(range(20)) + list(range(40, 60))
    assert reader.stats.snapshot().skipped == {"read.missing_file": 1}
    check_node_resume(lambda: make(on_missing="skip", seed=5))
