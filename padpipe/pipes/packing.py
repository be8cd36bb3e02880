"""Vectorized helpers of the packer: cut documents into pieces, and lay placed pieces out as tensors.

Both work on flat arrays with ``np.repeat``/``cumsum`` index arithmetic; nothing loops per token
or per row (the optional block mask copies one block per segment).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from padpipe.chunks import TokenChunk


def _exclusive_cumsum(values: np.ndarray) -> np.ndarray:
    out = np.zeros(len(values) + 1, dtype=np.int64)
    np.cumsum(values, out=out[1:])
    return out


def cut_pieces(
    chunk: TokenChunk, *, seq_len: int, long_docs: str, keep_tail: bool
) -> tuple[TokenChunk, dict[str, int]]:
    """The pieces a packer places for the documents of ``chunk``, in order, as a compact chunk.

    A document of at most ``seq_len`` tokens is one piece. A longer one is split into ``seq_len``
    pieces plus its tail (``"split"``; the tail dropped when ``keep_tail`` is false), cut to its first
    ``seq_len`` tokens (``"truncate"``) or dropped (``"drop"``). Empty documents are dropped.

    Args:
        chunk: Tokenized documents, one per row.
        seq_len: Tokens per packed row.
        long_docs: ``"split"``, ``"truncate"`` or ``"drop"``.
        keep_tail: With ``"split"``, keep the last piece shorter than ``seq_len``.

    Returns:
        ``(pieces, counts)``: the pieces (ids and offsets only) and how many documents were
        ``"split"``, ``"truncated"``, ``"dropped"`` (too long), ``"tails_dropped"`` and ``"empty"``.

    Example:
        >>> pieces, counts = cut_pieces(TokenChunk.from_lists([[1, 2, 3, 4, 5], [6]]), seq_len=2,
        ...                             long_docs="split", keep_tail=True)
        >>> [pieces.row(i).tolist() for i in range(pieces.num_rows)], counts["split"]
        ([[1, 2], [3, 4], [5], [6]], 1)
    """
    lengths = chunk.lengths
    long = lengths > seq_len
    counts = {"split": 0, "truncated": 0, "dropped": 0, "tails_dropped": 0, "empty": int((lengths == 0).sum())}
    pieces = (lengths > 0).astype(np.int64)
    if long_docs == "split":
        tails = long & (lengths % seq_len > 0)
        pieces[long] = lengths[long] // seq_len + (tails[long] if keep_tail else 0)
        counts["split"] = int(long.sum())
        counts["tails_dropped"] = 0 if keep_tail else int(tails.sum())
    elif long_docs == "truncate":
        counts["truncated"] = int(long.sum())
    else:
        pieces[long] = 0
        counts["dropped"] = int(long.sum())
    doc = np.repeat(np.arange(len(lengths), dtype=np.int64), pieces)
    part = np.arange(len(doc), dtype=np.int64) - np.repeat(_exclusive_cumsum(pieces)[:-1], pieces)
    starts = chunk.offsets[:-1][doc] + part * seq_len
    sizes = np.minimum(seq_len, lengths[doc] - part * seq_len)
    offsets = _exclusive_cumsum(sizes)
    index = np.arange(int(offsets[-1]), dtype=np.int64) + np.repeat(starts - offsets[:-1], sizes)
    return TokenChunk(chunk.ids[index], offsets), counts


def pieces_to_chunk(pieces: Sequence[np.ndarray]) -> TokenChunk:
    """The pieces as one compact chunk (for state dicts).

    Example:
        >>> pieces_to_chunk([np.array([1, 2], np.int32), np.array([3], np.int32)]).offsets.tolist()
        [0, 2, 3]
    """
    if not pieces:
        return TokenChunk.empty()
    lengths = np.fromiter((len(p) for p in pieces), dtype=np.int64, count=len(pieces))
    return TokenChunk(np.concatenate(pieces), _exclusive_cumsum(lengths))


MASK_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.bool)
"""What ``block_mask`` masks can be: additive floats (HF eager and sdpa) or booleans (sdpa only)."""


def assemble(
    pieces: Sequence[np.ndarray],
    rows: Sequence[int],
    num_rows: int,
    *,
    seq_len: int,
    position_offset: int,
    pad_id: int,
    label_pad_id: int,
    mask_dtype: torch.dtype | None,
) -> dict[str, Any]:
    """Lay placed pieces out as a packed batch of ``num_rows`` rows of ``seq_len`` tokens.

    The segments are each row's pieces and then its padding run (when it has one); the position
    ids, ``seq_idx``, ``cu_seq_lens_*`` and the block mask all describe these same segments.

    Args:
        pieces: Token ids of every placed piece, rows filled left to right in this order.
        rows: The row of each piece (non-decreasing, every row in ``range(num_rows)`` used).
        num_rows: Rows in the batch.
        seq_len: Tokens per row.
        position_offset: First position id of every segment.
        pad_id: Id at unfilled slots.
        label_pad_id: Label at document starts and padding.
        mask_dtype: Build the 4-D block-diagonal causal ``attention_mask`` in this dtype, or
            ``None`` for no mask.

    Returns:
        The batch dict (see :class:`padpipe.pipes.pack.Packer`).

    Example:
        >>> out = assemble([np.array([5, 6]), np.array([7])], [0, 0], 1, seq_len=4, position_offset=0,
        ...                pad_id=0, label_pad_id=-100, mask_dtype=None)
        >>> out["input_ids"].tolist(), out["labels"].tolist(), out["seq_idx"].tolist()
        ([[5, 6, 7, 0]], [[-100, 6, -100, -100]], [[0, 0, 1, 2]])
        >>> out["cu_seq_lens_q"].tolist(), out["max_length_q"]
        ([0, 2, 3, 4], 2)
    """
    lengths = np.fromiter((len(p) for p in pieces), dtype=np.int64, count=len(pieces))
    rows = np.asarray(rows, dtype=np.int64)
    flat = np.concatenate(pieces).astype(np.int64)
    piece_start = _exclusive_cumsum(lengths)[:-1]  # start of each piece in ``flat``
    used = np.bincount(rows, weights=lengths, minlength=num_rows).astype(np.int64)
    row_start = _exclusive_cumsum(used)[:-1]  # start of each row's tokens in ``flat``
    first_piece = np.searchsorted(rows, np.arange(num_rows + 1))  # row r owns pieces [first[r], first[r+1])
    in_row = piece_start - row_start[rows]  # column where each piece starts
    # every slot starts as padding: positions count on from the end of the row's real tokens
    columns = np.arange(seq_len, dtype=np.int64)
    positions = position_offset + columns[None, :] - used[:, None]
    input_ids = np.full((num_rows, seq_len), pad_id, dtype=np.int64)
    labels = np.full((num_rows, seq_len), label_pad_id, dtype=np.int64)
    # flat index of each real token: its row's base plus its column
    dest = np.arange(len(flat), dtype=np.int64) + np.repeat(rows * seq_len + in_row - piece_start, lengths)
    input_ids.reshape(-1)[dest] = flat
    labels.reshape(-1)[dest] = flat
    labels.reshape(-1)[rows * seq_len + in_row] = label_pad_id
    positions.reshape(-1)[dest] = position_offset + np.arange(len(flat)) - np.repeat(piece_start, lengths)
    # segments in flat (row-major) order: each row's pieces, then its padding run when it has one
    segments = np.insert(lengths, first_piece[1:], seq_len - used)
    segments = segments[segments > 0]
    cu_seq_lens = torch.from_numpy(_exclusive_cumsum(segments).astype(np.int32))
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
    }
    if mask_dtype is not None:
        out["attention_mask"] = block_causal_mask(segments, num_rows, seq_len, mask_dtype)
    return out


def block_causal_mask(segments: np.ndarray, num_rows: int, seq_len: int, dtype: torch.dtype) -> torch.Tensor:
    """The ``[B, 1, L, L]`` mask letting each query see the keys of its own segment up to itself.

    ``segments`` are the segment lengths of the ``B x L`` slots in row-major order (no segment
    crosses a row). A float mask is additive, ``0`` where a query may attend and the dtype's
    lowest value elsewhere (as HF builds its own eager masks); a bool mask is ``True`` where a
    query may attend. Every query sees at least itself, so no softmax row is empty. The mask
    starts all-masked and one causal block is copied per segment: the work is the mask's size
    plus the sum of squared segment lengths (a broadcast comparison of all ``B * L * L`` pairs
    measured 10x slower).

    Args:
        segments: Segment lengths, summing to ``num_rows * seq_len``.
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
    mask = np.zeros(shape, dtype=storage) if masked == 0 else np.full(shape, masked, dtype=storage)
    starts = _exclusive_cumsum(segments)[:-1]
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
