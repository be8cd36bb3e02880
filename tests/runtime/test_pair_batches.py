"""Preference batches through the runtime: a pair is never split from its other member.

Equal steps' splits and fillers, elastic resume's splits, gradient accumulation's counts (``num_items_in_batch``
counts pairs) and the batches a state holds, on padded (TRL's layout: chosen rows, then rejected rows) and packed
preference batches. Two real ranks with workers run in tests/runtime/test_preference_torchrun.py.
"""

from __future__ import annotations

import collections
import json
import pickle
from typing import Any

import pytest
import torch

import padpipe as pp
from padpipe import Consumer
from padpipe.batch_spec import HeldBatch
from padpipe.runtime.batch_cut import merge_batches, split_batch
from padpipe.runtime.elastic import even_out
from padpipe.runtime.equal_steps import EqualSteps
from padpipe.runtime.loss_tokens import label_tokens
from padpipe.runtime.rebalance import filler
from padpipe.stats import PipelineStats
from tests import chat_fixtures as fx
from tests.pipes.nodes import ListNode
from tests.runtime.fake_group import run_ranks

transformers = pytest.importorskip("transformers")


def pairs(n: int) -> list[dict[str, Any]]:
    chats = fx.conversations(n + 1, seed=5, turns=(1, 2))
    return [
        {"prompt": c[:-1], "chosen": c[-1:], "rejected": d[-1:], "id": i}
        for i, (c, d) in enumerate(zip(chats, chats[1:]))
    ]  # noqa: E501


def padded(n: int, per_batch: int) -> list[dict[str, Any]]:
    return list(pp.from_iterable(pairs(n)).preference(fx.tokenizer()).batch(per_batch).pad().loader())


def members(batch: dict[str, Any]) -> list[tuple[int, bool, tuple[int, ...]]]:
    """Each row's ``(pair id, chosen, ids)`` of a padded batch, checked to be chosen rows then their rejected rows."""
    half = len(batch["chosen"]) // 2
    assert batch["chosen"].tolist() == [True] * half + [False] * half
    assert batch["id"][:half].tolist() == batch["id"][half:].tolist(), "a pair's members sit at k and half + k"
    rows = zip(batch["id"].tolist(), batch["chosen"].tolist(), batch["input_ids"], batch["attention_mask"])
    return [(i, c, tuple(ids[m.bool()].tolist())) for i, c, ids, m in rows]


def test_split_batch_keeps_each_pair_whole_in_trls_layout():
    batch = padded(7, 7)[0]
    first, second = split_batch(batch)
    assert members(first) + members(second) and sorted(members(first) + members(second)) == sorted(members(batch))
    assert first["id"].tolist() == [0, 1, 2] * 2 and second["id"].tolist() == [3, 4, 5, 6] * 2
    assert split_batch(split_batch(first)[0]) is None, "one pair (two rows) is not cut"
    assert merge_batches(first, second) is None, "two batches would not stay in TRL's layout"
    one = filler(batch)
    assert members(one) and len(one["chosen"]) == 2 and bool(one["is_filler"])


def test_even_out_splits_padded_pairs_by_pairs():
    batches = padded(9, 3)  # 3 batches of 3 pairs, for 2 ranks
    out = even_out(batches, 4)
    assert len(out) == 4
    assert sorted(m for b in out for m in members(b)) == sorted(m for b in batches for m in members(b))


