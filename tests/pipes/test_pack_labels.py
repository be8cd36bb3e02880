"""pack() with token-level labels (masked SFT rows) and kept columns (the documents' ids in each packed row).

Every document's labels come out as its own, -100 at its first token and on padding; a masked row
longer than ``seq_len`` is refused unless ``long_docs`` says otherwise; ``keep=("idx",)`` gives each
packed row the ids of its documents, in order.
"""

from __future__ import annotations

import collections
import pickle
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import padpipe as pp
from padpipe.chunks import TokenChunk
from padpipe.pipes.pack import Packer
from padpipe.runtime.batch_cut import merge_batches, split_batch
from padpipe.runtime.loss_tokens import label_tokens
from padpipe.state import StateMismatchError, seal
from padpipe.stats import PipelineStats
from tests.contract import check_loader_resume, check_node_resume
from tests.pipes.nodes import ListNode

PAD = 0


def masked_docs(lengths: list[int], seed: int = 0) -> list[dict]:
    """Rows of distinct consecutive ids, each token trained (its label its id) or masked (-100) at random."""
    rng = np.random.default_rng(seed)
    out, next_id = [], 1
    for i, n in enumerate(lengths):
        ids = list(range(next_id, next_id + n))
        next_id += n
        labels = [t if rng.random() < 0.6 else -100 for t in ids]
        out.append({"input_ids": ids, "labels": labels, "idx": i})
    return out


def chunk_of(docs: list[dict], labelled: bool = True) -> TokenChunk:
    columns: dict[str, Any] = {"idx": pa.array([d["idx"] for d in docs], pa.int64())}
    if labelled:
        columns["labels"] = pa.array([d["labels"] for d in docs], pa.large_list(pa.int64()))
    return TokenChunk.from_lists([d["input_ids"] for d in docs], columns)


def chunks_node(docs: list[dict], chunk_rows: int = 3, unlabelled_every: int = 0) -> ListNode:
    """Chunks of ``docs``, rotated by the epoch; every ``unlabelled_every``-th chunk without its labels column."""

    def epoch(e: int) -> list[TokenChunk]:
        shift = e % len(docs)
        rotated = docs[shift:] + docs[:shift]
        parts = [rotated[i : i + chunk_rows] for i in range(0, len(rotated), chunk_rows)]
        return [chunk_of(p, not (unlabelled_every and n % unlabelled_every == 0)) for n, p in enumerate(parts)]

    return ListNode(epoch)


def pieces_of(batch: dict, key: str = "idx") -> list[tuple[Any, list[int], list[int]]]:
    """``(kept value, ids, labels)`` of every piece of a packed batch, row by row, read through ``seq_idx``."""
    out = []
    for r, (ids, labels, seg) in enumerate(
        zip(batch["input_ids"].tolist(), batch["labels"].tolist(), batch["seq_idx"].tolist())
    ):
        segments = [[c for c, s in enumerate(seg) if s == x] for x in sorted(set(seg))]
        real = [cols for cols in segments if ids[cols[0]] != PAD]
        for cols in segments[len(real) :]:  # the padding run: pad ids, nothing trained
            assert {ids[c] for c in cols} == {PAD} and {labels[c] for c in cols} == {-100}
        assert len(batch[key][r]) == len(real), "one kept value per piece of the row"
        for value, cols in zip(batch[key][r], real):
            out.append((value, [ids[c] for c in cols], [labels[c] for c in cols]))
    return out


def trained(labels: list[int]) -> int:
    """Tokens a causal-LM loss trains of one document alone: its labels after the first, not -100."""
    return sum(label != -100 for label in labels[1:])


def test_pack_keeps_each_documents_token_labels() -> None:
    docs = [
        {"input_ids": [1, 2, 3, 4], "labels": [-100, -100, 3, 4], "idx": 10},
        {"input_ids": [5, 6, 7], "labels": [-100, 6, -100], "idx": 11},
        {"input_ids": [8, 9], "labels": [8, 9], "idx": 12},
    ]
    pipe = pp.from_iterable(docs).tokens(pad_id=PAD).pack(6, batch_size=2, buffer_size=8, keep=("idx",))
    (batch,) = list(pipe.loader())
    assert batch["input_ids"].tolist() == [[1, 2, 3, 4, 8, 9], [5, 6, 7, 0, 0, 0]]
    assert batch["labels"].tolist() == [[-100, -100, 3, 4, -100, 9], [-100, 6, -100, -100, -100, -100]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 3, 0, 1], [0, 1, 2, 0, 1, 2]]
    assert batch["idx"] == [[10, 12], [11]]
    assert label_tokens(batch) == sum(trained(d["labels"]) for d in docs) == 4


