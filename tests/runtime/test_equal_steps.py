"""EqualSteps and equal_steps(): the per-step protocol under each policy, with ranks simulated by threads.

The real collectives run under torchrun in tests/test_distributed.py and
tests/runtime/test_equal_steps_torchrun.py; here each rank is a thread of a fake group
(tests/runtime/fake_group.py) whose collectives meet the other threads at a barrier, so the ranks
really run in lockstep as they do under ``torch.distributed``.
"""

from __future__ import annotations

import collections
import logging
import pickle
import random

import pytest
import torch

import padpipe as pp
from padpipe.runtime.batch_cut import split_batch
from padpipe.runtime.equal_steps import EqualSteps
from padpipe.runtime.loss_tokens import label_tokens
from padpipe.stats import PipelineStats
from tests.contract import normalize
from tests.pipes.nodes import ListNode
from tests.runtime.fake_group import run_ranks


def batches(rank: int, sizes: list[int]) -> list[dict]:
    """Dict batches of the given row counts; row ids ``rank * 1000 + i`` are unique over ranks."""
    out, start = [], rank * 1000
    for n in sizes:
        rid = torch.arange(start, start + n)
        out.append({"rid": rid, "labels": rid.clone(), "text": [f"r{i}" for i in range(start, start + n)]})
        start += n
    return out


def rids(items: list[dict]) -> list[int]:
    """Row ids of the batches that train (repeats and fillers left out)."""
    return [
        r
        for b in items
        if not bool(b.get("is_repeat", False)) and not bool(b.get("is_filler", False))
        for r in b["rid"].tolist()
    ]


def epochs_of(node: EqualSteps, epochs: int) -> list[list[dict]]:
    out = []
    for _ in range(epochs):
        node.reset(None)
        out.append(list(node))
    return out


def run_policy(monkeypatch, sizes: list[list[int]], policy: str = "balance", epochs: int = 2):
    """Every rank's batches per epoch, and its stats, for ranks holding batches of ``sizes[rank]`` rows."""
    stats = [PipelineStats() for _ in sizes]
    nodes = [EqualSteps(ListNode(batches(r, s)), policy=policy, stats=stats[r]) for r, s in enumerate(sizes)]
    result = run_ranks(monkeypatch, [lambda r=r: epochs_of(nodes[r], epochs) for r in range(len(sizes))])
    return result, [s.snapshot() for s in stats]


def assert_fillers_only_where_rows_ran_short(result: list[list[list[dict]]], ranks: int) -> None:
    """Fillers come only in an epoch's last step, and only where that step had fewer real rows than ranks."""
    for epoch in range(len(result[0])):
        steps = [result[r][epoch] for r in range(ranks)]
        for k in range(len(steps[0])):
            fillers = [bool(s[k].get("is_filler", False)) for s in steps]
            if any(fillers):
                assert k == len(steps[0]) - 1, f"a filler at step {k}, not the last"
                assert sum(len(s[k]["rid"]) for s, f in zip(steps, fillers) if not f) < ranks


def every_row(sizes: list[list[int]]) -> collections.Counter:
    return collections.Counter(x for r, s in enumerate(sizes) for b in batches(r, s) for x in b["rid"].tolist())