@pytest.mark.parametrize("layout", ["pad", "pack"])
def test_equal_steps_moves_and_splits_pairs_whole_every_pair_once(monkeypatch, layout):
    """Two ranks holding unequal shares: each step's batches keep every pair's members together, every pair once."""
    rows, tok = pairs(23), fx.tokenizer()
    pipe = pp.from_iterable(rows).preference(tok)
    pipe = pipe.batch(3).pad() if layout == "pad" else pipe.pack(1024, batch_size=1, keep=("id",))
    shares = [list(pipe.loader(consumer=Consumer(rank=r, world_size=2), equal_steps="off")) for r in range(2)]
    shares[1] = shares[1][: len(shares[1]) // 2]  # rank 1 holds fewer: rank 0's batches move and split
    nodes = [EqualSteps(ListNode(share), policy="balance", stats=PipelineStats()) for share in shares]
    result = run_ranks(monkeypatch, [lambda r=r: list(iter_reset(nodes[r])) for r in range(2)])
    assert len(result[0]) == len(result[1])
    seen: collections.Counter = collections.Counter()
    for batch in (b for rank in result for b in rank if not bool(b.get("is_filler", False))):
        if layout == "pad":
            seen.update(i for i, chosen, _ in members(batch) if chosen)
        else:
            seen.update(i for row in batch["id"] for i in row)
            assert label_tokens(batch) == sum(len(row) for row in batch["id"])
    expected = collections.Counter(i for share in shares for b in share for i in pair_ids(b))
    assert seen == expected


def iter_reset(node: EqualSteps) -> Any:
    node.reset(None)
    return node


def pair_ids(batch: dict[str, Any]) -> list[int]:
    if isinstance(batch["id"], list):
        return [i for row in batch["id"] for i in row]
    return batch["id"][batch["chosen"]].tolist()


def test_num_items_in_batch_counts_pairs(tmp_path):
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in pairs(20)))
    pipe = pp.read_jsonl(str(path)).preference(fx.tokenizer(), max_length=256)
    for layout in (pipe.batch(3).pad(), pipe.pack(512, batch_size=2)):
        batches = list(layout.loader(accumulation_steps=2))
        windows = [batches[k : k + 2] for k in range(0, len(batches), 2)]
        for window in windows:
            assert {int(b["num_items_in_batch"]) for b in window} == {sum(map(pairs_of, window))}
        assert sum(map(pairs_of, batches)) == sum(map(label_tokens, batches)) == 20
    assert label_tokens({**batches[0], "is_filler": torch.tensor(True)}) == 0


def pairs_of(batch: dict[str, Any]) -> int:
    """The pairs of a batch, counted from its layout: chosen rows, or sequences starting on a chosen token."""
    if batch["chosen"].dim() == 1:
        return int(batch["chosen"].sum())
    return sum(bool(batch["chosen"].reshape(-1)[a]) for a in batch["cu_seq_lens_q"][:-1].tolist())


def test_a_state_holds_preference_batches():
    batch = padded(4, 4)[0]
    assert HeldBatch(labelled=True).load(batch) is batch
    bad = {**batch, "completion_mask": batch["completion_mask"][:, :-1]}
    with pytest.raises(Exception, match="completion_mask"):
        HeldBatch(labelled=True).load(bad)
    state = pickle.loads(pickle.dumps(batch))
    assert torch.equal(state["input_ids"], batch["input_ids"])


@pytest.mark.parametrize("layout", ["pad", "pack"])
def test_elastic_resume_at_another_world_size_reads_every_pair_once(tmp_path, layout):
    rows = pairs(45)
    for part in range(3):
        (tmp_path / f"part{part}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[part::3]))
    pipe = pp.read_jsonl(str(tmp_path / "*.jsonl")).shuffle(8, seed=1).preference(fx.tokenizer(), max_length=256)
    pipe = pipe.batch(3).pad() if layout == "pad" else pipe.pack(512, batch_size=1, keep=("id",))
    states, seen = [], collections.Counter()
    for rank in range(2):  # two ranks take two batches each and save
        old = pipe.loader(consumer=Consumer(rank=rank, world_size=2))
        it = iter(old)
        for _ in range(2):
            seen.update(pair_ids(next(it)))
        states.append(pickle.loads(pickle.dumps(old.state_dict())))
    for rank in range(3):  # three ranks go on from both states
        new = pipe.loader(consumer=Consumer(rank=rank, world_size=3))
        new.load_state_dict(states)
        for batch in new:
            if layout == "pad":
                members(batch)  # each pair whole, in TRL's layout
            seen.update(pair_ids(batch))
    assert seen == collections.Counter(r["id"] for r in rows)
