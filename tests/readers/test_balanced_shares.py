"""Every reader gives each consumer (rank x worker) the same number of rows per epoch, within one row.

The layouts are the ones that made shares uneven before: fewer units than consumers, and units of
very different sizes. JSONL cannot know rows, so it is balanced by bytes (checked as bytes).
"""

from __future__ import annotations

import json

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from padpipe import Consumer
from padpipe.readers.arrow import ArrowReader
from padpipe.readers.hf import HFDatasetReader
from padpipe.readers.jsonl import JsonlReader
from padpipe.readers.parquet import ParquetReader
from tests.readers.checks import epoch_batches, rows

GROUPS = (700, 700, 700)  # 3 units over 4 consumers
UNEVEN = (1000, 10, 10, 10, 970)


def table(sizes: tuple[int, ...], start: int = 0) -> list[pa.Table]:
    tables, rid = [], start
    for n in sizes:
        tables.append(pa.table({"rid": np.arange(rid, rid + n), "text": [f"row {i}" for i in range(rid, rid + n)]}))
        rid += n
    return tables


def write_parquet(path, sizes) -> None:
    tables = table(sizes)
    with pq.ParquetWriter(path, tables[0].schema) as writer:
        for t in tables:
            writer.write_table(t)


def write_arrow(path, sizes) -> None:
    tables = table(sizes)
    with pa.ipc.new_file(path, tables[0].schema) as writer:
        for t in tables:
            writer.write_table(t)


def write_arrow_stream(path, sizes) -> None:
    tables = table(sizes)
    with pa.ipc.new_stream(path, tables[0].schema) as writer:
        for t in tables:
            writer.write_table(t)


def shares(make, count: int, epoch: int = 0) -> list[list[int]]:
    """Row ids each of ``count`` consumers reads in ``epoch``."""
    out = []
    for index in range(count):
        node = make(
            Consumer(rank=index // 2, world_size=(count + 1) // 2, worker=index % 2, num_workers=2)
            if count % 2 == 0
            else Consumer(worker=index, num_workers=count)
        )
        out.append([r["rid"] for r in rows(epoch_batches(node, epoch + 1)[epoch])])
    return out


def check_balanced(per_consumer: list[list[int]], total: int) -> None:
    seen = [rid for share in per_consumer for rid in share]
    assert sorted(seen) == list(range(total)), "every row exactly once over the consumers"
    sizes = [len(share) for share in per_consumer]
    assert max(sizes) - min(sizes) <= 1, sizes


@pytest.mark.parametrize("sizes", [GROUPS, UNEVEN])
@pytest.mark.parametrize("count", [2, 3, 4, 7])
@pytest.mark.parametrize("seed", [None, 5])
def test_read_parquet_shares_differ_by_at_most_one_row(tmp_path, sizes, count, seed):
    write_parquet(tmp_path / "d.parquet", sizes)
    make = lambda c: ParquetReader(paths=str(tmp_path / "d.parquet"), seed=seed, consumer=c, chunk_rows=64)  # noqa: E731
    for epoch in (0, 1):
        check_balanced(shares(make, count, epoch), sum(sizes))


@pytest.mark.parametrize("writer", [write_arrow, write_arrow_stream])
@pytest.mark.parametrize("count", [2, 4])
def test_read_arrow_shares_differ_by_at_most_one_row(tmp_path, writer, count):
    writer(tmp_path / "d.arrow", UNEVEN)
    make = lambda c: ArrowReader(paths=str(tmp_path / "d.arrow"), seed=3, consumer=c, chunk_rows=64)  # noqa: E731
    check_balanced(shares(make, count), sum(UNEVEN))


@pytest.mark.parametrize("count", [2, 4, 7])
def test_from_hf_dataset_shares_differ_by_at_most_one_row(count):
    dataset = datasets.Dataset(pa.concat_tables(table(UNEVEN)))
    make = lambda c: HFDatasetReader(dataset=dataset, seed=1, consumer=c, chunk_rows=100)  # noqa: E731
    check_balanced(shares(make, count), sum(UNEVEN))


@pytest.mark.parametrize("count", [2, 4])
def test_read_jsonl_shares_are_balanced_by_bytes(tmp_path, count):
    lines = [json.dumps({"rid": i, "text": "x" * (i % 7)}) + "\n" for i in range(2100)]
    path = tmp_path / "d.jsonl"
    path.write_text("".join(lines))
    make = lambda c: JsonlReader(paths=str(path), seed=2, consumer=c, unit_bytes=20_000)  # noqa: E731
    per_consumer = shares(make, count)
    check_bytes = [sum(len(lines[rid]) for rid in share) for share in per_consumer]
    assert sorted(rid for share in per_consumer for rid in share) == list(range(2100))
    assert max(check_bytes) - min(check_bytes) <= 2 * max(len(line) for line in lines)


def test_read_parquet_balances_a_share_of_one_row_group_per_consumer(tmp_path):
    """One row group over 4 consumers: each reads its quarter (the cut costs one decode, not a repeat)."""
    write_parquet(tmp_path / "d.parquet", (1001,))
    make = lambda c: ParquetReader(paths=str(tmp_path / "d.parquet"), consumer=c, chunk_rows=100)  # noqa: E731
    per_consumer = shares(make, 4)
    assert [s[0] for s in per_consumer] == [0, 250, 500, 750]
    check_balanced(per_consumer, 1001)


def test_read_parquet_resumes_exactly_inside_a_cut_row_group(tmp_path):
    from tests.contract import check_node_resume

    write_parquet(tmp_path / "d.parquet", (1001, 20))
    check_node_resume(
        lambda: ParquetReader(
            paths=str(tmp_path / "d.parquet"), seed=4, chunk_rows=60, consumer=Consumer(worker=1, num_workers=3)
        )
    )
