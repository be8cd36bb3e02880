"""Join two dict batches into one (rows of the first, then the second): how equal steps evens out a tail.

The inverse of :func:`padpipe.runtime.equal_steps.split_batch`. Only batches of the same shape beyond
the row dimension join (packed rows always do; padded rows of the same width do), so nothing has
to be padded again; a packed batch's flash-attention kwargs are rebuilt for the joined rows.
"""

from __future__ import annotations

from typing import Any

import torch

PACKED_KEYS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")


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
    rows = (_rows(first), _rows(second))
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
    if not all(isinstance(t, torch.Tensor) for t in (a, b, ids)) or ids.dim() != 2:
        return False
    bounds = torch.cat([a, b[1:].to(a.device) + int(a[-1])])
    merged["cu_seq_lens_q"] = merged["cu_seq_lens_k"] = bounds
    merged["max_length_q"] = merged["max_length_k"] = int((bounds[1:] - bounds[:-1]).max())
    if isinstance(first.get("seq_idx"), torch.Tensor):
        merged["seq_idx"] = torch.cat([first["seq_idx"], second["seq_idx"].to(a.device) + (len(a) - 1)])
    return True


def _rows(batch: dict[str, Any]) -> int | None:
    return next((len(v) for v in batch.values() if isinstance(v, torch.Tensor) and v.dim() > 0), None)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.shape == b.shape
            and bool(torch.equal(a, b.to(a.device)))
        )
    return type(a) is type(b) and a == b