@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 20), min_size=1, max_size=40),
    seq_len=st.integers(20, 32),
    batch_size=st.integers(1, 3),
    buffer_size=st.integers(1, 8),
    chunk_rows=st.integers(1, 6),
    seed=st.integers(0, 3),
    unlabelled_every=st.integers(0, 3),
)
def test_pack_gives_every_document_its_own_labels_once(
    lengths, seq_len, batch_size, buffer_size, chunk_rows, seed, unlabelled_every
):
    """Labelled and unlabelled chunks may meet in one row: a document without labels is trained on its ids."""
    docs = masked_docs(lengths, seed)
    for n in range(0, len(docs), chunk_rows) if unlabelled_every else ():
        if n // chunk_rows % unlabelled_every == 0:
            for d in docs[n : n + chunk_rows]:
                d["labels"] = d["input_ids"]
    node = Packer(
        chunks_node(docs, chunk_rows, unlabelled_every),
        seq_len=seq_len,
        batch_size=batch_size,
        buffer_size=buffer_size,
        pad_id=PAD,
    )
    node.reset(None)
    batches = list(node)
    node = Packer(
        chunks_node(docs, chunk_rows, unlabelled_every),
        seq_len=seq_len,
        batch_size=batch_size,
        buffer_size=buffer_size,
        pad_id=PAD,
        keep=("idx",),
    )
    node.reset(None)
    kept = list(node)
    assert [b["labels"].tolist() for b in batches] == [b["labels"].tolist() for b in kept], "keep changes no tensor"
    found = sorted((idx, ids, labels) for b in kept for idx, ids, labels in pieces_of(b))
    assert found == [(d["idx"], d["input_ids"], [-100] + d["labels"][1:]) for d in docs]
    assert sum(label_tokens(b) for b in batches) == sum(trained(d["labels"]) for d in docs)


def predictions(batches: list[dict]) -> collections.Counter:
    """``(context token, target)`` of every prediction the model's shifted loss takes (labels at ``c > 0`` other
    than -100, predicted from the token at ``c - 1``, in the same segment)."""
    out: collections.Counter = collections.Counter()
    for b in batches:
        taken = b["labels"][:, 1:] != -100
        assert bool((b["seq_idx"][:, 1:] == b["seq_idx"][:, :-1])[taken].all())
        out.update(zip(b["input_ids"][:, :-1][taken].tolist(), b["labels"][:, 1:][taken].tolist()))
    return out


@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 40), min_size=1, max_size=20),
    seq_len=st.integers(2, 12),
    batch_size=st.integers(1, 3),
    buffer_size=st.integers(1, 8),
    seed=st.integers(0, 3),
)
def test_pack_trains_every_label_of_a_split_masked_row_once_from_the_token_before_it(
    lengths, seq_len, batch_size, buffer_size, seed
):
    """A cut inside a masked conversation keeps its label semantics: every label other than -100 but a row's
    first is predicted once, from the token before it (the piece after a cut starts with it, as context), a
    masked token stays masked, and the counters name one repeated token per cut."""
    docs = masked_docs(lengths, seed)
    stats = PipelineStats()
    node = Packer(chunks_node(docs), seq_len=seq_len, batch_size=batch_size, buffer_size=buffer_size,
                  long_docs="split", pad_id=PAD, stats=stats)  # fmt: skip
    node.reset(None)
    batches = list(node)
    expected = collections.Counter(
        (d["input_ids"][i - 1], d["labels"][i]) for d in docs for i in range(1, len(d["input_ids"]))
        if d["labels"][i] != -100
    )  # fmt: skip
    assert predictions(batches) == expected
    assert sum(label_tokens(b) for b in batches) == sum(trained(d["labels"]) for d in docs)
    placed = sum(int((b["input_ids"] != PAD).sum()) for b in batches)
    assert placed - sum(lengths) == stats.snapshot().counters["pack.context_tokens"]


LONG = (
    r"^pack: row 1 of the chunk \(idx=1\) has 9 tokens with token-level labels; expected at most seq_len=8 "
    r"\(a row with token-level labels is not split across packed rows unless asked\); 1 more row\(s\) of this "
    r"chunk are longer\. Keep the first 8 tokens of each row with max_length=8 on \.tokens\(\) or \.chat\(\) "
    r"\(or \.tokenize\(\)\), or pass long_docs='split', 'truncate' or 'drop' to pack\(\)\.$"
)


