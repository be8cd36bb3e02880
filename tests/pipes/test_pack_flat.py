"""``pack(layout="flat")``: each batch one row of ``batch_size * seq_len`` tokens, as varlen kernels read it.

The batch is checked against the contracts of the kernels that read it (their sources, read for
this: flash-linear-attention 0.6.0 ``fla/ops/gated_delta_rule/chunk.py`` and ``fla/ops/kda/chunk.py``:
``cu_seqlens`` ``[N + 1]`` from 0 to the row's tokens, a batch of one row, int32 as FLA's own
``prepare_cu_seqlens_from_mask`` makes them; causal-conv1d ``csrc/causal_conv1d.cpp``: ``seq_idx``
int32, contiguous, ``[batch, seqlen]``; mamba-ssm ``ops/triton/ssd_combined.py``: ``seq_idx``
``[batch, seqlen]``, compared for equality between tokens), and every promise of ``pack()`` is
tried: every token once in the same token budget, exact resume, equal steps over ranks, workers.
"""

from __future__ import annotations

import collections
from typing import Any

import numpy as np
import pytest
import torch

import padpipe as pp
from padpipe.chunks import TokenChunk
from padpipe.pipes.pack import Packer
from padpipe.runtime.equal_steps import EqualSteps
from padpipe.state import StateMismatchError
from padpipe.stats import PipelineStats
from tests.contract import check_loader_resume, check_node_resume
from tests.pipes.nodes import ListNode
from tests.pipes.test_pack import PAD, ToyDocs, make_docs
from tests.runtime.fake_group import run_ranks
from tests.runtime.test_row_pieces import trained


def assert_varlen_contract(batch: dict, *, seq_len: int, batch_size: int) -> list[list[int]]:
    """``batch`` is one row of ``batch_size * seq_len`` tokens as FLA, causal-conv1d and mamba-ssm read it.

    Returns the ids of each document piece, in order.
    """
    ids, positions, labels, seq_idx = (batch[k] for k in ("input_ids", "position_ids", "labels", "seq_idx"))
    n = ids.shape[1]  # batch_size * seq_len; the epoch's last batch: the rows it needs
    assert ids.shape == positions.shape == labels.shape == seq_idx.shape == (1, n)  # a batch of one row
    assert n % seq_len == 0 and n <= batch_size * seq_len
    assert ids.dtype == positions.dtype == labels.dtype == torch.int64
    assert seq_idx.dtype == torch.int32 and seq_idx.is_contiguous()
    cu = batch["cu_seq_lens_q"]
    assert batch["cu_seq_lens_k"] is cu and cu.dtype == torch.int32 and cu.dim() == 1 and cu.is_contiguous()
    bounds = cu.tolist()
    assert bounds[0] == 0 and bounds[-1] == n and all(b > a for a, b in zip(bounds, bounds[1:]))
    lengths = [b - a for a, b in zip(bounds, bounds[1:])]
    assert batch["max_length_q"] == batch["max_length_k"] == max(lengths)
    assert seq_idx[0].tolist() == [s for s, length in enumerate(lengths) for _ in range(length)]
    assert positions[0].tolist() == [p for length in lengths for p in range(length)]
    assert all(labels[0, a] == -100 for a in bounds[:-1])  # no label predicted across a boundary
    assert batch["use_cache"] is False
    pieces = [ids[0, a:b].tolist() for a, b in zip(bounds, bounds[1:])]
    if pieces[-1][0] == PAD:  # the padding: one run, at the batch's end only
        assert all(t == PAD for t in pieces[-1]) and all(t != PAD for p in pieces[:-1] for t in p)
        pieces = pieces[:-1]
    assert all(len(p) <= seq_len for p in pieces)
    return pieces


def run(docs: list[list[int]], **options: Any) -> list[dict]:
    return list(Packer(ToyDocs(docs), pad_id=PAD, **options))


LENGTHS = [3, 1, 9, 2, 5, 4, 1, 7, 2, 3, 6, 1, 8, 8, 2, 5]


