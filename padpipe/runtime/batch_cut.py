"""Cut a dict batch in two by rows, or join two into one: how equal steps and elastic resume even out steps.

:func:`split_batch` cuts rows ``[:B//2]`` from ``[B//2:]``; :func:`merge_batches`, its inverse, joins
batches of the same shape beyond the row dimension (packed rows always do; padded rows of one width
do), so nothing is padded again. A packed batch's flash-attention kwargs are rebuilt for each part.
"""

from __future__ import annotations

import bisect
from typing import Any

import torch

from padpipe.pipes.pairs import paired_rows

PACKED_KEYS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")


def split_batch(batch: Any) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """Cut a dict batch of ``B >= 2`` rows into two (rows ``[:B//2]`` and ``[B//2:]``), or ``None``.

    Tensors and lists whose first dimension is ``B`` are cut; 0-d tensors and plain scalars are
    kept in both halves. A packed batch's flash-attention kwargs (``cu_seq_lens_q/k``,
    ``max_length_q/k``, ``seq_idx``) are recomputed for each half (segments never cross rows). A
    batch with anything else is not cut.

    Example:
        >>> halves = split_batch({"input_ids": torch.ones(3, 2), "text": ["a", "b", "c"], "k": 1})
        >>> [h["text"] for h in halves], halves[1]["input_ids"].shape
        ([['a'], ['b', 'c']], torch.Size([2, 2]))
    """
    if not isinstance(batch, dict):
        return None
    rows = rows_of(batch)
    if rows is None or rows < 2:
        return None
    if (pairs := paired_rows(batch)) is not None:  # TRL's DPO layout: a half keeps both members of its pairs
        cut = pairs // 2
        first_rows = [*range(cut), *range(pairs, pairs + cut)]
        second_rows = [*range(cut, pairs), *range(pairs + cut, 2 * pairs)]
        return _cut(batch, 2 * pairs, first_rows, second_rows, ()) if pairs >= 2 else None
    cut = rows // 2
    halves = _cut(batch, rows, slice(None, cut), slice(cut, None), PACKED_KEYS)
    if halves is None or "cu_seq_lens_q" in batch and not _split_packed(batch, cut, *halves):
        return None
    return halves


def _cut(
    batch: dict[str, Any], rows: int, first_rows: Any, second_rows: Any, skip: tuple[str, ...]
) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """``batch``'s rows ``first_rows`` and ``second_rows`` (a slice or a list of rows), its scalars in both and
    ``skip`` in neither; ``None`` for a value that is neither ``rows`` long nor a scalar."""
    first: dict[str, Any] = {}
    second: dict[str, Any] = {}
    for key, value in batch.items():
        if key in skip:
            continue
        if isinstance(value, torch.Tensor) and value.dim() > 0 or isinstance(value, (list, tuple)):
            if len(value) != rows:
                return None
            for half, taken in ((first, first_rows), (second, second_rows)):
                if isinstance(taken, slice):
                    half[key] = value[taken]
                elif isinstance(value, torch.Tensor):
                    half[key] = value[torch.tensor(taken, device=value.device)]
                else:
                    half[key] = [value[i] for i in taken]
        elif isinstance(value, (torch.Tensor, int, float, str, bool)) or value is None:
            first[key] = second[key] = value
        else:
            return None
    return first, second


def _split_packed(batch: dict[str, Any], cut: int, first: dict[str, Any], second: dict[str, Any]) -> bool:
    """Give each half its own segment boundaries and longest segment; ``False`` if the batch is not packed."""
    bounds, ids = batch["cu_seq_lens_q"], batch.get("input_ids")
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or not isinstance(bounds, torch.Tensor):
        return False
    edge, host = cut * ids.shape[1], bounds.tolist()  # read on the host: the bounds may be on a GPU
    at = bisect.bisect_left(host, edge)
    if at >= len(host) or host[at] != edge:
        return False
    for half, part, lengths in ((first, bounds[: at + 1], host[: at + 1]), (second, bounds[at:] - edge, host[at:])):
        half["cu_seq_lens_q"] = half["cu_seq_lens_k"] = part.to(bounds.dtype)
        half["max_length_q"] = half["max_length_k"] = max(b - a for a, b in zip(lengths, lengths[1:]))
    if isinstance(second.get("seq_idx"), torch.Tensor):
        second["seq_idx"] = second["seq_idx"] - at
    return True


def rows_of(batch: Any) -> int | None:
    """Rows of a dict batch (the first dimension of its first tensor), else ``None``."""
    if not isinstance(batch, dict):
        return None
    return next((len(v) for v in batch.values() if isinstance(v, torch.Tensor) and v.dim() > 0), None)


def merge_batches(first: Any, second: Any) -> dict[str, Any] | None:
    """``first`` and ``second`` as one batch, or ``None`` when they cannot be joined as they are.

    Example:
        >>> a, b = {"x": torch.ones(2, 3), "t": ["a", "b"]}, {"x": torch.zeros(1, 3), "t": ["c"]}
        >>> merged = merge_batches(a, b)
        >>> merged["x"].shape, merged["t"]
        (torch.Size([3, 3]), ['a', 'b', 'c'])
    """
    if not isinstance(first, dict) or not isinstance(second, dict) or set(first) != set(second):
        return None
    if paired_rows(first) is not None or paired_rows(second) is not None:  # pairs would not stay in TRL's layout
        return None
    rows = (rows_of(first), rows_of(second))
    if None in rows:
        return None
    merged: dict[str, Any] = {}
    for key, a in first.items():
        if key in PACKED_KEYS or key == "seq_idx":
            continue
        b = second[key]
        if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dim() > 0 and b.dim() > 0:
            if (len(a), len(b)) != rows or a.shape[1:] != b.shape[1:] or a.dtype != b.dtype:
                return None
            merged[key] = torch.cat([a, b.to(a.device)])
        elif isinstance(a, list) and isinstance(b, list) and (len(a), len(b)) == rows:
            merged[key] = a + b
        elif _same(a, b):
            merged[key] = a
        else:
            return None
    if "cu_seq_lens_q" in first and not _merge_packed(first, second, merged):
        return None
    return merged


def _merge_packed(first: dict[str, Any], second: dict[str, Any], merged: dict[str, Any]) -> bool:
    """Segment boundaries of the joined rows (the second's shifted past the first's tokens); ``False`` if not packed."""
    a, b = first["cu_seq_lens_q"], second["cu_seq_lens_q"]
    ids = first.get("input_ids")
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and isinstance(ids, torch.Tensor)):
        return False
    if ids.dim() != 2:
        return False
    bounds = torch.cat([a, b[1:].to(a.device) + int(a[-1])])
    merged["cu_seq_lens_q"] = merged["cu_seq_lens_k"] = bounds
    merged["max_length_q"] = merged["max_length_k"] = int((bounds[1:] - bounds[:-1]).max())
    if isinstance(first.get("seq_idx"), torch.Tensor):
        merged["seq_idx"] = torch.cat([first["seq_idx"], second["seq_idx"].to(a.device) + (len(a) - 1)])
    return True


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.shape == b.shape
            and bool(torch.equal(a, b.to(a.device)))
        )
    return type(a) is type(b) and a == b
