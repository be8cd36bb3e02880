"""Retries under real faults: a local S3 server (moto) behind a proxy that answers 503 SlowDown or drops
connections mid-object (tests/readers/s3_faults.py), all on 127.0.0.1, read through s3fs.

With the client's own retries off (botocore ``total_max_attempts=1``, s3fs ``retries=1``) every
fault reaches padpipe's retry policy: each is retried once from where the read stood (no row lost
or repeated, checked row by row, in this process and in DataLoader workers), counted in
``stats()``, and a file that keeps failing, or that the store refuses, ends the read with one line
naming the file, what failed and the fix. With the client's retries on (its defaults) the client
absorbs the same faults first: the rows are the same and padpipe counts no retry.
"""

from __future__ import annotations

import logging
import random
import re
from collections.abc import Callable
from typing import NamedTuple

import pytest
import zstandard

import padpipe as pp
from padpipe import DataError
from padpipe.readers import jsonl_blocks
from padpipe.readers.retry import Attempts, Retry
from tests.readers.s3_faults import FaultProxy, Plan
from tests.readers.test_object_storage import ENV, jsonl_bytes, parquet_bytes, records
from tests.s3_server import reset_moto

pytestmark = pytest.mark.timeout(120)

s3fs = pytest.importorskip("s3fs")
moto_server = pytest.importorskip("moto.server")

RESUMED = re.compile(r"^s3://\S+: cannot read unit (\d+) from row (\d+)$")
FAST = Retry(retries=2, backoff=0.01, max_backoff=0.02)
PATIENT = Retry(retries=4, backoff=0.01, max_backoff=0.02)  # more than the faults injected in a row


def noisy(first: int, count: int) -> list[dict]:
    """Rows with 40 random hex digits each, so that zstd cannot shrink a file to one read."""
    return [
        {"id": i, "text": f"doc {i}", "noise": f"{random.Random(i).getrandbits(160):040x}"}
        for i in range(first, first + count)
    ]


class Corpus(NamedTuple):
    """One format's files on the server: ``(name, first id, rows)`` each, made by ``make`` and ``encode``."""

    read: Callable[..., pp.Pipeline]
    folder: str
    files: list[tuple[str, int, int]]
    make: Callable[[int, int], list[dict]]
    encode: Callable[[list[dict]], bytes]
    chunk_rows: int

    def rows(self) -> list[dict]:
        """Every row, in file order."""
        return [r for _, first, count in self.files for r in self.make(first, count)]


FILES = {
    "parquet": Corpus(
        pp.read_parquet,
        "pq",
        [("a.parquet", 0, 130), ("b.parquet", 130, 70), ("c.parquet", 200, 100)],
        records,
        parquet_bytes,  # row groups of 40
        16,
    ),
    "jsonl": Corpus(  # a holds 2 parse blocks of 2 MiB: a fault can hit it after some of its rows came out
        pp.read_jsonl,
        "zst",
        [("a.jsonl.zst", 0, 30_000), ("b.jsonl.zst", 30_000, 80), ("c.jsonl.zst", 30_080, 8_000)],
        noisy,
        lambda rows: zstandard.compress(jsonl_bytes(rows)),
        4096,
    ),
}


@pytest.fixture(scope="module")
def server():
    """A moto S3 server on 127.0.0.1 with three Parquet files (row groups of 40) and three JSONL.zst files."""
    with pytest.MonkeyPatch.context() as env:
        for name, value in ENV.items():
            env.setenv(name, value)
        env.delenv("AWS_PROFILE", raising=False)
        env.setattr(s3fs.S3FileSystem, "retries", 1)  # s3fs's own retry loop: one attempt
        logging.getLogger("werkzeug").setLevel(logging.ERROR)
        moto = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        moto.start()
        host, port = moto.get_host_and_port()
        upstream = f"http://{host}:{port}"
        fs = s3fs.S3FileSystem(key="testing", secret="testing", client_kwargs={"endpoint_url": upstream})
        fs.mkdir("faults")
        for corpus in FILES.values():
            for name, first, count in corpus.files:
                fs.pipe(f"faults/{corpus.folder}/{name}", corpus.encode(corpus.make(first, count)))
        yield upstream
        reset_moto(upstream)
        moto.stop()


def read(
    upstream: str, fmt: str, plan: Plan, *, num_workers: int = 0, client_retries: bool = False, **options
) -> tuple[list[dict], pp.PipelineLoader]:
    """Every row of ``fmt``'s files read through a :class:`FaultProxy` with ``plan``, and the loader."""
    corpus = FILES[fmt]
    with FaultProxy(upstream, plan) as proxy:
        storage: dict = {"key": "testing", "secret": "testing", "client_kwargs": {"endpoint_url": proxy.endpoint}}
        if not client_retries:
            storage["config_kwargs"] = {"retries": {"total_max_attempts": 1}}  # botocore's own retries: off
        pipe = corpus.read(
            f"s3://faults/{corpus.folder}/", storage_options=storage, chunk_rows=corpus.chunk_rows, **options
        )
        loader = pipe.loader(num_workers=num_workers)
        rows = [row for batch in loader for row in batch.to_pylist()]
    return rows, loader