def test_pack_raises_error_when_a_masked_row_is_longer_than_seq_len() -> None:
    docs = masked_docs([3, 9, 2, 12])
    tokens = pp.from_iterable(docs).tokens(pad_id=PAD)
    with pytest.raises(pp.DataError, match=LONG):
        list(tokens.pack(8, batch_size=2).loader())
    with pytest.raises(pp.DataError, match=LONG.replace("(a row with", "(long_docs='raise'")[:120]):
        list(tokens.pack(8, batch_size=2, long_docs="raise").loader())
    plain = pp.from_iterable([{"input_ids": d["input_ids"], "id": f"doc-{i}"} for i, d in enumerate(docs)])
    with pytest.raises(
        pp.DataError,
        match=r"^pack: row 1 of the chunk \(id='doc-1'\) has 9 tokens; expected at most seq_len=8 "
        r"\(long_docs='raise'\); 1 more row\(s\)",
    ):
        list(plain.tokens(pad_id=PAD).pack(8, long_docs="raise").loader())
    assert len(list(plain.tokens(pad_id=PAD).pack(8).loader())) == 4, "rows without labels are split by default"
    cut = list(pp.from_iterable(docs).tokens(pad_id=PAD, max_length=8).pack(8, keep=("idx",)).loader())
    assert sorted(p[:2] for b in cut for p in pieces_of(b)) == [(d["idx"], d["input_ids"][:8]) for d in docs]


def test_pack_splits_truncates_or_drops_long_masked_rows_when_asked() -> None:
    docs = masked_docs([11, 3, 8, 4], seed=1)  # seq_len 4: 11 -> 4+4+4+2, 8 -> 4+4+2 (overlapping by one token)
    tokens = pp.from_iterable(docs).tokens(pad_id=PAD)

    def run(**options: Any) -> tuple[list, dict]:
        loader = tokens.pack(4, batch_size=8, keep=("idx",), **options).loader()
        pieces = sorted(p for b in loader for p in pieces_of(b))
        stats = loader.stats()
        return pieces, {**stats.counters, **stats.skipped}

    def piece(d: dict, a: int, b: int) -> tuple:  # a piece's own labels, -100 at its first token
        return (d["idx"], d["input_ids"][a:b], [-100] + d["labels"][a + 1 : b])

    split, counts = run(long_docs="split")
    pieces = [piece(docs[0], 0, 4), piece(docs[0], 3, 7), piece(docs[0], 6, 10), piece(docs[0], 9, 11)]
    pieces += [piece(docs[1], 0, 3), piece(docs[2], 0, 4), piece(docs[2], 3, 7), piece(docs[2], 6, 8)]
    assert split == sorted([*pieces, piece(docs[3], 0, 4)]) and counts["pack.split_docs"] == 2
    assert counts["pack.context_tokens"] == 5
    truncated, counts = run(long_docs="truncate")
    assert truncated == sorted([piece(docs[0], 0, 4), piece(docs[1], 0, 3), piece(docs[2], 0, 4), piece(docs[3], 0, 4)])
    assert counts["pack.truncated_docs"] == 2
    dropped, counts = run(long_docs="drop")
    assert dropped == sorted([piece(docs[1], 0, 3), piece(docs[3], 0, 4)]) and counts["pack.long_doc"] == 2


def test_pack_keeps_string_ids_and_gives_a_split_document_in_each_of_its_rows() -> None:
    rows = [{"input_ids": list(range(1, 10)), "id": "long"}, {"input_ids": [20, 21], "id": "short"}]
    (batch,) = list(pp.from_iterable(rows).tokens(pad_id=PAD).pack(6, batch_size=2, keep=("id",)).loader())
    assert batch["input_ids"].tolist() == [[1, 2, 3, 4, 5, 6], [6, 7, 8, 9, 20, 21]]  # 6 again: 7's context
    assert batch["id"] == [["long"], ["long", "short"]]
    assert batch["labels"].tolist() == [[-100, 2, 3, 4, 5, 6], [-100, 7, 8, 9, -100, 21]]


def test_pack_raises_error_when_a_kept_column_is_missing_or_not_ids() -> None:
    tokens = pp.from_iterable([{"input_ids": [1, 2], "idx": 0, "score": 0.5}]).tokens(pad_id=PAD)
    with pytest.raises(
        pp.DataError,
        match=r"^pack: column 'id' named in `keep` is not in the data; expected one of the columns "
        r"\['idx', 'score'\]\.$",
    ):
        list(tokens.pack(4, keep=["id"]).loader())
    with pytest.raises(
        pp.DataError,
        match=r"^pack: column 'score' named in `keep` has type double; expected integers or strings \(row ids\)\.$",
    ):
        list(tokens.pack(4, keep=("score",)).loader())


