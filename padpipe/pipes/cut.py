"""Vectorized helpers of the bucketizer: the longest row a budget allows, oversize rows, cutting batches."""

from __future__ import annotations

import numpy as np

from padpipe.chunks import TokenChunk, truncate_rows
from padpipe.stats import PipelineStats


def cut_by_budget(padded_sorted: np.ndarray, max_tokens: int) -> np.ndarray:
    """Greedy batch sizes over rows sorted by length so that ``rows x padded length <= max_tokens``.

    A batch ``[i, j]`` fits when ``(j - i + 1) * p[j] <= max_tokens``, i.e. when
    ``g[j] = j + 1 - max_tokens // p[j] <= i``; ``g`` is strictly increasing, so each batch's last
    row is one ``searchsorted`` (no per-row loop).

    Args:
        padded_sorted: Padded length of every row, ascending, each at most ``max_tokens``.
        max_tokens: The budget on padded tokens per batch.

    Returns:
        The batch sizes, in order; they sum to ``len(padded_sorted)``.

    Example:
        >>> cut_by_budget(np.array([2, 2, 3, 4, 8]), 8).tolist()
        [2, 2, 1]
    """
    padded = np.maximum(np.asarray(padded_sorted, dtype=np.int64), 1)  # empty rows still count as a row
    n = len(padded)
    fits_before = np.arange(1, n + 1, dtype=np.int64) - max_tokens // padded
    sizes = []
    start = 0
    while start < n:
        end = int(np.searchsorted(fits_before, start, side="right"))  # one past the batch's last row
        sizes.append(end - start)
        start = end
    return np.asarray(sizes, dtype=np.int64)


def longest_row_allowed(max_tokens: int, pad_to_multiple_of: int | None, pad_to_length: int | None) -> int:
    """The longest row whose padded length alone fits ``max_tokens`` under the padding rules.

    Example:
        >>> longest_row_allowed(100, 8, None), longest_row_allowed(100, None, 64)
        (96, 64)
    """
    if pad_to_length is not None:
        if pad_to_length > max_tokens:
            raise ValueError(
                f"`max_tokens` must be at least `pad_to_length`={pad_to_length} (every row is padded to it), "
                f"but is {max_tokens} instead."
            )
        return pad_to_length
    multiple = pad_to_multiple_of or 1
    if max_tokens < multiple:
        raise ValueError(
            f"`max_tokens` must be at least `pad_to_multiple_of`={multiple} (the shortest padded row), "
            f"but is {max_tokens} instead."
        )
    return max_tokens // multiple * multiple


def handle_oversize(
    chunk: TokenChunk, limit: int, max_tokens: int | None, policy: str, stats: PipelineStats
) -> TokenChunk:
    """Apply ``policy`` (``"raise"``, ``"drop"``, ``"truncate"``) to rows longer than ``limit``.

    Drops are counted as ``bucket.oversize`` skips, truncations in the ``bucket.truncated`` counter.

    Example:
        >>> c = handle_oversize(TokenChunk.from_lists([[1, 2, 3], [4]]), 2, 2, "drop", PipelineStats())
        >>> c.ids.tolist()
        [4]
    """
    over = chunk.lengths > limit
    count = int(over.sum())
    if not count:
        return chunk
    if policy == "drop":
        stats.record_skip("bucket.oversize", count)
        return chunk.take(np.flatnonzero(~over))
    if policy == "truncate":
        stats.add("bucket.truncated", count)
        return truncate_rows(chunk, limit)
    longest = int(chunk.lengths.max())
    raise ValueError(
        f"bucket: a row of {longest} tokens does not fit `max_tokens`={max_tokens}: rows may have at most "
        f"{limit} tokens (after padding rules). Tokenize with max_length={limit} or less, "
        "or pass on_oversize='drop' or 'truncate' to bucket()."
    )