def test_pack_flat_works() -> None:
    (batch,) = run(make_docs([3, 2, 4, 1]), seq_len=5, batch_size=2, buffer_size=8, layout="flat")
    assert batch["input_ids"].tolist() == [[6, 7, 8, 9, 1, 2, 3, 4, 5, 10]]  # longest first, no padding between
    assert batch["position_ids"].tolist() == [[0, 1, 2, 3, 0, 1, 2, 0, 1, 0]]
    assert batch["seq_idx"].tolist() == [[0, 0, 0, 0, 1, 1, 1, 2, 2, 3]]
    assert batch["labels"].tolist() == [[-100, 7, 8, 9, -100, 2, 3, -100, 5, -100]]
    assert batch["cu_seq_lens_q"].tolist() == [0, 4, 7, 9, 10] and batch["max_length_q"] == 4


@pytest.mark.parametrize(("seq_len", "batch_size", "buffer_size"), [(8, 2, 4), (6, 3, 16), (16, 1, 8), (9, 4, 2)])
def test_pack_flat_meets_the_kernels_contract_and_keeps_every_token_once(seq_len, batch_size, buffer_size) -> None:
    docs = make_docs(LENGTHS)
    flat = run(docs, seq_len=seq_len, batch_size=batch_size, buffer_size=buffer_size, layout="flat")
    rows = run(docs, seq_len=seq_len, batch_size=batch_size, buffer_size=buffer_size)
    pieces = [p for b in flat for p in assert_varlen_contract(b, seq_len=seq_len, batch_size=batch_size)]
    assert all(b["input_ids"].shape == (1, batch_size * seq_len) for b in flat[:-1])  # the same budget a batch
    predicted = sorted(t for b in flat for t in b["labels"].flatten().tolist() if t != -100)
    assert predicted == sorted(t for d in docs for t in d[1:])  # every prediction once (a cut token: context again)
    step = seq_len - 1  # a split document's later pieces start with the token before the cut (long_docs split)
    cut = [p for d in docs for p in [d[:seq_len]] + [d[i - 1 : i - 1 + seq_len] for i in range(seq_len, len(d), step)]]
    assert sorted(map(tuple, pieces)) == sorted(map(tuple, cut))  # the same pieces as the rows layout packs
    assert len(flat) <= len(rows)  # the same token budget a batch, never more batches


def test_pack_flat_fills_at_least_as_well_as_rows_and_counts_its_tokens() -> None:
    rng = np.random.default_rng(0)
    docs = make_docs(np.clip(rng.lognormal(4, 1, 600).astype(int), 1, 300).tolist())
    efficiency = {}
    for layout in ("rows", "flat"):
        stats = PipelineStats()
        batches = list(Packer(ToyDocs(docs, chunk_rows=64), seq_len=256, batch_size=4, pad_id=PAD, layout=layout,
                              stats=stats))  # fmt: skip
        snap = stats.snapshot()
        assert snap.padded_tokens == sum(b["input_ids"].numel() for b in batches)
        assert snap.real_tokens == sum(map(len, docs)) + snap.counters["pack.context_tokens"]
        assert snap.batches == len(batches)
        efficiency[layout] = snap.padding_efficiency
    assert efficiency["flat"] >= efficiency["rows"] > 0.98


@pytest.mark.parametrize(
    "options",
    [
        dict(seq_len=6, batch_size=2, buffer_size=3),
        dict(seq_len=5, batch_size=3, buffer_size=2, long_docs="split", keep_tail=False),
        dict(seq_len=4, batch_size=2, buffer_size=5, long_docs="truncate", position_offset=1),
    ],
)
def test_pack_flat_saves_and_restores_its_state(options: dict) -> None:
    docs = make_docs([3, 1, 9, 2, 5, 4, 1, 7, 2, 3, 6, 1])
    items = check_node_resume(lambda: Packer(ToyDocs(docs, chunk_rows=4), pad_id=PAD, layout="flat", **options))
    assert items[0] != items[1]


def test_pack_flat_saves_and_restores_its_state_through_a_loader() -> None:
    words = "the cat sat on a mat while dogs ran far away from home".split()
    texts = [{"text": " ".join(words[i % 7 : i % 7 + 1 + (i * 5) % 13])} for i in range(40)]
    pipe = pp.from_iterable(texts, chunk_rows=8).tokenize(pp.examples.tokenizer(), num_threads=1)
    check_loader_resume(lambda: pipe.pack(12, batch_size=2, buffer_size=5, layout="flat").loader(), epochs=2)


