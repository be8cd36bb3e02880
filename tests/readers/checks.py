"""Checks every reader's tests share: one epoch's rows, the consumer split, per-epoch unit order."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa
from torchdata.nodes import BaseNode

from padpipe import Consumer


def epoch_batches(node: BaseNode, epochs: int = 1) -> list[list[pa.RecordBatch]]:
    """The record batches of ``epochs`` consecutive epochs (each a ``reset(None)`` and a full pass)."""
    out = []
    for _ in range(epochs):
        node.reset(None)
        batches = list(node)
        assert all(isinstance(b, pa.RecordBatch) for b in batches)
        out.append(batches)
    return out


def rows(batches: list[pa.RecordBatch]) -> list[dict[str, Any]]:
    """All rows of ``batches`` in order."""
    return [row for batch in batches for row in batch.to_pylist()]


def check_split(make: Callable[[Consumer], BaseNode], expected: list[dict[str, Any]], key: str, count: int = 2) -> None:
    """``count`` consumers read disjoint shares whose union is ``expected`` (each row has a unique ``key``)."""
    seen: list[Any] = []
    for worker in range(count):
        share = [row[key] for row in rows(epoch_batches(make(Consumer(worker=worker, num_workers=count)))[0])]
        assert share, f"consumer {worker} of {count} read nothing"
        seen += share
    assert len(seen) == len(set(seen)), "a row was read by two consumers"
    assert sorted(seen) == sorted(row[key] for row in expected)
