"""A packed row cut in two real pieces: every prediction once, documents' positions and labels exact, no filler.

The pieces are checked as a causal LM trains them (HF's shift: the label at token ``j`` is the
prediction of it from token ``j - 1`` of the same row), counted as ``(document, position, label)``
triples: the pieces of a row train exactly the row's triples, and equal steps over ranks holding
one-row packed batches gives every rank real pieces where there are enough of them.
"""

from __future__ import annotations

import collections

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import padpipe as pp
from padpipe.runtime.equal_steps import EqualSteps
from padpipe.runtime.rebalance import documents, tail_plan
from padpipe.runtime.row_pieces import code, cut_row, describe, halve
from padpipe.stats import PipelineStats
from tests.pipes.nodes import ListNode
from tests.runtime.fake_group import run_ranks

PAD = 0


def packed_row(docs: list[tuple[int, bool]], pad: int, first_id: int = 1, keep: bool = False) -> dict:
    """One packed row of documents ``(length, pretraining)`` and ``pad`` padding tokens, ids unique over the row.

    A pretraining document's labels are its ids; a conversation's mask every other token. With ``keep``, the
    kept column ``idx`` (as ``pack(keep=("idx",))`` gives it) holds each document's first id.
    """
    ids, labels, positions, seq, bounds, nxt = [], [], [], [], [0], first_id
    firsts = []
    for k, (length, pretraining) in enumerate(docs):
        own = list(range(nxt, nxt + length))
        firsts.append(nxt)
        nxt += length
        ids += own
        labels += [-100] + [t if pretraining or j % 2 else -100 for j, t in enumerate(own[1:], 1)]
        positions += list(range(length))
        seq += [k] * length
        bounds.append(bounds[-1] + length)
    if pad:
        ids += [PAD] * pad
        labels += [-100] * pad
        positions += list(range(pad))
        seq += [len(docs)] * pad
        bounds.append(bounds[-1] + pad)
    bounds_t = torch.tensor(bounds, dtype=torch.int32)
    lengths = [b - a for a, b in zip(bounds, bounds[1:])]
    row = {
        "input_ids": torch.tensor([ids]),
        "position_ids": torch.tensor([positions]),
        "labels": torch.tensor([labels]),
        "seq_idx": torch.tensor([seq], dtype=torch.int32),
        "cu_seq_lens_q": bounds_t,
        "cu_seq_lens_k": bounds_t,
        "max_length_q": max(lengths),
        "max_length_k": max(lengths),
    }
    return {**row, "idx": [firsts]} if keep else row


def owners(batch: dict) -> dict[int, int]:
    """Each token id of a row built with ``keep``: the ``idx`` of its document (ids are unique over the rows)."""
    out = {}
    for r, kept in enumerate(batch["idx"]):
        edges = [b - r * batch["input_ids"].shape[1] for b in batch["cu_seq_lens_q"].tolist()]
        segments = [(a, b) for a, b in zip(edges, edges[1:]) if 0 <= a and b <= batch["input_ids"].shape[1]]
        for value, (a, b) in zip(kept, segments):
            out.update(dict.fromkeys(batch["input_ids"][r, a:b].tolist(), value))
    return out


def check_kept(batch: dict, owner: dict[int, int]) -> None:
    """A one-row batch's ``idx`` is one value per segment but the padding (of ``PAD``, no document's id; a piece has
    none): that of the document the segment's tokens are from."""
    edges = batch["cu_seq_lens_q"].tolist()
    ids = batch["input_ids"][0].tolist()
    documents = list(zip(edges, edges[1:]))[: len(edges) - 1 - (ids[-1] == PAD)]
    assert batch["idx"] == [[owner[ids[a]] for a, _ in documents]]
    assert all({owner[t] for t in ids[a:b]} == {owner[ids[a]]} for a, b in documents)


def trained(batch: dict) -> collections.Counter:
    """The ``(context token, position, label)`` a causal LM trains on: each label with the token before it."""
    ids, labels, pos = batch["input_ids"][0].tolist(), batch["labels"][0].tolist(), batch["position_ids"][0].tolist()
    return collections.Counter((ids[j - 1], pos[j], labels[j]) for j in range(1, len(ids)) if labels[j] != -100)


