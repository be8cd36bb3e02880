"""Balanced shares: the cut of an epoch's unit order into one equal stretch per consumer."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from padpipe.sharing.shares import Measure, share

measures = st.lists(st.builds(Measure, st.integers(0, 60), st.booleans()), max_size=10)


@given(measures, st.integers(1, 9))
def test_share_gives_every_unit_part_to_exactly_one_consumer(units, count):
    parts: dict[int, list[tuple[int, int]]] = {}
    for index in range(count):
        for piece in share(units, index, count):
            parts.setdefault(piece.position, []).append((piece.lo, piece.hi))
    for position, unit in enumerate(units):
        pieces = sorted(parts.get(position, []))
        if not unit.cuttable:
            assert pieces == [(0, unit.weight)]
            continue
        covered = 0
        for lo, hi in pieces:
            assert lo == covered and hi > lo
            covered = hi
        assert covered == unit.weight


@given(st.lists(st.integers(0, 60), max_size=10), st.integers(1, 9))
def test_share_of_cuttable_units_differs_by_at_most_one(weights, count):
    units = [Measure(w) for w in weights]
    sizes = [sum(p.hi - p.lo for p in share(units, index, count)) for index in range(count)]
    assert max(sizes) - min(sizes) <= 1


@given(st.lists(st.integers(1, 60), min_size=1, max_size=10), st.integers(1, 9))
def test_share_cuts_at_most_two_units_per_consumer(weights, count):
    units = [Measure(w) for w in weights]
    for index in range(count):
        pieces = share(units, index, count)
        partial = [p for p in pieces if (p.lo, p.hi) != (0, units[p.position].weight)]
        assert len(partial) <= 2
        assert all(p in (pieces[0], pieces[-1]) for p in partial)  # only at the ends of the stretch


def test_share_puts_an_uncuttable_unit_where_its_middle_falls():
    units = [Measure(10), Measure(4, cuttable=False), Measure(10)]
    assert [p.position for p in share(units, 0, 2)] == [0]
    assert [(p.position, p.lo, p.hi) for p in share(units, 1, 2)] == [(1, 0, 4), (2, 0, 10)]


def test_share_raises_error_when_index_is_out_of_range():
    with pytest.raises(ValueError, match=r"^`index` must be in \[0, 2\), but is 2 instead\.$"):
        share([Measure(1)], 2, 2)
