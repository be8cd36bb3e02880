"""The elastic planner a reader holds: which pieces of its units one consumer reads each epoch.

Every consumer takes an equal stretch (:mod:`padpipe.sharing.shares`) of the epoch's unit order, the same on all
of them, units cut by the reader's ``measure`` and ``piece`` (:func:`by_rows` and :func:`rows_piece` by default).
An elastic resume asks what a consumer had left (:meth:`EpochPlan.rest`), shares it again
(:meth:`EpochPlan.share`) and hands each new consumer its part (:meth:`EpochPlan.override`).

Example:
    >>> plan = EpochPlan(seed=None)
    >>> units = [WorkUnit("a", 0, num_rows=4), WorkUnit("a", 1, num_rows=2)]
    >>> [(u.index, u.first, u.last) for u in plan.order(units, Consumer(rank=1, world_size=2), 0)]
    [(0, 3, 4), (1, 0, None)]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from padpipe.readers.unit import WorkUnit
from padpipe.sharing.consumer import Consumer
from padpipe.sharing.shares import Measure, share

Measurer = Callable[[WorkUnit], Measure]
Cutter = Callable[[WorkUnit, int, int], WorkUnit]


def by_rows(unit: WorkUnit) -> Measure:
    """A unit's weight: its rows when known (cuttable), else one whole unit."""
    return Measure(unit.num_rows, cuttable=True) if unit.num_rows is not None else Measure(1, cuttable=False)


def rows_piece(unit: WorkUnit, lo: int, hi: int) -> WorkUnit:
    """Rows ``lo`` to ``hi`` of ``unit`` (its ``first``/``last`` narrowed); the unit itself when that is all of it."""
    if unit.num_rows is None or (lo, hi) == (0, unit.num_rows):
        return unit
    return dataclasses.replace(unit, num_rows=hi - lo, first=unit.first + lo, last=unit.first + hi)


class EpochPlan:
    """One consumer's pieces of each epoch's unit order, and the rest of an epoch to re-share.

    Args:
        seed: When set, each epoch's unit order is a permutation seeded by ``(seed, epoch)``.
        measure: What a unit weighs (default :func:`by_rows`).
        piece: The part ``[lo, hi)`` of a unit in that weight (default :func:`rows_piece`).
    """

    def __init__(self, *, seed: int | None, measure: Measurer = by_rows, piece: Cutter = rows_piece) -> None:
        self.seed = seed
        self.measure, self.piece = measure, piece
        self._override: tuple[int, list[WorkUnit]] | None = None  # (epoch, pieces): an elastic resume's share

    def order(self, units: list[WorkUnit], consumer: Consumer, epoch: int) -> list[WorkUnit]:
        """``consumer``'s pieces of ``epoch``'s unit order (or the pieces :meth:`override` gave for that epoch)."""
        if self._override is not None and self._override[0] == epoch:
            return list(self._override[1])
        order = np.arange(len(units))
        if self.seed is not None:
            order = np.random.default_rng([self.seed, epoch, 0x5EED]).permutation(order)
        return self.share([units[i] for i in order], consumer.index, consumer.count)

    def share(self, units: list[WorkUnit], index: int, count: int) -> list[WorkUnit]:
        """Consumer ``index`` of ``count``'s equal stretch of ``units`` laid end to end, cut where needed."""
        pieces = share([self.measure(u) for u in units], index, count)
        return [self.piece(units[p.position], p.lo, p.hi) for p in pieces]

    def override(self, epoch: int, pieces: list[WorkUnit]) -> None:
        """Read ``pieces`` in ``epoch`` instead of the consumer's share (the rest of an epoch, re-shared)."""
        self._override = (epoch, list(pieces))

    def rest(self, order: list[WorkUnit], unit: int, row: int) -> list[WorkUnit]:
        """What is left of ``order`` at row ``row`` of its unit ``unit``: the unit cut there where rows can be cut,
        else from the next unit (the current one is read to its end first, see :meth:`stop_at`)."""
        if unit >= len(order):
            return []
        if row == 0:
            return order[unit:]
        current = order[unit]
        if not self.cuttable_by_rows(current):
            return order[unit + 1 :]
        assert current.num_rows is not None  # cuttable by rows
        return [self.piece(current, row, current.num_rows), *order[unit + 1 :]]

    def stop_at(self, order: list[WorkUnit], unit: int, row: int) -> int:
        """The unit a reader that reads nothing new stops before: ``unit`` where :meth:`rest` cut it, else the next."""
        cut = unit < len(order) and row > 0 and self.cuttable_by_rows(order[unit])
        return unit + (0 if cut else 1 if row else 0)

    def cuttable_by_rows(self, unit: WorkUnit) -> bool:
        """Whether ``unit`` can be cut at a row: its rows are known and are its weight."""
        measure = self.measure(unit)
        return unit.num_rows is not None and measure.cuttable and measure.weight == unit.num_rows
