"""The elastic planner a reader holds (padpipe.readers.plan): shares, the rest of an epoch, overrides."""

import dataclasses

import pytest

from padpipe import Consumer
from padpipe.readers.plan import EpochPlan
from padpipe.readers.unit import WorkUnit
from padpipe.sharing.shares import Measure

UNITS = [WorkUnit("a", 0, num_rows=5), WorkUnit("a", 1, num_rows=3), WorkUnit("b", 0, num_rows=4)]


def rows_of(pieces):
    return [(u.path, u.index, row) for u in pieces for row in range(u.first, u.first + u.num_rows)]


@pytest.mark.parametrize("count", [1, 2, 3, 5])
@pytest.mark.parametrize("seed", [None, 4])
def test_plan_order_gives_every_row_to_one_consumer(count, seed):
    plan = EpochPlan(seed=seed)
    shares = [plan.order(UNITS, Consumer(worker=i, num_workers=count), epoch=1) for i in range(count)]
    everything = sorted(r for share in shares for r in rows_of(share))
    assert everything == sorted(rows_of(UNITS))
    assert max(map(len, map(rows_of, shares))) - min(map(len, map(rows_of, shares))) <= 1


def test_plan_rest_cuts_a_unit_at_its_row_and_stop_at_stops_there():
    plan = EpochPlan(seed=None)
    order = plan.order(UNITS, Consumer(), epoch=0)
    assert plan.rest(order, 1, 2) == [dataclasses.replace(UNITS[1], num_rows=1, first=2, last=3), UNITS[2]]
    assert plan.stop_at(order, 1, 2) == 1  # the cut unit is left to the rest
    assert plan.rest(order, 1, 0) == order[1:] and plan.stop_at(order, 1, 0) == 1
    assert plan.rest(order, 3, 0) == [] and plan.stop_at(order, 3, 0) == 3


def test_plan_rest_leaves_a_unit_it_cannot_cut_to_the_reader_that_began_it():
    whole = WorkUnit("c.jsonl.gz", 0)
    plan = EpochPlan(seed=None, measure=lambda u: Measure(10, cuttable=False))
    assert plan.rest([whole, UNITS[0]], 0, 4) == [UNITS[0]]
    assert plan.stop_at([whole, UNITS[0]], 0, 4) == 1  # read to its end before stopping


def test_plan_override_replaces_one_epochs_share_only():
    plan = EpochPlan(seed=None)
    plan.override(2, [UNITS[2]])
    assert plan.order(UNITS, Consumer(), epoch=2) == [UNITS[2]]
    assert plan.order(UNITS, Consumer(), epoch=3) == UNITS
