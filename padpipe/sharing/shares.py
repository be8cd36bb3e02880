"""Balanced shares: cut one epoch's ordered units into equal contiguous shares, one per consumer.

The epoch's units, in their (seeded) order, are laid end to end as one stream of ``W`` weight
(rows where every unit knows its row count, else bytes). Consumer ``i`` of ``C`` owns the stretch
``[i * W // C, (i + 1) * W // C)``: shares differ by at most one row, a unit that straddles two
stretches is cut between them (so each consumer reads at most one unit it does not own whole from
its start), and every consumer computes the same cut from the same order, with no communication.
A unit that cannot be cut (a compressed file, a stream) goes whole to the consumer whose stretch
holds its middle.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Measure:
    """How much of the epoch a unit is, and whether it can be cut.

    Attributes:
        weight: Rows (or bytes, for sources that cannot know rows) of the unit.
        cuttable: Whether any sub-range ``[lo, hi)`` of the weight can be read on its own.
    """

    weight: int
    cuttable: bool = True


@dataclass(frozen=True)
class Piece:
    """The part ``[lo, hi)`` (in the unit's weight) of the unit at ``position`` of the epoch order."""

    position: int
    lo: int
    hi: int


def share(measures: Sequence[Measure], index: int, count: int) -> list[Piece]:
    """Consumer ``index`` of ``count``'s pieces of the units ``measures`` (in epoch order).

    Args:
        measures: Each unit's weight and cuttability, in the epoch's unit order.
        index: This consumer's position, ``0 <= index < count``.
        count: Number of consumers sharing the epoch.

    Returns:
        The pieces in epoch order; empty pieces are left out.

    Example:
        >>> [(p.position, p.lo, p.hi) for p in share([Measure(700), Measure(700), Measure(700)], 1, 4)]
        [(0, 525, 700), (1, 0, 350)]
        >>> [(p.position, p.lo, p.hi) for p in share([Measure(5, cuttable=False)] * 3, 0, 2)]
        [(0, 0, 5)]
    """
    if not 0 <= index < count:
        raise ValueError(f"`index` must be in [0, {count}), but is {index} instead.")
    total = sum(m.weight for m in measures)
    lo_bound, hi_bound = index * total // count, (index + 1) * total // count
    pieces, start = [], 0
    for position, measure in enumerate(measures):
        end = start + measure.weight
        if measure.cuttable:
            lo, hi = max(start, lo_bound), min(end, hi_bound)
            if lo < hi:
                pieces.append(Piece(position, lo - start, hi - start))
        elif _owner(start + end, total, count) == index:
            pieces.append(Piece(position, 0, measure.weight))
        start = end
    return pieces


def _owner(doubled_middle: int, total: int, count: int) -> int:
    """The consumer whose stretch holds a whole unit's middle (given doubled, to stay in ints)."""
    if total == 0:  # nothing has weight: the first consumer takes every whole unit
        return 0
    middle = min(doubled_middle, 2 * total - 1)
    # consumer i owns [i * total // count, (i + 1) * total // count): find i for middle / 2
    owner = middle * count // (2 * total)
    while owner > 0 and 2 * (owner * total // count) > middle:
        owner -= 1
    while owner < count - 1 and 2 * ((owner + 1) * total // count) <= middle:
        owner += 1
    return owner