def check_piece(piece: dict, row: dict) -> None:
    """A piece is a well-formed packed row of at most the row's tokens, its segments its own."""
    width = piece["input_ids"].shape[1]
    assert 0 < width <= row["input_ids"].shape[1]
    assert all(piece[k].shape == piece["input_ids"].shape for k in ("labels", "position_ids", "seq_idx"))
    bounds = piece["cu_seq_lens_q"].tolist()
    assert bounds[0] == 0 and bounds[-1] == width and piece["cu_seq_lens_q"].dtype == row["cu_seq_lens_q"].dtype
    assert piece["max_length_q"] == max(b - a for a, b in zip(bounds, bounds[1:]))
    assert all(piece["labels"][0, s] == -100 for s in bounds[:-1])  # a segment's first label predicts nothing
    seq = piece["seq_idx"][0].tolist()
    assert seq == [k for k, (a, b) in enumerate(zip(bounds, bounds[1:])) for _ in range(b - a)]


docs_strategy = st.lists(st.tuples(st.integers(1, 12), st.booleans()), min_size=1, max_size=6)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(docs=docs_strategy, pad=st.integers(0, 5))
def test_a_cut_row_trains_every_prediction_once_and_follows_its_plan(docs, pad):
    row = packed_row(docs, pad)
    described = describe(row)
    assert described is not None
    plan = halve(described[0])
    pieces = cut_row(row)
    assert (pieces is None) == (plan is None)
    if pieces is None:
        return
    for piece in pieces:
        check_piece(piece, row)
    assert (describe(pieces[0]), describe(pieces[1])) == ((plan.left,), (plan.right,))
    assert trained(pieces[0]) + trained(pieces[1]) == trained(row)
    assert all(trained(p) for p in pieces), "each piece trains something"
    if plan.cuts_a_document:
        assert sum(1 for d in described[0] if d // 2) == 1, "a document is cut only where regrouping cannot do"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(docs=docs_strategy, pad=st.integers(0, 5))
def test_a_cut_row_gives_each_piece_the_kept_ids_of_its_documents(docs, pad):
    """``pack(keep=...)``: the pieces are those of the row without the column; each piece carries the ids of the
    documents it holds, a cut document's on both, and every document's id is on a piece (one with no label too)."""
    row, plain = packed_row(docs, pad, keep=True), packed_row(docs, pad)
    pieces, without = cut_row(row), cut_row(plain)
    assert (pieces is None) == (without is None)
    if pieces is None:
        return
    plan = halve(describe(row)[0])
    assert (describe(pieces[0]), describe(pieces[1])) == ((plan.left,), (plan.right,))
    assert trained(pieces[0]) + trained(pieces[1]) == trained(row)
    for piece, alone in zip(pieces, without):
        check_piece(piece, row)
        check_kept(piece, owners(row))
        width = alone["input_ids"].shape[1]  # without the column a piece may leave documents with no label out
        assert torch.equal(piece["input_ids"][:, :width], alone["input_ids"])
    ids = pieces[0]["idx"][0] + pieces[1]["idx"][0]
    assert sorted(set(ids)) == row["idx"][0]
    assert len(ids) == len(docs) + plan.cuts_a_document, "a cut document's id on both pieces, every other once"


def test_kept_columns_that_do_not_count_the_documents_are_not_cut():
    row = packed_row([(4, True), (3, True)], 2, keep=True)
    assert describe(row) == ((code(3, True), code(2, True)),)
    assert describe({**row, "idx": [[1]]}) is None  # fewer values than documents
    assert describe({**row, "idx": [[1, 2, 3, 4]]}) is None  # more than the segments
    assert describe({**packed_row([(4, True), (3, True)], 0), "idx": [[1]]}) is None  # "padding" with labels
    assert describe({**row, "idx": [1, 2]}) is None  # not a list per row
    assert describe({**row, "doc": [["a"]]}) is None  # two kept columns that count differently


@settings(max_examples=200, deadline=None)
@given(docs=docs_strategy)
def test_a_conversation_is_never_cut(docs):
    row = packed_row([(n, False) for n, _ in docs], 0)
    pieces = cut_row(row)
    if pieces is None:
        return
    whole = {tuple(row["input_ids"][0, a:b].tolist()) for a, b in zip(row["cu_seq_lens_q"], row["cu_seq_lens_q"][1:])}
    for piece in pieces:
        edges = piece["cu_seq_lens_q"].tolist()
        assert {tuple(piece["input_ids"][0, a:b].tolist()) for a, b in zip(edges, edges[1:])} <= whole


def test_halve_regroups_before_it_cuts_and_never_cuts_a_conversation():
    assert halve((code(3, True), code(3, True))).take == 0
    assert halve((code(6, True),)).take == 3
    assert halve((code(6, False),)) is None
    assert halve((code(0, True), code(1, True))) is None  # one label token: nothing to share
    assert halve((code(0, False), code(4, True), code(0, False))).left == (code(0, False), code(2, True))


def test_describe_refuses_what_is_not_a_packed_row():
    row = packed_row([(4, True), (3, True)], 2)
    assert describe({**row, "attention_mask": torch.ones(1, 9)}) is None  # a key it cannot cut
    assert describe({**row, "input_ids": torch.cat([row["input_ids"]] * 2)}) is None  # two rows
    starts = row["labels"].clone()
    starts[0, 4] = 7
    assert describe({**row, "labels": starts}) is None  # a segment whose first label predicts across documents
    assert describe({**row, "cu_seq_lens_q": torch.tensor([0, 4, 8])}) is None  # bounds short of the row


@pytest.mark.parametrize(
    ("docs", "ranks", "fillers"),
    [
        ([[(5, True), (4, True)], [(3, True)], [(6, True), (2, False)], [(7, True)]], 3, 0),  # 4 rows, 3 ranks
        ([[(9, True)], [], []], 3, 0),  # one document for three ranks: cut twice
        ([[(9, False)], [], []], 3, 2),  # one conversation: never cut, two fillers
        ([[(2, True), (2, False)], []], 2, 0),
    ],
)
def test_tail_plan_cuts_rows_before_it_makes_a_filler(docs, ranks, fillers):
    rows = [[packed_row(d, 1)] if d else [] for d in docs]  # the last of 4 rows is a rank's second
    rows = rows[: ranks - 1] + [sum(rows[ranks - 1 :], [])]
    held = [[1 for _ in mine] for mine in rows]
    plan = tail_plan(held, [[documents(b) for b in mine] for mine in rows])
    assert sum(m.filler for m in plan.moves) == fillers


def one_row_batches(rank: int, lengths: list[list[tuple[int, bool]]], keep: bool = False) -> list[dict]:
    return [packed_row(docs, 2, first_id=rank * 100_000 + k * 1000 + 1, keep=keep) for k, docs in enumerate(lengths)]


@pytest.mark.parametrize(
    "shares",
    [
        # pack(..., batch_size=1): 4 one-row batches for 3 ranks, and 3 for 2 (the tails)
        [[[(30, True), (20, True)], [(40, True)]], [[(25, True), (25, True)]], [[(50, True)]]],
        [[[(30, True), (20, True)], [(40, True)]], [[(25, False), (9, False), (3, False)]]],
        [[[(64, True)]], [], []],  # a long document's last row: cut for the ranks with none
        [[[(12, False), (8, False), (20, False)]], [], []],  # chats: regrouped, never cut
    ],
)
@pytest.mark.parametrize("keep", [False, True])
def test_equal_steps_gives_every_rank_real_pieces_of_one_row_batches(monkeypatch, shares, keep):
    """No filler where the pieces suffice; every rank's labels distinct; the trained tokens are the rows' own, once;
    with a kept column, each piece carries the ids of its documents."""
    ranks = len(shares)
    stats = [PipelineStats() for _ in range(ranks)]
    data = [one_row_batches(r, s, keep) for r, s in enumerate(shares)]
    nodes = [EqualSteps(ListNode(data[r]), stats=stats[r]) for r in range(ranks)]

    def epoch(node):
        node.reset(None)
        return list(node)

    result = run_ranks(monkeypatch, [lambda r=r: epoch(nodes[r]) for r in range(ranks)])
    assert len({len(mine) for mine in result}) == 1
    assert not any("is_filler" in b for mine in result for b in mine)
    assert sum((trained(b) for mine in result for b in mine), collections.Counter()) == sum(
        (trained(b) for mine in data for b in mine), collections.Counter()
    )
    assert sum(s.snapshot().counters.get("equal_steps.split_batches", 0) for s in stats) > 0
    if keep:
        owner = {t: i for mine in data for b in mine for t, i in owners(b).items()}
        for batch in (b for mine in result for b in mine):
            check_kept(batch, owner)
        every = sorted(i for mine in data for b in mine for i in b["idx"][0])
        assert sorted(set(i for mine in result for b in mine for i in b["idx"][0])) == every


def test_rows_of_a_packed_batch_split_by_rows_are_then_cut_into_pieces(monkeypatch):
    """A two-row packed batch for three ranks: split by rows, then one row regrouped; no filler."""
    rows = [packed_row([(5, True), (6, True)], 1), packed_row([(4, False), (7, True)], 1, first_id=500)]
    two = {k: torch.cat([rows[0][k], rows[1][k]]) for k in ("input_ids", "labels", "position_ids", "seq_idx")}
    bounds = torch.cat([rows[0]["cu_seq_lens_q"], rows[1]["cu_seq_lens_q"][1:] + 12])
    two.update(cu_seq_lens_q=bounds, cu_seq_lens_k=bounds, max_length_q=7, max_length_k=7)
    assert documents(two) == ((code(4, True), code(5, True)), (code(2, False), code(6, True)))
    plan = tail_plan([[2], [], []], [[documents(two)], [], []])
    assert plan.splits == [[0, 0], [], []] and not any(m.filler for m in plan.moves)
    nodes = [EqualSteps(ListNode(data)) for data in ([two], [], [])]

    def epoch(node):
        node.reset(None)
        return list(node)

    result = run_ranks(monkeypatch, [lambda r=r: epoch(nodes[r]) for r in range(3)])
    assert [len(mine) for mine in result] == [1, 1, 1] and not any("is_filler" in mine[0] for mine in result)
    assert sum((trained(mine[0]) for mine in result), collections.Counter()) == trained(rows[0]) + trained(rows[1])


@pytest.mark.parametrize("keep", [(), ("idx",)])
@pytest.mark.parametrize("seq_len", [256, 32])
def test_a_packed_pipeline_of_one_row_batches_splits_its_rows_into_pieces(seq_len, keep):
    """Real packed rows (``pack(seq_len, batch_size=1)``) describe as their documents, and cut into pieces that train
    them once; at 32 most documents are cut by pack() too, and a continuation (its first token the one before the
    cut, as context) is cut again as any document. With ``keep=("idx",)`` each piece's segments are tokens of the
    documents its ids name, in order."""
    tok = pp.examples.tokenizer()
    rows = [{"text": " ".join(f"w{i}x{j}" for j in range(5 + 7 * (i % 9))), "idx": i} for i in range(40)]
    batches = list(pp.from_iterable(rows).tokenize(tok).pack(seq_len, batch_size=1, keep=keep).loader())
    assert batches and all(describe(b) is not None for b in batches)
    corpus = [tok.encode(row["text"]).ids for row in rows]
    pairs: collections.Counter = collections.Counter()
    for batch in batches:
        pieces = cut_row(batch)
        assert pieces is not None
        assert trained(pieces[0]) + trained(pieces[1]) == trained(batch)
        pairs.update(
            (context, label) for piece in pieces for (context, _, label), n in trained(piece).items() for _ in range(n)
        )
        for piece in pieces if keep else ():
            edges = piece["cu_seq_lens_q"].tolist()
            assert len(piece["idx"][0]) == len(edges) - 1
            for idx, a, b in zip(piece["idx"][0], edges, edges[1:]):
                segment, document = piece["input_ids"][0, a:b].tolist(), corpus[idx]
                assert any(document[s : s + len(segment)] == segment for s in range(len(document))), (idx, segment)
    assert pairs == collections.Counter(pair for ids in corpus for pair in zip(ids, ids[1:])), "every prediction once"
