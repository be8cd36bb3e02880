"""Cut a one-row packed batch in two real pieces, so an epoch's last steps need no filler: what equal steps splits last.

A packed row holds whole documents, each its own segment of ``cu_seq_lens_q``. :func:`describe` reads it as one
code per document (its label tokens, and whether it may be cut), :func:`halve` plans a cut from the codes alone,
so every rank can plan another rank's cut from a gathered table, and :func:`cut_row` carries it out. Documents
are regrouped in two runs where that gives each run label tokens; only else is a pretraining document cut
between two tokens, each prediction kept by exactly one piece (docs/distributed.md, "The epoch's last steps").

Example:
    >>> ids = torch.tensor([[5, 6, 7, 8, 9, 4, 0, 0]])
    >>> row = {"input_ids": ids, "labels": torch.tensor([[-100, 6, 7, -100, 9, 4, -100, -100]]),
    ...        "cu_seq_lens_q": torch.tensor([0, 3, 6, 8], dtype=torch.int32)}
    >>> describe(row)  # one row: two documents of 2 label tokens, both cuttable; the padding is none
    ((5, 5),)
    >>> first, second = cut_row(row)
    >>> first["input_ids"].tolist(), second["input_ids"].tolist(), second["cu_seq_lens_q"].tolist()
    ([[5, 6, 7]], [[8, 9, 4]], [0, 3])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch

IGNORE = -100
ROW_KEYS = ("input_ids", "labels", "position_ids", "seq_idx")  # one value per token of the row
BOUND_KEYS = ("cu_seq_lens_q", "cu_seq_lens_k")
LENGTH_KEYS = ("max_length_q", "max_length_k")
MARKS = ("is_filler", "is_repeat", "use_cache")  # 0-d marks and the batch's use_cache=False: each piece keeps them
KNOWN = frozenset((*ROW_KEYS, *BOUND_KEYS, *LENGTH_KEYS, *MARKS))  # any other key is a kept column


def code(labels: int, cuttable: bool) -> int:
    """One document as an int: its label tokens, and whether it may be cut (a pretraining document)."""
    return 2 * labels + int(cuttable)


def labels_of(doc: int) -> int:
    """The label tokens of a document's :func:`code`."""
    return doc // 2


@dataclass(frozen=True)
class Halving:
    """Where :func:`halve` cuts a row: before document ``at``, or (``take`` > 0) inside it after ``take`` label tokens.

    ``left`` and ``right`` are the pieces' document codes, as :func:`describe` would read them.
    """

    at: int
    take: int
    left: tuple[int, ...]
    right: tuple[int, ...]

    @property
    def cuts_a_document(self) -> bool:
        return self.take > 0


def halve(docs: tuple[int, ...]) -> Halving | None:
    """The plan that cuts a row of documents ``docs`` (codes) in two pieces with label tokens each, or ``None``.

    Regrouping (a cut between documents, right after one with label tokens) comes first, the
    label tokens of the pieces as even as can be (the first such boundary on a tie); else the one
    document with label tokens is cut in the middle of them, if it may be cut and has two or more.

    Example:
        >>> halve((code(4, True), code(1, False), code(3, False)))  # regrouped: 4 | 1 + 3
        Halving(at=1, take=0, left=(9,), right=(2, 6))
        >>> halve((code(5, True),))  # one document: cut after 2 of its 5 label tokens
        Halving(at=0, take=2, left=(5,), right=(7,))
        >>> halve((code(5, False),)) is None  # a conversation is never cut
        True
    """
    counts = [labels_of(d) for d in docs]
    total, best, run = sum(counts), None, 0
    for at in range(1, len(docs)):
        run += counts[at - 1]
        if counts[at - 1] and run < total and (best is None or abs(total - 2 * run) < abs(total - 2 * best[1])):
            best = (at, run)
    if best is not None:
        return Halving(best[0], 0, docs[: best[0]], docs[best[0] :])
    live = [i for i, n in enumerate(counts) if n]
    if len(live) != 1 or not docs[live[0]] % 2 or counts[live[0]] < 2:
        return None
    i, n = live[0], counts[live[0]]
    take = n // 2
    return Halving(i, take, docs[:i] + (code(take, True),), (code(n - take, True),) + docs[i + 1 :])


def describe(batch: Any) -> tuple[tuple[int, ...], ...] | None:
    """The document codes of each row of a packed batch, or ``None`` if its rows cannot be cut by documents.

    A batch qualifies when it holds only packed rows' keys and kept columns (``pack(keep=...)``: one value
    per document), its segments never cross a row, and every segment's first label is ``-100``. Without kept
    columns the segments after a row's last label token (padding, documents with no label) are left out, as
    they train nothing; with them a row's documents are as many as its values, and only the padding goes.
    """
    rows = _row_spans(batch)
    if rows is None:
        return None
    out = []
    for r, spans in enumerate(rows):
        ids, labels = batch["input_ids"][r], batch["labels"][r]
        docs = []
        for start, end in spans:
            lab, own = labels[start + 1 : end], ids[start + 1 : end]
            live = lab != IGNORE
            docs.append(code(int(live.sum()), bool(live.all()) and bool(torch.equal(lab, own))))
        out.append(tuple(docs))
    return tuple(out)


