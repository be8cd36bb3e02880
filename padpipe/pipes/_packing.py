"""Vectorized helpers of the packer: cut documents into pieces, and lay placed pieces out as tensors.

Both work on flat arrays with ``np.repeat``/``cumsum`` index arithmetic; nothing loops per token.
"""

from __future__ import annotations

import functools
from typing import Any, Sequence

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


def assemble(
    pieces: Sequence[np.ndarray],
    rows: Sequence[int],
    num_rows: int,
    *,
    seq_len: int,
    position_offset: int,
    pad_id: int,
    label_pad_id: int,
    block_mask: bool,
) -> dict[str, Any]:
    """Lay placed pieces out as a packed batch of ``num_rows`` rows of ``seq_len`` tokens.

    Args:
        pieces: Token ids of every placed piece, rows filled left to right in this order.
        rows: The row of each piece (non-decreasing, every row in ``range(num_rows)`` used).
        num_rows: Rows in the batch.
        seq_len: Tokens per row.
        position_offset: First position id of every document and padding run.
        pad_id: Id at unfilled slots.
        label_pad_id: Label at document starts and padding.
        block_mask: Also build the 4-D block-diagonal causal ``attention_mask``.

    Returns:
        The batch dict (see :class:`padpipe.pipes.pack.Packer`).

    Example:
        >>> out = assemble([np.array([5, 6]), np.array([7])], [0, 0], 1, seq_len=4, position_offset=0,
        ...                pad_id=0, label_pad_id=-100, block_mask=False)
        >>> out["input_ids"].tolist(), out["labels"].tolist(), out["cu_seqlens"].tolist()
        ([[5, 6, 7, 0]], [[-100, 6, -100, -100]], [0, 2, 3, 4])
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
    document_ids = np.full((num_rows, seq_len), -1, dtype=np.int64)
    # flat index of each real token: its row's base plus its column
    dest = np.arange(len(flat), dtype=np.int64) + np.repeat(rows * seq_len + in_row - piece_start, lengths)
    input_ids.reshape(-1)[dest] = flat
    positions.reshape(-1)[dest] = position_offset + np.arange(len(flat)) - np.repeat(piece_start, lengths)
    document_ids.reshape(-1)[dest] = np.repeat(np.arange(len(rows)) - first_piece[rows], lengths)
    labels = np.where(document_ids >= 0, input_ids, label_pad_id)
    labels.reshape(-1)[rows * seq_len + in_row] = label_pad_id
    # segments for varlen kernels: each row's pieces, then its padding run when it has one
    pad_run = seq_len - used
    segments = np.insert(lengths, first_piece[1:], pad_run)
    segments = segments[segments > 0]
    cu_seqlens = np.zeros(len(segments) + 1, dtype=np.int32)
    np.cumsum(segments, out=cu_seqlens[1:])
    out: dict[str, Any] = {
        "input_ids": torch.from_numpy(input_ids),
        "position_ids": torch.from_numpy(positions),
        "document_ids": torch.from_numpy(document_ids),
        "labels": torch.from_numpy(labels),
        "cu_seqlens": torch.from_numpy(cu_seqlens),
        "max_seqlen": int(segments.max()),
    }
    if block_mask:
        out["attention_mask"] = block_causal_mask(rows, in_row, lengths, num_rows, seq_len)
    return out


def block_causal_mask(
    rows: np.ndarray, starts: np.ndarray, lengths: np.ndarray, num_rows: int, seq_len: int
) -> torch.Tensor:
    """Boolean ``[B, 1, L, L]`` mask, True where query ``q`` may attend to key ``k``.

    Allowed: same piece and ``k <= q``; a padding slot attends to itself only, so no query row is
    all False (which would give NaN in softmax). One block copy per piece: the work is the sum of
    squared piece lengths, not ``B * L * L`` comparisons.

    Args:
        rows: Row of each piece.
        starts: Column where each piece starts.
        lengths: Length of each piece.
        num_rows: Rows ``B``.
        seq_len: Row length ``L``.

    Example:
        >>> m = block_causal_mask(np.array([0, 0]), np.array([0, 2]), np.array([2, 1]), 1, 4)
        >>> m[0, 0].int().tolist()
        [[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]]
    """
    mask = np.zeros((num_rows, 1, seq_len, seq_len), dtype=bool)
    causal = _causal(seq_len)
    for r, s, n in zip(rows.tolist(), starts.tolist(), lengths.tolist()):
        mask[r, 0, s : s + n, s : s + n] = causal[:n, :n]
    used = np.bincount(rows, weights=lengths, minlength=num_rows).astype(np.int64)
    pad = seq_len - used  # each row's padding run: columns used[r] .. seq_len - 1
    pad_row = np.repeat(np.arange(num_rows), pad)
    pad_col = np.arange(len(pad_row)) - np.repeat(_exclusive_cumsum(pad)[:-1], pad) + used[pad_row]
    mask[pad_row, 0, pad_col, pad_col] = True
    return torch.from_numpy(mask)


@functools.lru_cache(maxsize=4)
def _causal(seq_len: int) -> np.ndarray:
    causal = np.tri(seq_len, dtype=bool)
    causal.flags.writeable = False
    return causal