@pytest.mark.parametrize(
    "sizes",
    [
        [[8] * 10, [8] * 6],
        [[8] * 9, [16] * 4, [4] * 12],
        [[8] * 12, [8] * 9, [8] * 10, [6] * 13],
        [[4] * 50, [4] * 5, [4] * 5],  # one rank far ahead: it hands batches over as it goes
        [[2] * 30, [2], [2], [2]],  # three ranks out at once: the one still reading reads further ahead
        [[8, 8], [8]],  # the tail: a split, then a move
    ],
)
def test_equal_steps_balances_every_row_once_by_moving_batches(monkeypatch, sizes):
    """Ranks many batches apart: every rank takes the same steps, every row comes out once, nothing is dropped."""
    result, stats = run_policy(monkeypatch, sizes)
    total = sum(len(s) for s in sizes)
    for epoch in range(2):
        steps = {len(result[r][epoch]) for r in range(len(sizes))}
        assert steps == {-(-total // len(sizes))}, "every rank takes the same steps: the batches over the ranks"
        got = collections.Counter(x for r in range(len(sizes)) for x in rids(result[r][epoch]))
        assert got == every_row(sizes)
    assert all(s.skipped == {} for s in stats), "nothing dropped"
    assert_fillers_only_where_rows_ran_short(result, len(sizes))
    moved = sum(s.counters.get("equal_steps.moved_batches", 0) for s in stats)
    assert moved > 0 or len({len(s) for s in sizes}) == 1


def test_equal_steps_keeps_full_batches_while_ranks_still_read(monkeypatch):
    """A rank out of batches gets whole batches from one that still reads; splits only in the last steps."""
    result, stats = run_policy(monkeypatch, [[8] * 40, [8] * 4], epochs=1)
    sizes = [[len(b["rid"]) for b in result[r][0]] for r in range(2)]
    assert sizes == [[8] * 22, [8] * 22]
    assert stats[1].counters == {"equal_steps.moved_batches": 18}
    assert "equal_steps.split_batches" not in stats[0].counters


@pytest.mark.parametrize("ranks", [2, 3, 4])
def test_equal_steps_balances_random_shares_exactly(monkeypatch, ranks):
    """Random batch counts and sizes: equal steps, every row once, fillers only where rows ran short of the ranks."""
    rng = random.Random(ranks)
    for _ in range(12):
        sizes = [[rng.randint(1, 5) for _ in range(rng.choice([0, 1, 2, 3, 7, 15]))] for _ in range(ranks)]
        if not any(sizes):
            continue
        result, stats = run_policy(monkeypatch, sizes, epochs=1)
        steps = {len(result[r][0]) for r in range(ranks)}
        assert len(steps) == 1, sizes
        got = collections.Counter(x for r in range(ranks) for x in rids(result[r][0]))
        assert got == every_row(sizes), sizes
        assert_fillers_only_where_rows_ran_short(result, ranks)
        assert all(s.skipped == {} for s in stats), sizes


@pytest.mark.parametrize("sizes", [[[1], []], [[1], [], []], [[1, 1, 1], [], []]])
def test_equal_steps_gives_a_filler_only_where_fewer_rows_are_left_than_ranks(monkeypatch, sizes):
    result, stats = run_policy(monkeypatch, sizes, epochs=1)
    rows = sum(map(sum, sizes))
    assert [len(r[0]) for r in result] == [1] * len(sizes)
    fillers = [b for r in result for b in r[0] if bool(b.get("is_filler", False))]
    assert len(fillers) == len(sizes) - rows
    for b in fillers:
        assert b["rid"].tolist() == [0] and label_tokens(b, causal=False) == 0  # a real row; it trains nothing
    assert sum(s.counters.get("equal_steps.filler_batches", 0) for s in stats) == len(fillers)
    assert all(s.skipped == {} for s in stats)


def test_equal_steps_drops_and_counts_only_batches_that_cannot_be_moved_or_filled(monkeypatch, caplog):
    """Batches that are no dicts move between ranks, but cannot make a filler: then what is left is dropped, counted."""
    moved = run_ranks(
        monkeypatch,
        [lambda items=items: list(EqualSteps(ListNode(items), policy="balance")) for items in (["a", "b"], [])],
    )
    assert moved == [["a"], ["b"]]
    stats = PipelineStats()
    with caplog.at_level(logging.WARNING, logger="padpipe.runtime.equal_steps"):
        dropped = run_ranks(
            monkeypatch,
            [lambda: list(EqualSteps(ListNode(["a"]), stats=stats)), lambda: list(EqualSteps(ListNode([])))],
        )
    assert dropped == [[], []]
    assert stats.snapshot().skipped == {"equal_steps.dropped_batches": 1}  # rows of no dict batch are not known
    assert "dropped its last 1 batch(es)" in caplog.text


def test_equal_steps_drop_stops_when_the_first_rank_runs_out_and_counts_the_rest(monkeypatch, caplog):
    with caplog.at_level(logging.WARNING, logger="padpipe.runtime.equal_steps"):
        result, stats = run_policy(monkeypatch, [[8] * 4, [8] * 2], policy="drop")
    for epoch in range(2):
        assert [len(result[r][epoch]) for r in range(2)] == [2, 2]
    assert stats[0].skipped == {"equal_steps.dropped_batches": 4, "equal_steps.dropped_rows": 32}  # 2 epochs
    assert stats[1].skipped == {}
    assert caplog.text.count("this rank dropped its last 2 batch(es) so that every rank stops at step 2") == 1


def test_equal_steps_repeats_the_first_batches_from_memory_until_the_last_rank_finishes(monkeypatch):
    reads = []

    class CountingNode(ListNode):
        def next(self):
            item = super().next()
            reads.append(int(item["rid"][0]))
            return item

    stats = [PipelineStats(), PipelineStats()]
    nodes = [
        EqualSteps(CountingNode(batches(0, [3, 3, 3])), policy="repeat", stats=stats[0]),
        EqualSteps(ListNode(batches(1, [3] * 7)), policy="repeat", stats=stats[1]),
    ]
    result = run_ranks(monkeypatch, [lambda r=r: epochs_of(nodes[r], 2) for r in range(2)])
    for epoch in range(2):
        assert [len(result[r][epoch]) for r in range(2)] == [7, 7]
        flags = [bool(b["is_repeat"]) for b in result[0][epoch]]
        assert flags == [False] * 3 + [True] * 4
        assert [b["rid"][0].item() for b in result[0][epoch][3:]] == [0, 3, 6, 0]  # its first batches, in turn
        assert rids(result[1][epoch]) == list(range(1000, 1021))
    assert reads == [0, 3, 6] * 2, "each batch read once an epoch: repeats come from memory"
    assert stats[0].snapshot().counters == {"equal_steps.repeated_batches": 8}
    assert stats[0].snapshot().skipped == stats[1].snapshot().skipped == {}, "repeats are not drops"


def test_equal_steps_repeat_gives_a_rank_with_no_batch_a_copy_to_replay(monkeypatch):
    result, stats = run_policy(monkeypatch, [[3, 3, 3], []], policy="repeat", epochs=1)
    assert [len(r[0]) for r in result] == [3, 3]
    assert all(bool(b["is_repeat"]) for b in result[1][0])
    assert [b["rid"].tolist() for b in result[1][0]] == [[0, 1, 2]] * 3
    assert stats[0].skipped == stats[1].skipped == {}


def test_equal_steps_passes_items_through_without_distributed():
    assert torch.distributed.is_initialized() is False
    node = EqualSteps(ListNode(["a", "b"]))
    node.reset()
    assert list(node) == ["a", "b"]
    node = EqualSteps(ListNode(batches(0, [1, 1])), policy="repeat")
    node.reset()
    assert [bool(b["is_repeat"]) for b in node] == [False, False]


def test_equal_steps_raises_error_when_policy_is_unknown():
    with pytest.raises(
        ValueError, match=r"^`policy` must be one of \('balance', 'repeat', 'drop', 'off'\), but is 'all' instead\.$"
    ):
        EqualSteps(ListNode([1]), policy="all")
    with pytest.raises(ValueError, match=r"^`policy` must be one of .*, but is 'x' instead\.$"):
        pp.equal_steps([1], policy="x")
    with pytest.raises(ValueError, match=r"^`equal_steps` must be one of .*, but is 'x' instead\.$"):
        pp.from_iterable([{"text": "a"}]).loader(equal_steps="x")


def test_equal_steps_raises_error_when_state_has_another_policy():
    node = EqualSteps(ListNode([1]), policy="balance")
    node.reset()
    with pytest.raises(
        pp.StateMismatchError, match=r"^EqualSteps state .*setting 'policy' found 'balance' instead of 'repeat'\.$"
    ):
        EqualSteps(ListNode([1]), policy="repeat").reset(node.state_dict())


@pytest.mark.parametrize(
    ("policy", "sizes"),
    [
        ("balance", [[4, 4, 4, 4, 4, 4], [4, 4]]),
        ("balance", [[4, 4], [4, 4, 4, 4, 4]]),
        ("balance", [[1], []]),
        ("repeat", [[2, 2], [2, 2, 2, 2, 2]]),
        ("repeat", [[], [2, 2, 2]]),
        ("drop", [[4, 4, 4], [4]]),
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
    assert [len(r) for r in result] == [2, 2] and stats.snapshot().skipped == {}
    assert collections.Counter(rids(result[0]) + rids(result[1])) == every_row([[6, 6, 6], [6]])
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