def cut_row(batch: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """``batch`` (one packed row) as two batches of one row each, as :func:`halve` plans it; ``None`` if it cannot.

    A kept column (``pack(keep=...)``) goes with its documents: each piece gets the values of the
    documents it holds, and a cut document's value is on both pieces.

    Example:
        >>> row = {"input_ids": torch.tensor([[1, 2, 3, 4]]), "labels": torch.tensor([[-100, 2, 3, 4]]),
        ...        "cu_seq_lens_q": torch.tensor([0, 4]), "idx": [[7]]}
        >>> [(p["input_ids"].tolist(), p["labels"].tolist(), p["idx"]) for p in cut_row(row)]  # 2 is the cut token
        [([[1, 2]], [[-100, 2]], [[7]]), ([[2, 3, 4]], [[-100, 3, 4]], [[7]])]
    """
    rows, described = _row_spans(batch), describe(batch)
    if rows is None or described is None or len(rows) != 1 or (plan := halve(described[0])) is None:
        return None
    segments, at = rows[0], plan.at
    if not plan.cuts_a_document:
        edge = segments[at][0]
        return _piece(batch, segments[:at], 0, edge, 0, at), _piece(batch, segments[at:], edge, None, at, None)
    start, end = segments[at]
    cut = start + plan.take  # the cut token: the last of the first piece, the first of the second
    first = _piece(batch, [*segments[:at], (start, cut + 1)], 0, cut + 1, 0, at + 1)
    second = _piece(batch, [(cut, end), *segments[at + 1 :]], cut, None, at, None)
    second["labels"] = second["labels"].clone()
    second["labels"][0, 0] = IGNORE
    return first, second


def _row_spans(batch: Any) -> list[list[tuple[int, int]]] | None:
    """Each row's documents as ``(start, end)`` token spans in the row (padding left out), or ``None``."""
    if not isinstance(batch, dict):
        return None
    ids, labels, bounds = batch.get("input_ids"), batch.get("labels"), batch.get("cu_seq_lens_q")
    if (
        not isinstance(ids, torch.Tensor)
        or not isinstance(labels, torch.Tensor)
        or not isinstance(bounds, torch.Tensor)
    ):
        return None
    if ids.dim() != 2 or not len(ids) or bounds.dim() != 1:
        return None
    if any(not isinstance(batch.get(k, ids), torch.Tensor) or batch.get(k, ids).shape != ids.shape for k in ROW_KEYS):
        return None
    edges, (rows, width) = bounds.tolist(), ids.shape
    if len(edges) < 2 or edges[0] != 0 or edges[-1] != rows * width or any(b <= a for a, b in zip(edges, edges[1:])):
        return None
    at = set(edges)
    if any(r * width not in at for r in range(rows)):
        return None  # a segment crosses rows
    flat_labels = labels.reshape(-1)
    if any(int(flat_labels[a]) != IGNORE for a in edges[:-1]):
        return None
    documents = _documents(batch, rows)
    if documents is False:
        return None
    out = []
    for r in range(rows):
        lo, hi = r * width, (r + 1) * width
        spans = [(a - lo, b - lo) for a, b in zip(edges, edges[1:]) if lo <= a and b <= hi]
        if documents is not None:  # a value per document: what follows them is the padding
            count = documents[r]
            if not len(spans) - 1 <= count <= len(spans) or any(
                bool((labels[r, a:b] != IGNORE).any()) for a, b in spans[count:]
            ):
                return None
            out.append(spans[:count])
            continue
        while spans and bool((labels[r, spans[-1][0] : spans[-1][1]] == IGNORE).all()):
            spans.pop()  # the padding, and documents after the last label token: they train nothing
        out.append(spans)
    return out


def _documents(batch: dict[str, Any], rows: int) -> list[int] | None | Literal[False]:
    """The documents of each row as its kept columns count them (``None``: no kept column; ``False``: not kept
    columns, or counts that differ)."""
    kept = [value for key, value in batch.items() if key not in KNOWN]
    if not kept:
        return None
    if not all(isinstance(v, list) and len(v) == rows and all(isinstance(r, list) for r in v) for v in kept):
        return False
    counts = [len(row) for row in kept[0]]
    return counts if all([len(row) for row in v] == counts for v in kept) else False


def _piece(
    batch: dict[str, Any], spans: list[tuple[int, int]], start: int, end: int | None, first: int, last: int | None
) -> dict[str, Any]:
    """Tokens ``[start, end)`` of the row (``end``: the last span's end), with segments ``spans`` as their own and
    the kept values of documents ``[first, last)``."""
    stop = spans[-1][1] if end is None else end
    out: dict[str, Any] = {}
    for key, value in batch.items():
        if key in ROW_KEYS:
            out[key] = value[:, start:stop].clone()  # its own storage: a view would carry the whole row along
        elif key in MARKS:
            out[key] = value
        elif key not in KNOWN:
            out[key] = [value[0][first:last]]
    if "seq_idx" in out:
        out["seq_idx"] = out["seq_idx"] - out["seq_idx"][0, 0]
    lengths = [b - a for a, b in spans]
    bounds = batch["cu_seq_lens_q"]
    edges = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=bounds.dtype, device=bounds.device)
    for key in BOUND_KEYS:
        if key in batch:
            out[key] = edges
    for key in LENGTH_KEYS:
        if key in batch:
            out[key] = max(lengths)
    return out