def test_pack_flat_refuses_a_rows_state_and_block_mask() -> None:
    state = Packer(ToyDocs(make_docs([3, 4])), seq_len=8, batch_size=2, pad_id=PAD).state_dict()
    flat = Packer(ToyDocs(make_docs([3, 4])), seq_len=8, batch_size=2, pad_id=PAD, layout="flat")
    with pytest.raises(StateMismatchError, match=r"setting 'seq_len' found 8 instead of 16\.$"):
        flat.reset(state)
    tokens = pp.from_iterable([{"input_ids": [1, 2]}]).tokens(pad_id=0)
    with pytest.raises(ValueError, match=r"^`block_mask` must be False with layout='flat' \(a mask over the whole"):
        tokens.pack(8, layout="flat", block_mask=True)
    with pytest.raises(ValueError, match=r"^`layout` must be one of \('rows', 'flat'\), but is 'one' instead\.$"):
        tokens.pack(8, layout="one")


def test_pack_flat_refuses_a_masked_row_longer_than_seq_len() -> None:
    rows = [{"input_ids": list(range(1, 7)), "labels": [-100, 2, 3, 4, 5, 6]}, {"input_ids": [7, 8], "labels": [7, 8]}]
    pipe = pp.from_iterable(rows).tokens(pad_id=0)
    with pytest.raises(pp.DataError, match=r"has 6 tokens with token-level labels; expected at most seq_len=4"):
        next(iter(pipe.pack(4, batch_size=4, layout="flat").loader()))  # 16 tokens a batch: seq_len still bounds it


def test_pack_flat_batches_give_every_rank_equal_steps_and_every_token_once(monkeypatch) -> None:
    """Ranks with uneven shares of one-row flat batches: the epoch's last steps cut a row between documents."""
    shares = [make_docs(LENGTHS[:n], start=1000 * (r + 1)) for r, n in enumerate((3, 7, 16))]
    data = [run(docs, seq_len=8, batch_size=2, buffer_size=4, layout="flat") for docs in shares]
    assert [len(batches) for batches in data] == [1, 2, 5]  # 8 batches for 3 ranks: the last steps cut rows
    stats = [PipelineStats() for _ in shares]
    nodes = [EqualSteps(ListNode(batches), stats=stats[r]) for r, batches in enumerate(data)]

    def epoch(node: EqualSteps) -> list[dict]:
        node.reset(None)
        return list(node)

    result = run_ranks(monkeypatch, [lambda r=r: epoch(nodes[r]) for r in range(len(shares))])
    assert len({len(mine) for mine in result}) == 1  # equal steps
    assert not any("is_filler" in b for mine in result for b in mine)
    assert all(b["input_ids"].shape[0] == 1 and b["use_cache"] is False for mine in result for b in mine)
    assert sum((trained(b) for mine in result for b in mine), collections.Counter()) == sum(
        (trained(b) for mine in data for b in mine), collections.Counter()
    )  # every prediction once
    assert sum(s.snapshot().counters.get("equal_steps.split_batches", 0) for s in stats) > 0


def test_pack_flat_from_worker_processes_equals_the_main_process() -> None:
    words = "the cat sat on a mat while dogs ran far away from home".split()
    texts = [{"text": " ".join(words[i % 7 : i % 7 + 1 + (i * 5) % 13])} for i in range(60)]
    pipe = pp.from_iterable(texts, chunk_rows=8).tokenize(pp.examples.tokenizer(), num_threads=1)
    pipe = pipe.pack(12, batch_size=3, buffer_size=8, layout="flat")
    alone = list(pipe.loader())
    workers = list(pipe.loader(num_workers=2))
    real = collections.Counter  # each worker packs its own share: the padding differs, the tokens do not
    assert real(t for b in workers for t in b["input_ids"][0].tolist() if t != PAD) == real(
        t for b in alone for t in b["input_ids"][0].tolist() if t != PAD
    )
    assert all(b["input_ids"].shape[1] in (12, 24, 36) for b in workers)  # each worker's last: its rows only
    for batch in workers:
        assert_varlen_contract(batch, seq_len=12, batch_size=3)


def test_pack_flat_pads_only_the_end_of_the_batch() -> None:
    chunk = TokenChunk.from_lists([[5, 6, 7], [8, 9]])
    (batch,) = list(Packer(ListNode([chunk]), seq_len=4, batch_size=3, pad_id=0, layout="flat"))
    assert batch["input_ids"].tolist() == [[5, 6, 7, 8, 9, 0, 0, 0]]  # the epoch's last: 2 rows' worth, not 3
    assert batch["labels"].tolist() == [[-100, 6, 7, -100, 9, -100, -100, -100]]