@pytest.fixture(autouse=True)
def small_reads(monkeypatch):
    """JSONL files fetched 4 kB a request (not 8 MiB), so that faults hit them mid-file."""
    monkeypatch.setattr(jsonl_blocks, "READ_AHEAD_BYTES", 4096)


def spread(clean: Plan) -> dict[tuple[str, int], str]:
    """Four faults over a clean pass's reads: the first read of b, the middle of c, the last reads of a and c."""
    (a, a_reads), (b, _), (c, c_reads) = sorted(clean.reads.items())
    assert a_reads >= 4 and c_reads >= 4
    return {(b, 0): "slowdown", (a, a_reads - 1): "drop", (c, c_reads // 2): "slowdown", (c, c_reads - 1): "drop"}


@pytest.fixture
def retried(monkeypatch) -> list[str]:
    """What each failed attempt was (``"<file>: cannot read unit U from row R"``, ...), as padpipe names it."""
    seen: list[str] = []
    failed = Attempts.failed

    def spy(self, exc, what):
        seen.append(what)
        return failed(self, exc, what)

    monkeypatch.setattr(Attempts, "failed", spy)
    return seen


@pytest.mark.parametrize("fmt", sorted(FILES))
def test_s3_faults_are_retried_with_every_row_once_and_counted(server, fmt, retried):
    clean = Plan()
    assert read(server, fmt, clean)[0] == FILES[fmt].rows()
    faults = spread(clean)
    plan = Plan(faults)
    rows, loader = read(server, fmt, plan, retries=PATIENT)
    assert sorted((name, action) for action, name, _ in plan.injected) == sorted((k[0], v) for k, v in faults.items())
    assert rows == FILES[fmt].rows(), "every row exactly once, in order"
    assert loader.stats().counters["read.retries"] == 4
    resumed = [tuple(map(int, m.groups())) for m in map(RESUMED.match, retried) if m]
    assert any(at != (0, 0) for at in resumed), f"a read retried after rows of its file came out: {retried}"


@pytest.mark.parametrize("fmt", sorted(FILES))
def test_s3_faults_in_dataloader_workers_are_retried_and_counted_in_the_loaders_stats(server, fmt):
    clean = Plan()
    expected, _ = read(server, fmt, clean, num_workers=2)
    assert sorted(expected, key=lambda r: r["id"]) == FILES[fmt].rows()
    plan = Plan(spread(clean))
    rows, loader = read(server, fmt, plan, num_workers=2, retries=PATIENT)
    assert len(plan.injected) == 4
    assert rows == expected, "the same rows in the same order as without faults"
    assert loader.stats().counters["read.retries"] == 4  # counted in the workers, summed in the loader


@pytest.mark.parametrize("fmt", sorted(FILES))
def test_s3_faults_absorbed_by_the_clients_own_retries_leave_every_row_once(server, fmt, monkeypatch):
    monkeypatch.setattr(s3fs.S3FileSystem, "retries", 5)  # s3fs's default, and botocore's own retries on
    clean = Plan()
    assert read(server, fmt, clean, client_retries=True)[0] == FILES[fmt].rows()
    plan = Plan(spread(clean))
    rows, loader = read(server, fmt, plan, client_retries=True, retries=PATIENT)
    assert len(plan.injected) == 4 and rows == FILES[fmt].rows()
    assert loader.stats().counters.get("read.retries", 0) == 0  # padpipe counts only the faults that reach it


FIRST_READ = {  # where the second file is first read: Parquet's footer at listing, a JSONL.zst file when reached
    "parquet": "s3://faults/pq/b.parquet: read the footer",
    "jsonl": "s3://faults/zst/b.jsonl.zst: cannot read unit 0 from row 0",
}


@pytest.mark.parametrize("fmt", sorted(FILES))
def test_s3_raises_error_naming_the_file_when_the_store_keeps_answering_slowdown(server, fmt):
    name = FILES[fmt].files[1][0]
    pattern = (
        rf"^{re.escape(FIRST_READ[fmt])}: gave up after 3 attempts in \d+\.\d s \(retries=2\); last error: "
        r"OSError: \[Errno 16\] Please reduce your request rate; if the store is only busy, allow more with "
        r"retries=pp\.Retry\(retries=\.\.\., max_seconds=\.\.\.\)\.$"
    )
    with pytest.raises(DataError, match=pattern):
        read(server, fmt, Plan(always={name}), retries=FAST)


@pytest.mark.parametrize("fmt", sorted(FILES))
def test_s3_raises_error_naming_the_file_at_once_when_access_is_denied(server, fmt, retried):
    name = FILES[fmt].files[1][0]
    plan = Plan(deny={name})
    pattern = (
        rf"^{re.escape(FIRST_READ[fmt])}: access denied \(PermissionError: Access Denied\); "
        r"check the credentials \(storage_options\) and the file's permissions\.$"
    )
    with pytest.raises(DataError, match=pattern):
        read(server, fmt, plan, retries=FAST)
    assert [action for action, _, _ in plan.injected] == ["deny"] and retried == [], "a refusal is not retried"
