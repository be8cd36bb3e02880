"""More shards than a listing page on a local S3 server (moto, 127.0.0.1): every row once, one listing, small states.

1,001 Parquet and 1,001 JSONL.zst objects (one more than a 1,000-key ListObjects page holds, so a
listing takes two pages) are read through ``s3://`` by ``pipe.loader(num_workers=2)``.
The server counts the ListObjects pages it serves: the pipeline's two workers and its main process
together list as many pages as one reader listing alone (a listing per worker would be two or
three times that). Figures (time to first batch, throughput vs local disk, peak RSS) are in
``benchmarks/many_shards.py``; here only what must hold is asserted.
"""

from __future__ import annotations

import io
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import padpipe as pp
from padpipe import Consumer
from padpipe.readers.paths import expand_paths

pytest.importorskip("s3fs")
pytest.importorskip("moto.server")
zstandard = pytest.importorskip("zstandard")

from tests.s3_server import LocalS3  # noqa: E402 - after the skips: it needs moto and s3fs

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

SHARDS, ROWS = 1_001, 3  # rows per shard; one shard over a listing page


def rows(shard: int) -> list[dict]:
    return [{"id": shard * ROWS + i, "text": f"shard {shard} row {i}"} for i in range(ROWS)]


def parquet_bytes(shard: int) -> bytes:
    buffer = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows(shard)), buffer)
    return buffer.getvalue()


def jsonl_zst_bytes(shard: int) -> bytes:
    return zstandard.ZstdCompressor().compress(b"".join(json.dumps(r).encode() + b"\n" for r in rows(shard)))


@pytest.fixture(scope="module")
def s3():
    with LocalS3() as server:
        server.put_many({f"bucket/pq/part-{i:05d}.parquet": parquet_bytes(i) for i in range(SHARDS)})
        server.put_many({f"bucket/jz/part-{i:05d}.jsonl.zst": jsonl_zst_bytes(i) for i in range(SHARDS)})
        yield server


FORMATS = {"parquet": (pp.read_parquet, "s3://bucket/pq/"), "jsonl.zst": (pp.read_jsonl, "s3://bucket/jz/")}


def lists(s3, action) -> int:
    """ListObjects pages the server served while ``action()`` ran."""
    before = s3.requests().get("list", 0)
    action()
    return s3.requests().get("list", 0) - before


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_thousand_shards_on_s3_are_read_once_each_with_one_listing(s3, fmt) -> None:
    read, url = FORMATS[fmt]
    fresh = {**s3.options, "skip_instance_cache": True}  # an s3fs of its own: nothing listed from its cache
    one_listing = lists(s3, lambda: expand_paths([url], suffixes=(".parquet", ".zst"), storage_options=fresh))
    assert one_listing >= 2  # 1,001 keys: at least two pages of 1,000

    pipe = read(url, storage_options=s3.options, chunk_rows=64)
    ids: list[int] = []
    states = []

    def run() -> None:
        loader = pipe.loader(num_workers=2)
        for step, batch in enumerate(loader):
            ids.extend(batch.column("id").to_pylist())
            if step == 20:
                states.append(loader.state_dict())

    assert lists(s3, run) == one_listing  # not once per worker
    assert sorted(ids) == list(range(SHARDS * ROWS))
    assert len(json.dumps(states[0], default=str)) < 20_000  # two workers' states, whatever the file count


def test_one_reader_state_of_1001_s3_shards_names_only_the_file_being_read(s3) -> None:
    reader = pp.read_jsonl("s3://bucket/jz/", storage_options=s3.options, chunk_rows=2).build().source
    reader.consumer = Consumer()
    reader.reset()
    for _ in range(5):
        next(reader)
    state = reader.state_dict()
    assert state["files"]["count"] == SHARDS
    assert state["file"].startswith("s3://bucket/jz/part-00002.jsonl.zst\t")
    assert sum("part-" in str(v) for v in state.values()) == 1 and len(json.dumps(state)) < 1_000