@pytest.mark.parametrize(
    ("keep", "error", "message"),
    [
        ("idx", TypeError, r"^`keep` must be a tuple of column names, but is 'idx' instead\.$"),
        (("idx", "idx"), ValueError, r"^`keep` must name distinct columns other than the packed batch's own keys "),
        (("labels",), ValueError, r"^`keep` must name distinct columns .* but is \('labels',\) instead\.$"),
    ],
)
def test_pack_raises_error_when_keep_is_bad(keep: Any, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        pp.from_iterable([{"input_ids": [1]}]).tokens(pad_id=PAD).pack(4, keep=keep)


def test_split_and_merge_cut_packed_masked_batches_by_rows_with_their_ids() -> None:
    docs = masked_docs([5, 3, 7, 2, 6, 4, 3, 5, 2], seed=2)
    pipe = pp.from_iterable(docs).tokens(pad_id=PAD).pack(8, batch_size=4, keep=("idx",))
    batches = list(pipe.loader())
    assert [len(b["idx"]) for b in batches] == [4, 1]
    assert split_batch(batches[1]) is None, "one row: nothing to cut"
    for batch in batches[:1]:
        halves = split_batch(batch)
        assert halves is not None
        cut = len(batch["idx"]) // 2
        assert (halves[0]["idx"], halves[1]["idx"]) == (batch["idx"][:cut], batch["idx"][cut:])
        assert pieces_of(halves[0]) + pieces_of(halves[1]) == pieces_of(batch)
        merged = merge_batches(*halves)
        assert merged is not None and merged["idx"] == batch["idx"]
        assert all(torch.equal(merged[k], batch[k]) for k in batch if isinstance(batch[k], torch.Tensor))


@pytest.mark.parametrize(
    "options",
    [
        dict(seq_len=8, batch_size=2, buffer_size=3, keep=("idx",)),
        dict(seq_len=5, batch_size=2, buffer_size=2, long_docs="split", keep_tail=False, keep=("idx",)),
        dict(seq_len=4, batch_size=3, buffer_size=5, long_docs="truncate", block_mask=True),
    ],
)
def test_pack_saves_and_restores_its_state_with_labels_and_kept_columns(options: dict) -> None:
    docs = masked_docs([3, 1, 7, 2, 5, 4, 1, 6, 2, 3, 8, 1], seed=3)
    items = check_node_resume(lambda: Packer(chunks_node(docs, 4, unlabelled_every=3), pad_id=PAD, **options))
    assert items[0] != items[1]


def test_pack_resumes_masked_rows_exactly_through_a_loader() -> None:
    docs = masked_docs([(i * 5) % 13 + 1 for i in range(30)], seed=4)
    pipe = pp.from_iterable(docs, chunk_rows=7).shuffle(10, seed=1).tokens(pad_id=PAD)
    check_loader_resume(lambda: pipe.pack(16, batch_size=2, buffer_size=5, keep=("idx",)).loader(), epochs=2)


def test_pack_raises_state_mismatch_for_labels_that_do_not_fit_their_pieces() -> None:
    node = Packer(chunks_node(masked_docs([3, 4, 2, 5])), seq_len=8, buffer_size=8, pad_id=PAD)
    node.reset(None)
    state = node.state_dict()
    assert state["version"] == 6
    bad = TokenChunk.from_lists([[1, 2]], {"labels": pa.array([[1]], pa.large_list(pa.int64()))}).to_state()
    state = seal({**state, "pool": bad})
    with pytest.raises(StateMismatchError, match=r"^pack state is invalid: 'pool' must be pieces with one integer "):
        Packer(chunks_node(masked_docs([3, 4, 2, 5])), seq_len=8, buffer_size=8, pad_id=PAD).reset(state)
    saved = pickle.loads(pickle.dumps(node.state_dict()))
    with pytest.raises(StateMismatchError, match=r"setting 'keep' found \[\] instead of \['idx'\]"):
        Packer(chunks_node(masked_docs([3, 4, 2, 5])), seq_len=8, buffer_size=8, pad_id=PAD, keep=("idx",)).reset(saved)


@pytest.mark.parametrize("batching", ["bucket", "batch"])
def test_bucket_and_batch_pad_token_labels_with_minus_100(batching: str) -> None:
    docs = masked_docs([3, 5, 2, 4], seed=5)
    tokens = pp.from_iterable(docs).tokens(pad_id=PAD)
    batched = tokens.bucket(batch_size=4, buffer_size=4) if batching == "bucket" else tokens.batch(4)
    (batch,) = list(batched.pad().loader())
    for ids, labels, mask, idx in zip(batch["input_ids"], batch["labels"], batch["attention_mask"], batch["idx"]):
        n = int(mask.sum())
        assert labels.tolist() == docs[int(idx)]["labels"] + [-100] * (len(labels) - n)
        assert ids.tolist()[:n] == docs[int(idx)]["input_ids"]


def test_pack_counts_skips_of_masked_rows_in_stats() -> None:
    stats = PipelineStats()
    docs = masked_docs([9, 0, 3])
    node = Packer(chunks_node(docs), seq_len=4, long_docs="drop", pad_id=PAD, keep=("idx",), stats=stats)
    node.reset(None)
    assert [p[0] for b in node for p in pieces_of(b)] == [2]
    assert stats.snapshot().skipped == {"pack.long_doc": 1, "pack.empty_doc": 1}
