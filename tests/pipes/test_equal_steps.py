"""EqualSteps and equal_steps(): the per-step agreement, with a simulated second rank.

The real all-reduce runs in tests/test_distributed.py; here ``detect_sync`` is replaced by a fake
that answers as if one other rank had ``other`` batches this epoch.
"""

from __future__ import annotations

import pytest
import torch
from torchdata.nodes import IterableWrapper

import padpipe as pp
from padpipe.pipes import equal_steps as es
from padpipe.pipes.equal_steps import EqualSteps
from padpipe.stats import PipelineStats
from tests.contract import check_node_resume
from tests.pipes.nodes import ListNode


class FakeSync:
    """Another rank with ``other`` batches; the step is read from ``step()`` (the node's own count)."""

    def __init__(self, other: int, step=None) -> None:
        self.other, self.calls, self.step = other, 0, step

    def agree(self, fresh: bool, stuck: bool) -> tuple[bool, bool, bool]:
        step = self.step() if self.step is not None else self.calls
        self.calls += 1
        other_fresh = step < self.other
        return fresh or other_fresh, not fresh or not other_fresh, stuck or (not other_fresh and self.other == 0)


def items(n: int) -> list[dict]:
    return [{"x": torch.tensor(i)} for i in range(n)]


def make_node(monkeypatch, mine: int, other: int, policy: str, stats: PipelineStats | None = None) -> EqualSteps:
    holder: dict = {}
    monkeypatch.setattr(es, "detect_sync", lambda group=None: FakeSync(other, lambda: holder["node"]._steps))
    holder["node"] = EqualSteps(ListNode(items(mine)), policy=policy, stats=stats)
    return holder["node"]


def xs(batches: list[dict]) -> list[tuple[int, bool | None]]:
    return [(int(b["x"]), None if "is_repeat" not in b else bool(b["is_repeat"])) for b in batches]


def test_equal_steps_works(monkeypatch):
    stats = PipelineStats()
    node = make_node(monkeypatch, 5, 3, "stop_first", stats)
    for _ in range(2):
        node.reset(None)
        assert xs(list(node)) == [(0, None), (1, None), (2, None)]
    assert stats.snapshot().skipped == {"equal_steps.dropped_batches": 4}


def test_equal_steps_works_when_this_rank_runs_out_first(monkeypatch):
    stats = PipelineStats()
    node = make_node(monkeypatch, 3, 5, "stop_first", stats)
    assert xs(list(node)) == [(0, None), (1, None), (2, None)]
    assert stats.snapshot().skipped == {}


def test_equal_steps_repeats_the_epoch_until_the_last_rank_finishes(monkeypatch):
    stats = PipelineStats()
    node = make_node(monkeypatch, 3, 7, "repeat", stats)
    expected = [(0, False), (1, False), (2, False), (0, True), (1, True), (2, True), (0, True)]
    for _ in range(2):
        node.reset(None)
        assert xs(list(node)) == expected
    assert stats.snapshot().counters == {"equal_steps.repeated_batches": 8}
    node = make_node(monkeypatch, 4, 2, "repeat")
    assert xs(list(node)) == [(0, False), (1, False), (2, False), (3, False)]


def test_equal_steps_stops_every_rank_when_one_has_nothing_to_repeat(monkeypatch):
    stats = PipelineStats()
    assert list(make_node(monkeypatch, 3, 0, "repeat", stats)) == []
    assert stats.snapshot().skipped == {"equal_steps.dropped_batches": 3}
    assert list(make_node(monkeypatch, 0, 3, "repeat")) == []


def test_equal_steps_passes_items_through_without_distributed():
    assert torch.distributed.is_initialized() is False
    node = EqualSteps(IterableWrapper(["a", "b"]), policy="stop_first")
    assert list(node) == ["a", "b"]
    assert xs(list(EqualSteps(ListNode(items(2)), policy="repeat"))) == [(0, False), (1, False)]
    assert xs(list(EqualSteps(ListNode(items(2)), policy="off"))) == [(0, None), (1, None)]


def test_equal_steps_raises_error_when_policy_is_unknown():
    with pytest.raises(ValueError, match=r"^`policy` must be one of \('stop_first', 'repeat', 'off'\), but is 'all' instead\.$"):
        EqualSteps(ListNode([1]), policy="all")
    with pytest.raises(ValueError, match=r"^`policy` must be one of .*, but is 'x' instead\.$"):
        pp.equal_steps([1], policy="x")
    with pytest.raises(ValueError, match=r"^`equal_steps` must be one of .*, but is 'x' instead\.$"):
        pp.from_iterable([{"text": "a"}]).loader(equal_steps="x")


def test_equal_steps_raises_error_when_state_has_another_policy(monkeypatch):
    state = make_node(monkeypatch, 3, 2, "stop_first").state_dict()
    with pytest.raises(pp.StateMismatchError, match=r"^EqualSteps state .*setting 'policy' found 'stop_first' instead of 'repeat'\.$"):
        make_node(monkeypatch, 3, 2, "repeat").reset(state)


@pytest.mark.parametrize(("policy", "mine", "other"), [("stop_first", 5, 3), ("repeat", 3, 8), ("repeat", 4, 2)])
def test_equal_steps_saves_and_restores_its_state(monkeypatch, policy, mine, other):
    check_node_resume(lambda: make_node(monkeypatch, mine, other, policy), epochs=2)


def test_equal_steps_helper_works(monkeypatch):
    monkeypatch.setattr(es, "detect_sync", lambda group=None: FakeSync(3))
    stats = PipelineStats()
    assert xs(pp.equal_steps(items(5), stats=stats)) == [(0, None), (1, None), (2, None)]
    assert stats.snapshot().skipped == {"equal_steps.dropped_batches": 2}
    expected = [(0, False), (1, False), (0, True)]
    assert xs(pp.equal_steps(items(2), "repeat", stats=stats)) == expected
    assert stats.snapshot().counters == {"equal_steps.repeated_batches": 1}
    assert xs(pp.equal_steps(items(5), "off")) == [(i, None) for i in range(5)]
    monkeypatch.setattr(es, "detect_sync", lambda group=None: None)
    assert xs(pp.equal_steps(items(2), "repeat")) == [(0, False), (1, False)]


def test_loader_wraps_the_pipeline_in_equal_steps():
    pipe = pp.from_iterable([{"text": "a b"}, {"text": "c"}]).tokenize(pp.examples.tokenizer()).batch(1).pad()
    assert isinstance(pipe.loader().root, EqualSteps)
    assert not isinstance(pipe.loader(equal_steps="off").root, EqualSteps)
    batches = list(pipe.loader(equal_steps="repeat"))
    assert [bool(b["is_repeat"]) for b in batches] == [False, False]
