"""Helpers of the packer: place pieces in rows (best fit decreasing), lay placed pieces out as a packed batch
(:func:`assemble`: index arithmetic on flat arrays, no loop per token or row; the block mask copies one block per
segment).
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import torch

from padpipe.pipes.pieces import Piece, exclusive_cumsum

MASK_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.bool)
"""What ``block_mask`` masks can be: additive floats (HF eager and sdpa) or booleans (sdpa only)."""


def best_fit_decreasing(pieces: Iterable[tuple[int, int]], seq_len: int) -> tuple[list[list[int]], list[int]]:
    """Rows of ``seq_len`` slots for ``pieces`` (``(length, key)`` pairs, longest first): each goes into the row
    with the fewest slots left that still holds it, else opens a row. Returns each row's keys, in the order
    placed, and its tokens.

    Example:
        >>> best_fit_decreasing([(6, 0), (5, 1), (4, 2), (2, 3), (1, 4)], seq_len=8)
        ([[0, 3], [1, 4], [2]], [8, 6, 4])
    """
    gaps: list[tuple[int, int]] = []  # (slots left, row), sorted
    rows: list[list[int]] = []
    used: list[int] = []
    for length, key in pieces:
        at = bisect.bisect_left(gaps, (length, -1))  # the row with the fewest slots left that still fits it
        if at < len(gaps):
            left, row = gaps.pop(at)
            if left > length:
                bisect.insort(gaps, (left - length, row))
            rows[row].append(key)
            used[row] += length
        else:
            rows.append([key])
            used.append(length)
            if length < seq_len:
                bisect.insort(gaps, (seq_len - length, len(rows) - 1))
    return rows, used


def assemble(
    pieces: Sequence[Piece],
    rows: Sequence[int],
    num_rows: int,
    *,
    seq_len: int,
    position_offset: int,
    pad_id: int,
    label_pad_id: int,
    mask_dtype: torch.dtype | None,
    keep: Sequence[str] = (),
) -> dict[str, Any]:
    """Lay placed pieces out as a packed batch of ``num_rows`` rows of ``seq_len`` tokens (see
    :class:`~padpipe.pipes.pack.Packer`): each row's segments are its pieces, then its padding run.

    Args:
        pieces: Every placed piece, rows filled left to right in this order.
        rows: The row of each piece (non-decreasing, every row in ``range(num_rows)`` used).
        num_rows: Rows in the batch.
        seq_len: Tokens per row.
        position_offset: First position id of every segment.
        pad_id: Id at unfilled slots.
        label_pad_id: Label at document starts and padding.
        mask_dtype: Build the 4-D block-diagonal causal ``attention_mask`` in this dtype, or
            ``None`` for no mask.
        keep: The kept columns: each a list of ``num_rows`` lists, the values of each row's pieces.

    Example:
        >>> pieces = [Piece(np.array([5, 6]), None, (3,)), Piece(np.array([7, 8]), np.array([-100, 8]), (4,))]
        >>> out = assemble(pieces, [0, 0], 1, seq_len=5, position_offset=0, pad_id=0, label_pad_id=-100,
        ...                mask_dtype=None, keep=("idx",))
        >>> out["input_ids"].tolist(), out["labels"].tolist(), out["seq_idx"].tolist(), out["idx"]
        ([[5, 6, 7, 8, 0]], [[-100, 6, -100, 8, -100]], [[0, 0, 1, 1, 2]], [[3, 4]])
        >>> out["cu_seq_lens_q"].tolist(), out["max_length_q"]
        ([0, 2, 4, 5], 2)
    """
    lengths = np.fromiter((len(p.ids) for p in pieces), dtype=np.int64, count=len(pieces))
    row = np.asarray(rows, dtype=np.int64)  # of each piece
    flat = np.concatenate([p.ids for p in pieces]).astype(np.int64)
    flat_labels = np.concatenate([p.ids if p.labels is None else p.labels for p in pieces]).astype(np.int64)
    piece_start = exclusive_cumsum(lengths)[:-1]  # start of each piece in ``flat``
    used = np.bincount(row, weights=lengths, minlength=num_rows).astype(np.int64)
    row_start = exclusive_cumsum(used)[:-1]  # start of each row's tokens in ``flat``
    first_piece = np.searchsorted(row, np.arange(num_rows + 1))  # row r owns pieces [first[r], first[r+1])
    in_row = piece_start - row_start[row]  # column where each piece starts
    # every slot starts as padding: positions count on from the end of the row's real tokens
    columns = np.arange(seq_len, dtype=np.int64)
    positions = position_offset + columns[None, :] - used[:, None]
    input_ids = np.full((num_rows, seq_len), pad_id, dtype=np.int64)
    labels = np.full((num_rows, seq_len), label_pad_id, dtype=np.int64)
    # flat index of each real token: its row's base plus its column
    dest = np.arange(len(flat), dtype=np.int64) + np.repeat(row * seq_len + in_row - piece_start, lengths)
    input_ids.reshape(-1)[dest] = flat
    labels.reshape(-1)[dest] = flat_labels
    labels.reshape(-1)[row * seq_len + in_row] = label_pad_id
    positions.reshape(-1)[dest] = position_offset + np.arange(len(flat)) - np.repeat(piece_start, lengths)
    # segments in flat (row-major) order: each row's pieces, then its padding run when it has one
    segments = np.insert(lengths, first_piece[1:], seq_len - used)
    segments = segments[segments > 0]
    cu_seq_lens = torch.from_numpy(exclusive_cumsum(segments).astype(np.int32))
    seq_idx = np.repeat(np.arange(len(segments), dtype=np.int32), segments).reshape(num_rows, seq_len)
    max_length = int(segments.max())
    out: dict[str, Any] = {
        "input_ids": torch.from_numpy(input_ids),
        "position_ids": torch.from_numpy(positions),
        "labels": torch.from_numpy(labels),
        "seq_idx": torch.from_numpy(seq_idx),
        "cu_seq_lens_q": cu_seq_lens,
        "cu_seq_lens_k": cu_seq_lens,
        "max_length_q": max_length,
        "max_length_k": max_length,
        "use_cache": False,  # a cache would stop HF's eager/sdpa attention from finding packed rows in position_ids
    }
    if mask_dtype is not None:
        out["attention_mask"] = block_causal_mask(segments, num_rows, seq_len, mask_dtype)
    bounds = first_piece.tolist()
    for j, name in enumerate(keep):
        out[name] = [[p.values[j] for p in pieces[a:b]] for a, b in zip(bounds, bounds[1:])]
    return out


def block_causal_mask(segments: np.ndarray, num_rows: int, seq_len: int, dtype: torch.dtype) -> torch.Tensor:
    """The ``[B, 1, L, L]`` mask letting each query see the keys of its own segment up to itself.

    A float mask is additive (``0`` where a query may attend, the dtype's lowest value elsewhere, as
    HF's eager masks); a bool mask is ``True`` where it may. The mask starts all-masked and one causal
    block is copied per segment (a broadcast comparison of all ``B * L * L`` pairs measured 10x slower).

    Args:
        segments: Segment lengths of the ``B x L`` slots in row-major order (none crosses a row).
        num_rows: Rows ``B``.
        seq_len: Row length ``L``.
        dtype: One of :data:`MASK_DTYPES`.

    Example:
        >>> m = block_causal_mask(np.array([2, 1, 1]), 1, 4, torch.bool)
        >>> m[0, 0].int().tolist()
        [[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]]
        >>> block_causal_mask(np.array([2]), 1, 2, torch.float32)[0, 0].tolist()
        [[0.0, -3.4028234663852886e+38], [0.0, 0.0]]
    """
    storage, masked, block = _mask_parts(seq_len, dtype)
    shape = (num_rows, 1, seq_len, seq_len)
    mask: np.ndarray = np.zeros(shape, dtype=storage) if masked == 0 else np.full(shape, masked, dtype=storage)
    starts = exclusive_cumsum(segments)[:-1]
    for row, col, n in zip((starts // seq_len).tolist(), (starts % seq_len).tolist(), segments.tolist()):
        mask[row, 0, col : col + n, col : col + n] = block[:n, :n]
    return torch.from_numpy(mask).view(dtype)


@functools.lru_cache(maxsize=2)
def _mask_parts(seq_len: int, dtype: torch.dtype) -> tuple[type, int, np.ndarray]:
    """The mask's storage (an int type of the dtype's width), its masked bits, and one causal block.

    NumPy has no ``bfloat16``, so every mask is built as the bit patterns of its values in an
    integer array of the same width and viewed as ``dtype`` at the end (no copy).
    """
    width = torch.empty(0, dtype=dtype).element_size()
    storage, torch_storage = {
        1: (np.uint8, torch.uint8),
        2: (np.int16, torch.int16),
        4: (np.int32, torch.int32),
        8: (np.int64, torch.int64),
    }[width]
    allowed, masked = (True, False) if dtype == torch.bool else (0.0, torch.finfo(dtype).min)
    bits = torch.tensor([allowed, masked], dtype=dtype).view(torch_storage).tolist()
    block = np.where(np.tri(seq_len, dtype=bool), *np.array(bits, dtype=storage))
    block.flags.writeable = False
    return storage, bits[1], block
