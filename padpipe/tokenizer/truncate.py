"""``longest_first`` pair truncation in numpy, equal to the Rust tokenizer's, without its overflow cost.

When the Rust tokenizer truncates a pair, it also builds every "overflowing" window of both texts and their cross
product (``len(a) / k * len(b) / k`` encodings for a window of ``k`` tokens), which nobody here reads: at
``max_length=128`` on long pairs that is most of the tokenizer's time. So pairs are encoded untruncated and cut here,
with the same arithmetic as ``tokenizers``' ``truncate_encodings`` (``tokenizers/src/utils/truncation.rs``): the
special tokens of the template stay, and each text keeps its first (``"right"``) or last (``"left"``) tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain
from operator import attrgetter

import numpy as np

_SEQUENCE_IDS = attrgetter("sequence_ids")


def pair_keep_lengths(n1: np.ndarray, n2: np.ndarray, limit: int) -> tuple[np.ndarray, np.ndarray]:
    """Tokens each text keeps under ``longest_first`` when ``n1 + n2 > limit`` (vectorized).

    Args:
        n1: Tokens of the first text, per row.
        n2: Tokens of the second text, per row.
        limit: Tokens left for both texts (``max_length`` less the template's special tokens).

    Example:
        >>> [x.tolist() for x in pair_keep_lengths(np.array([2, 8, 4]), np.array([8, 8, 2]), 7)]
        [[2, 3, 4], [5, 4, 2]]
    """
    short, long = np.minimum(n1, n2), np.maximum(n1, n2)
    swapped = n1 > n2
    keep_long = np.where(short > limit, short, np.maximum(short, limit - short))
    keep_short = short.copy()
    both = keep_short + keep_long > limit
    keep_short[both] = limit // 2
    keep_long[both] = limit // 2 + limit % 2
    keep_long = np.minimum(keep_long, long)  # only matters for rows that fit already
    return np.where(swapped, keep_long, keep_short), np.where(swapped, keep_short, keep_long)


def truncate_pairs(
    encodings: Sequence, lengths: np.ndarray, offsets: np.ndarray, rows: np.ndarray, limit: int, side: str
) -> tuple[np.ndarray, np.ndarray]:
    """A keep-mask over the flat tokens of a batch that truncates the pair rows ``rows``.

    Args:
        encodings: The untruncated Rust encodings of the batch.
        lengths: Tokens per row.
        offsets: Flat offsets of the rows.
        rows: The rows longer than ``max_length`` (``int64`` indices).
        limit: ``max_length`` less the special tokens the template adds to a pair.
        side: ``"right"`` keeps each text's first tokens, ``"left"`` its last.

    Returns:
        ``(mask, kept)``: a boolean mask over all tokens of the batch, ``False`` for the tokens
        cut away, and the new length of each row of ``rows``.
    """
    # sequence id per token of the long rows: 0 first text, 1 second text, -1 special token
    seq = np.array(list(chain.from_iterable(map(_SEQUENCE_IDS, (encodings[r] for r in rows)))), dtype=np.float64)
    seq = np.where(np.isnan(seq), -1, seq).astype(np.int8)
    row_lengths = lengths[rows]
    row_of = np.repeat(np.arange(len(rows)), row_lengths)
    keep = seq < 0
    counts = [np.bincount(row_of[seq == s], minlength=len(rows)) for s in (0, 1)]
    kept = pair_keep_lengths(counts[0], counts[1], limit)
    for s in (0, 1):
        mine = seq == s
        n, k = counts[s], kept[s]
        before = np.concatenate(([0], np.cumsum(n)[:-1]))  # tokens of this text in earlier rows
        position = np.cumsum(mine) - 1 - before[row_of]  # index of a token within its text
        first_kept = np.zeros_like(n) if side == "right" else n - k
        keep |= mine & (position >= first_kept[row_of]) & (position < (first_kept + k)[row_of])
    # where the long rows' tokens sit in the flat batch
    starts = offsets[rows]
    local = np.arange(int(row_lengths.sum()), dtype=np.int64) - np.repeat(
        np.cumsum(row_lengths) - row_lengths, row_lengths
    )
    mask = np.ones(int(offsets[-1]), dtype=bool)
    mask[np.repeat(starts, row_lengths) + local] = keep
    return mask, np.bincount(row_of[keep], minlength=len(rows))
