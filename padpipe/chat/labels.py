"""Token rows with a trained mask: cut to ``max_length`` (from the start, or after the last whole trained span
that fits) and without the rows left with no trained token (vectorized)."""

from __future__ import annotations

import numpy as np

IGNORE = -100
"""The label of a token that is not trained (what ``torch.nn.CrossEntropyLoss`` ignores)."""
TRUNCATION = ("keep_start", "turns")


def cut(
    offsets: np.ndarray, trained: np.ndarray, max_length: int | None, truncation: str
) -> tuple[np.ndarray, np.ndarray]:
    """The new length of every row, and which tokens are kept.

    ``"keep_start"`` keeps a longer row's first ``max_length`` tokens; ``"turns"`` keeps it up to the
    end of its last run of trained tokens that ends within ``max_length`` (so no trained span is cut
    through; the rest of the row goes with it). Rows that fit are kept whole either way.

    Example:
        >>> offsets, trained = np.array([0, 6]), np.array([0, 1, 1, 0, 1, 1], bool)
        >>> cut(offsets, trained, 5, "keep_start")[0].tolist(), cut(offsets, trained, 5, "turns")[0].tolist()
        ([5], [3])
    """
    lengths = np.diff(offsets)
    if max_length is None or not len(lengths) or lengths.max() <= max_length:
        return lengths, np.ones(len(trained), dtype=bool)
    position = positions(offsets)
    new = np.minimum(lengths, max_length)
    if truncation == "turns":
        row = np.repeat(np.arange(len(lengths)), lengths)
        following = np.append(trained[1:], False) & (np.append(row[1:], -1) == row)
        run_end = trained & ~following  # the last token of a run of trained tokens
        fits = run_end & (position < max_length)
        ends = np.zeros(len(lengths), dtype=np.int64)
        np.maximum.at(ends, row[fits], position[fits] + 1)
        new = np.where(lengths > max_length, ends, lengths)
    return new, position < np.repeat(new, lengths)


def positions(offsets: np.ndarray) -> np.ndarray:
    """Each token's position in its row.

    Example:
        >>> positions(np.array([0, 2, 5])).tolist()
        [0, 1, 0, 1, 2]
    """
    lengths = np.diff(offsets)
    return np.arange(int(offsets[-1]), dtype=np.int64) - np.repeat(offsets[:-1], lengths)


def row_sums(offsets: np.ndarray, values: np.ndarray) -> np.ndarray:
    """The sum of ``values`` over each row.

    Example:
        >>> row_sums(np.array([0, 2, 2, 5]), np.array([1, 1, 0, 1, 0])).tolist()
        [2, 0, 1]
    """
    rows = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
    return np.bincount(rows, weights=values, minlength=len(offsets) - 1).astype(np.int64)
