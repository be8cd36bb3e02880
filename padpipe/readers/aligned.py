"""Cut a stream of record batches at fixed row boundaries, whatever sizes the batches came in.

Boundaries fall where the unit's row number is a multiple of ``chunk_rows``, so the same rows give the same
batches (and the same shuffle-buffer evictions) from a file's pages, a cache's pieces or a resumed read.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import pyarrow as pa


def aligned_batches(batches: Iterable[pa.RecordBatch], origin: int, chunk_rows: int) -> Iterator[pa.RecordBatch]:
    """Re-cut ``batches`` so that every boundary falls where ``origin + row`` is a multiple of ``chunk_rows``.

    Batches already on the boundaries pass through untouched (no copy); others are sliced, and
    only batches that straddle a boundary are concatenated.

    Args:
        batches: The rows, in order, in batches of any size (empty ones are dropped).
        origin: The row number (in the unit) of the first row.
        chunk_rows: The boundary spacing, and so the largest batch.

    Example:
        >>> parts = [pa.record_batch({"a": list(range(i, i + 3))}) for i in (0, 3, 6)]
        >>> [b.num_rows for b in aligned_batches(parts, origin=2, chunk_rows=4)]
        [2, 4, 3]
    """
    pending: list[pa.RecordBatch] = []
    held = 0  # rows in pending
    row = origin
    for batch in batches:
        while batch.num_rows:
            room = chunk_rows - (row + held) % chunk_rows
            take = min(room, batch.num_rows)
            part, batch = (
                (batch, batch.slice(0, 0)) if take == batch.num_rows else (batch.slice(0, take), batch.slice(take))
            )
            pending.append(part)
            held += take
            if take == room:
                yield concat(pending)
                row, pending, held = row + held, [], 0
    if held:
        yield concat(pending)


def concat(batches: list[pa.RecordBatch]) -> pa.RecordBatch:
    """One record batch of ``batches``; differing types (a JSONL key all null in one block) are promoted.

    Example:
        >>> concat([pa.record_batch({"a": [None]}), pa.record_batch({"a": [1]})]).column("a").type
        DataType(int64)
    """
    if len(batches) == 1:
        return batches[0]
    first = batches[0].schema
    if all(b.schema.equals(first) for b in batches[1:]):
        return pa.concat_batches(batches)
    tables = [pa.Table.from_batches([b]) for b in batches]
    return pa.concat_tables(tables, promote_options="permissive").combine_chunks().to_batches()[0]
