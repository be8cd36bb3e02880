"""The work unit: the smallest piece of input one consumer reads whole, and the pieces it is cut into."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WorkUnit:
    """The smallest piece of input one consumer reads whole.

    Attributes:
        path: The file (or a label such as ``"<datasets.Dataset>"``).
        index: Which unit of that file: row group, record batch, byte range or index range number.
        num_rows: Rows in the unit when known from metadata, else ``None``.
        start: Unit-specific start (byte offset for JSONL ranges, first index for datasets).
        stop: Unit-specific end, exclusive.
        first: First row of the unit this piece reads (a consumer's share may cut a unit).
        last: Row of the unit this piece stops before; ``None``: the unit's end.
    """

    path: str
    index: int
    num_rows: int | None = None
    start: int = 0
    stop: int | None = None
    first: int = 0
    last: int | None = None
