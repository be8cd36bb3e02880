"""EqualSteps and equal_steps(): the per-step agreement, with ranks simulated by threads.

The real all-reduce runs under torchrun in tests/test_distributed.py; here each rank is a thread
and ``detect_sync`` is replaced by a fake group whose ``agree`` meets the other threads at a
barrier, so the ranks really run in lockstep as they do under ``torch.distributed``.
"""

from __future__ import annotations

import pickle
import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch

import padpipe as pp
from padpipe.runtime import equal_steps as es
from padpipe.runtime.batch_cut import split_batch
from padpipe.runtime.equal_steps import EqualSteps
from padpipe.stats import PipelineStats
from tests.contract import normalize
from tests.pipes.nodes import ListNode


class ThreadGroup:
    """A fake process group of ``size`` threads: ``agree`` all-reduces (element-wise max) at a barrier."""

    def __init__(self, size: int) -> None:
        self.size, self.values = size, [None] * size
        self.barrier = threading.Barrier(size, timeout=10)
        self.rank = threading.local()

    def agree(self, values: list[int]) -> list[int]:
        self.values[self.rank.value] = list(values)
        self.barrier.wait()
        agreed = [max(column) for column in zip(*self.values)]
        self.barrier.wait()
        return agreed


def run_ranks(monkeypatch, work: list[Callable[[], Any]]) -> list[Any]:
    """Run ``work[r]()`` as rank ``r`` of a thread group; their results, by rank."""
    group = ThreadGroup(len(work))
    monkeypatch.setattr(es, "detect_sync", lambda g=None: group)
    results: list[Any] = [None] * len(work)
    errors: list[BaseException] = []

    def run(rank: int) -> None:
        group.rank.value = rank
        try:
            results[rank] = work[rank]()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test thread
            errors.append(exc)
            group.barrier.abort()

    threads = [threading.Thread(target=run, args=(r,)) for r in range(len(work))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    if errors:
        raise errors[0]
    return results


def batches(rank: int, sizes: list[int]) -> list[dict]:
    """Dict batches of the given row counts; row ids ``rank * 1000 + i`` are unique over ranks."""
    out, start = [], rank * 1000
    for n in sizes:
        out.append({"rid": torch.arange(start, start + n), "text": [f"r{i}" for i in range(start, start + n)]})
        start += n
    return out


def rids(items: list[dict]) -> list[int]:
    return [r for b in items if not bool(b.get("is_repeat", False)) for r in b["rid"].tolist()]


def epochs_of(node: EqualSteps, epochs: int) -> list[list[dict]]:
    out = []
    for _ in range(epochs):
        node.reset(None)
        out.append(list(node))
    return out


def test_equal_steps_works(monkeypatch):
    """Rank 1 has 2 batches fewer: it splits its largest batches until both end together; nothing is dropped."""
    stats = [PipelineStats(), PipelineStats()]
    sizes = [[8, 8, 8, 8], [8, 8]]
    nodes = [EqualSteps(ListNode(batches(r, sizes[r])), stats=stats[r]) for r in range(2)]
    result = run_ranks(monkeypatch, [lambda r=r: epochs_of(nodes[r], 2) for r in range(2)])
    for epoch in range(2):
        steps = [len(result[r][epoch]) for r in range(2)]
        assert steps == [4, 4]
        assert [len(b["rid"]) for b in result[1][epoch]] == [8, 2, 2, 4]  # the largest split first, rows in order
        for r in range(2):
            assert rids(result[r][epoch]) == [x for b in batches(r, sizes[r]) for x in b["rid"].tolist()]
    assert stats[1].snapshot().counters == {"equal_steps.split_batches": 4}
    assert stats[0].snapshot().skipped == stats[1].snapshot().skipped == {}


@pytest.mark.parametrize(
    "sizes", [[[8] * 10, [8] * 6], [[8] * 9, [16] * 4, [4] * 12], [[8] * 12, [8] * 9, [8] * 10, [6] * 13]]
)
def test_equal_steps_evens_out_a_tail_of_several_batches_without_dropping(monkeypatch, sizes):
    """Ranks a few batches apart at the end (more than one halving can make up): the tail is read ahead and split."""
    stats = [PipelineStats() for _ in sizes]
    nodes = [EqualSteps(ListNode(batches(r, sizes[r])), stats=stats[r]) for r in range(len(sizes))]
    result = run_ranks(monkeypatch, [lambda r=r: epochs_of(nodes[r], 2) for r in range(len(sizes))])
    for epoch in range(2):
        assert len({len(result[r][epoch]) for r in range(len(sizes))}) == 1, "every rank takes the same steps"
        for r in range(len(sizes)):
            assert rids(result[r][epoch]) == [x for b in batches(r, sizes[r]) for x in b["rid"].tolist()]
    assert all(s.snapshot().skipped == {} for s in stats), "nothing dropped"


def test_equal_steps_joins_batches_where_another_rank_has_fewer_rows_than_steps(monkeypatch):
    stats = PipelineStats()
    sizes = [[2, 2, 2, 2, 2], [1]]
    nodes = [EqualSteps(ListNode(batches(r, sizes[r])), stats=s) for r, s in enumerate([stats, PipelineStats()])]
    result = run_ranks(monkeypatch, [lambda r=r: epochs_of(nodes[r], 1)[0] for r in range(2)])
    assert [len(result[r]) for r in range(2)] == [1, 1]
    assert rids(result[0]) == list(range(10)) and rids(result[1]) == [1000]
    assert stats.snapshot().skipped == {} and stats.snapshot().counters == {"equal_steps.merged_batches": 4}


def test_equal_steps_drops_what_cannot_be_split_or_joined_and_counts_it(monkeypatch):
    stats = PipelineStats()
    ragged = [{"x": torch.ones(2, width)} for width in (3, 5, 7)]  # padded to different widths: never joined
    nodes = [EqualSteps(ListNode(ragged), stats=stats), EqualSteps(ListNode([{"x": torch.ones(1, 3)}]))]
    result = run_ranks(monkeypatch, [lambda r=r: epochs_of(nodes[r], 1)[0] for r in range(2)])
    assert [len(result[r]) for r in range(2)] == [1, 1]
    assert stats.snapshot().skipped == {"equal_steps.dropped_batches": 2, "equal_steps.dropped_rows": 4}


def test_equal_steps_repeats_the_epoch_until_the_last_rank_finishes(monkeypatch):
    stats = PipelineStats()
    sizes = [[3, 3, 3], [3] * 7]
    nodes = [
        EqualSteps(ListNode(batches(r, sizes[r])), policy="repeat", stats=s)
        for r, s in enumerate([stats, PipelineStats()])
    ]
    result = run_ranks(monkeypatch, [lambda r=r: epochs_of(nodes[r], 2) for r in range(2)])
    for epoch in range(2):
        assert [len(result[r][epoch]) for r in range(2)] == [7, 7]
        flags = [bool(b["is_repeat"]) for b in result[0][epoch]]
        assert flags == [False] * 3 + [True] * 4
        assert [b["rid"][0].item() for b in result[0][epoch][3:]] == [0, 3, 6, 0]  # the epoch from its start
        assert rids(result[1][epoch]) == list(range(1000, 1021))
    assert stats.snapshot().counters == {"equal_steps.repeated_batches": 8}


def test_equal_steps_stops_every_rank_when_one_has_nothing_to_repeat(monkeypatch):
    stats = PipelineStats()
    nodes = [
        EqualSteps(ListNode(batches(0, [3, 3, 3])), policy="repeat", stats=stats),
        EqualSteps(ListNode([]), policy="repeat"),
    ]
    result = run_ranks(monkeypatch, [lambda r=r: epochs_of(nodes[r], 1)[0] for r in range(2)])
    assert result == [[], []]
    assert stats.snapshot().skipped == {"equal_steps.dropped_batches": 3, "equal_steps.dropped_rows": 9}


def test_equal_steps_passes_items_through_without_distributed():
    assert torch.distributed.is_initialized() is False
    node = EqualSteps(ListNode(["a", "b"]), policy="stop_first")
    node.reset()
    assert list(node) == ["a", "b"]
    node = EqualSteps(ListNode(batches(0, [1, 1])), policy="repeat")
    node.reset()
    assert [bool(b["is_repeat"]) for b in node] == [False, False]


def test_equal_steps_raises_error_when_policy_is_unknown():
    with pytest.raises(
        ValueError, match=r"^`policy` must be one of \('stop_first', 'repeat', 'off'\), but is 'all' instead\.$"
    ):
        EqualSteps(ListNode([1]), policy="all")
    with pytest.raises(ValueError, match=r"^`policy` must be one of .*, but is 'x' instead\.$"):
        pp.equal_steps([1], policy="x")
    with pytest.raises(ValueError, match=r"^`equal_steps` must be one of .*, but is 'x' instead\.$"):
        pp.from_iterable([{"text": "a"}]).loader(equal_steps="x")


def test_equal_steps_raises_error_when_state_has_another_policy():
    node = EqualSteps(ListNode([1]), policy="stop_first")
    node.reset()
    with pytest.raises(
        pp.StateMismatchError, match=r"^EqualSteps state .*setting 'policy' found 'stop_first' instead of 'repeat'\.$"
    ):
        EqualSteps(ListNode([1]), policy="repeat").reset(node.state_dict())


@pytest.mark.parametrize(
    ("policy", "sizes"),
    [
        ("stop_first", [[4, 4, 4, 4], [4, 4]]),
        ("stop_first", [[4, 4], [4, 4, 4, 4]]),
        ("repeat", [[2, 2], [2, 2, 2, 2, 2]]),
    ],
)
def test_equal_steps_saves_and_restores_its_state(monkeypatch, policy, sizes):
    """Both ranks save at every step; both resumed from step k continue exactly, over two epochs."""

    def make(rank: int) -> EqualSteps:
        return EqualSteps(ListNode(batches(rank, sizes[rank])), policy=policy)

    def reference(rank: int) -> list[tuple[list, list]]:
        """Per epoch: the items, and the state before each item and after the last."""
        node, out = make(rank), []
        for _ in range(2):
            node.reset(None)
            items, states = [], [pickle.dumps(node.state_dict())]
            for item in node:
                items.append(normalize(item))
                states.append(pickle.dumps(node.state_dict()))
            out.append((items, states))
        return out

    ref = run_ranks(monkeypatch, [lambda r=r: reference(r) for r in range(2)])
    for epoch in range(2):
        assert len(ref[0][epoch][1]) == len(ref[1][epoch][1])  # equal steps
        for k in range(len(ref[0][epoch][1])):

            def resume(rank: int, epoch: int = epoch, k: int = k) -> list:
                node = make(rank)
                node.reset(pickle.loads(ref[rank][epoch][1][k]))
                out = [[normalize(i) for i in node]]
                for _ in range(epoch + 1, 2):
                    node.reset(None)
                    out.append([normalize(i) for i in node])
                return out

            got = run_ranks(monkeypatch, [lambda r=r: resume(r) for r in range(2)])
            for rank in range(2):
                expected = [ref[rank][epoch][0][k:]] + [ref[rank][e][0] for e in range(epoch + 1, 2)]
                assert got[rank] == expected, f"rank {rank} resumed at epoch {epoch} step {k}"


def test_equal_steps_helper_works(monkeypatch):
    stats = PipelineStats()
    result = run_ranks(
        monkeypatch,
        [
            lambda: list(pp.equal_steps(batches(0, [6, 6, 6]), stats=stats)),
            lambda: list(pp.equal_steps(batches(1, [6]))),
        ],
    )
    assert [len(b["rid"]) for b in result[1]] == [1, 2, 3]  # split to the other rank's 3 steps, rows in order
    assert [len(r) for r in result] == [3, 3] and stats.snapshot().skipped == {}
    result = run_ranks(
        monkeypatch,
        [
            lambda: list(pp.equal_steps(batches(0, [2] * 12), "repeat", stats=stats)),
            lambda: list(pp.equal_steps(batches(1, [2] * 2), "repeat")),
        ],
    )
    assert [len(r) for r in result] == [12, 12]
    assert [bool(b["is_repeat"]) for b in result[1]] == [False] * 2 + [True] * 10
    assert rids(result[1]) == list(range(1000, 1004))


def test_equal_steps_helper_repeats_from_memory_not_by_iterating_again(monkeypatch):
    """A DataLoader with persistent workers starts its next epoch on a second iter(): never re-iterate."""

    class OneShot:
        def __init__(self, items):
            self.items, self.passes = items, 0

        def __iter__(self):
            self.passes += 1
            return iter(self.items)

    short = OneShot(batches(1, [2] * 3))
    result = run_ranks(
        monkeypatch,
        [lambda: list(pp.equal_steps(batches(0, [2] * 20), "repeat")), lambda: list(pp.equal_steps(short, "repeat"))],
    )
    assert short.passes == 1
    assert [b["rid"][0].item() for b in result[1][3:6]] == [1000, 1002, 1004]


def test_split_batch_keeps_scalars_and_refuses_what_it_cannot_cut():
    halves = split_batch({"input_ids": torch.zeros(5, 3), "is_repeat": torch.tensor(False), "n": 2})
    assert [h["input_ids"].shape[0] for h in halves] == [2, 3]
    assert all(h["n"] == 2 and h["is_repeat"].dim() == 0 for h in halves)
    assert split_batch({"input_ids": torch.zeros(1, 3)}) is None
    assert split_batch({"input_ids": torch.zeros(4, 3), "cu_seq_lens_q": torch.tensor([0, 3, 9])}) is None
    assert split_batch(["not", "a", "dict"]) is None


def test_split_batch_cuts_a_packed_batch_with_its_flash_attention_kwargs():
    pipe = pp.read_jsonl(pp.examples.SAMPLE_JSONL).tokenize(pp.examples.tokenizer()).pack(128, batch_size=5)
    batch = next(iter(pipe.loader()))
    halves = split_batch(batch)
    assert [h["input_ids"].shape[0] for h in halves] == [2, 3]
    for half in halves:
        flat = half["seq_idx"].flatten()
        starts = [0] + (torch.nonzero(flat[1:] != flat[:-1]).flatten() + 1).tolist() + [len(flat)]
        assert flat[0] == 0 and half["cu_seq_lens_q"].tolist() == starts
        assert half["cu_seq_lens_k"] is half["cu_seq_lens_q"] and half["cu_seq_lens_q"].dtype == torch.int32
        assert half["max_length_q"] == half["max_length_k"] == max(b - a for a, b in zip(starts, starts[1:]))
    assert torch.equal(torch.cat([h["input_ids"] for h in halves]), batch["input_ids"])


def test_loader_wraps_the_pipeline_in_equal_steps():
    pipe = pp.from_iterable([{"text": "a b"}, {"text": "c"}]).tokenize(pp.examples.tokenizer()).batch(1).pad()
    assert isinstance(pipe.loader().root, EqualSteps)
    assert not isinstance(pipe.loader(equal_steps="off").root, EqualSteps)
    batches_ = list(pipe.loader(equal_steps="repeat"))
    assert [bool(b["is_repeat"]) for b in batches_] == [False, False]
