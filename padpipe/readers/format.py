"""The reader protocol: what one input format writes, and nothing else.

A format lists its *work units* (a Parquet row group, a JSONL byte range, ...), reads one from a given row, and
keeps the state of a position a row number alone cannot say; the rest is the reader node's
(:class:`~padpipe.readers.source.UnitSource`). A new format writes :meth:`Format.describe`,
:meth:`Format.list_units` and :meth:`Format.read_unit`, as :mod:`padpipe.readers.csv` does in a few lines.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from padpipe.readers.plan import by_rows, rows_piece
from padpipe.readers.unit import WorkUnit
from padpipe.sharing.shares import Measure
from padpipe.state import Loaded, Spec


class Format:
    """One input format: its units, how to read one, and the state of a position inside one.

    Subclasses write the first three methods; the rest are optional.
    """

    POSITION: dict[str, Spec] = {}  # state keys of a position inside a unit, besides its row (JSONL: the block)

    def describe(self) -> str:
        """Short description of the input for messages and fingerprints (paths, columns)."""
        raise NotImplementedError

    def list_units(self) -> list[WorkUnit]:
        """All work units of the input, in a fixed natural order (called once, on the first ``reset``)."""
        raise NotImplementedError

    def read_unit(self, unit: WorkUnit, start_row: int) -> Iterator[pa.RecordBatch]:
        """Record batches of ``unit`` from its row ``start_row`` on (counted from the unit's first row).

        The reader stops at a piece's ``last`` row itself and names the file in errors.
        """
        raise NotImplementedError

    # -- optional -------------------------------------------------------------------------------
    def fingerprint(self) -> str:
        """What a state must have been saved from besides the listing (the ``input`` setting)."""
        return self.describe()

    def measure(self, unit: WorkUnit) -> Measure:
        """The unit's weight in the epoch and whether it can be cut: by default its rows when known, else whole."""
        return by_rows(unit)

    def piece(self, unit: WorkUnit, lo: int, hi: int) -> WorkUnit:
        """The part ``[lo, hi)`` (in :meth:`measure`'s weight) of ``unit``: by default rows ``lo`` to ``hi``."""
        return rows_piece(unit, lo, hi)

    def position(self, reading: bool) -> dict[str, Any]:
        """The values of :attr:`POSITION` now (``reading``: a unit is being read, else the next starts at the row)."""
        return {}

    def check_position(self, loaded: Loaded, unit: WorkUnit | None) -> None:
        """Check a state's :attr:`POSITION` values against its position (``unit``: the unit being read, if any)."""

    def restore_position(self, loaded: Loaded | None) -> None:
        """Resume from a checked state's :attr:`POSITION` values (``None``: a fresh epoch)."""

    def close(self) -> None:
        """Close what the format keeps open between units (after an error, before re-opening)."""

    def reopen(self) -> None:
        """Get ready to re-read the current unit from the current row after a transient error."""
        self.close()

    def record_row_positions(self) -> bool:
        """Add each row's byte position to what :meth:`read_unit` yields, where units are cut by bytes.

        The token cache asks for it to cache such units; ``False``: this format cannot (nor needs to).
        """
        return False

    def drop_position_hint(self) -> None:
        """Forget where in the current piece a resumed read may start (the token cache reads pieces in parts)."""
