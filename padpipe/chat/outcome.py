"""What the conversations of one batch became: token rows (each with the batch row it came from), their trained
tokens, and the counters each batch row added. The chat stage turns an :class:`Outcome` into a token chunk and
counters only then, so a token cache can store each conversation's part and give it back: the same chunk and
``stats()`` either way.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from padpipe.chunks import exclusive_cumsum

SKIP = "skip."
"""The prefix of a counter that counts skipped rows (``stats().skipped``), not a free-form counter."""


@dataclass(frozen=True)
class Outcome:
    """Token rows of a batch of conversations, in batch-row order, and the counters its rows added.

    Attributes:
        source: Per token row, the batch row it came from (ascending; a row may give 0, 1 or more).
        ids: The rows' ids, flat.
        offsets: Row ``i`` is ``ids[offsets[i]:offsets[i + 1]]``.
        trained: Per token, whether it is trained.
        counts: ``(batch row, counter, n)``: ``"chat.truncated"``, ``"chat.dropped_reasoning"``, ... or
            ``"skip.chat.<reason>"`` for a skipped row.

    Example:
        >>> one = Outcome(np.array([0]), np.array([5, 6], np.int32), np.array([0, 2]), np.array([False, True]))
        >>> two = Outcome(np.array([1, 1]), np.array([7, 8], np.int32), np.array([0, 1, 2]), np.array([True, True]))
        >>> both = Outcome.merge([two, one]); both.source.tolist(), both.ids.tolist(), both.offsets.tolist()
        ([0, 1, 1], [5, 6, 7, 8], [0, 2, 3, 4])
    """

    source: np.ndarray
    ids: np.ndarray
    offsets: np.ndarray
    trained: np.ndarray
    counts: list[tuple[int, str, int]] = field(default_factory=list)

    @property
    def lengths(self) -> np.ndarray:
        """Each row's number of tokens."""
        return np.diff(self.offsets)

    def totals(self) -> Counter[str]:
        """The counters summed over the batch rows.

        Example:
            >>> Outcome.empty([(0, "chat.truncated", 1), (3, "chat.truncated", 1)]).totals()
            Counter({'chat.truncated': 2})
        """
        totals: Counter[str] = Counter()
        for _, name, n in self.counts:
            totals[name] += n
        return totals

    @staticmethod
    def empty(counts: list[tuple[int, str, int]] | None = None) -> Outcome:
        """No token rows (only counters)."""
        return Outcome(
            np.zeros(0, np.int64), np.zeros(0, np.int32), np.zeros(1, np.int64), np.zeros(0, bool), counts or []
        )

    @staticmethod
    def merge(parts: Sequence[Outcome]) -> Outcome:
        """Outcomes of disjoint batch rows as one, rows back in batch-row order (a row's own rows keep theirs)."""
        if len(parts) == 1:
            return parts[0]
        if not parts:
            return Outcome.empty()
        source = np.concatenate([p.source for p in parts])
        order = np.argsort(source, kind="stable")
        lengths = np.concatenate([p.lengths for p in parts])[order]
        bases = exclusive_cumsum([int(p.offsets[-1]) for p in parts])  # where each part's ids start, end to end
        starts = np.concatenate([p.offsets[:-1] + base for p, base in zip(parts, bases)])[order]
        offsets = exclusive_cumsum(lengths)
        take = np.repeat(starts - offsets[:-1], lengths) + np.arange(int(offsets[-1]), dtype=np.int64)
        ids = np.concatenate([p.ids for p in parts])[take]
        trained = np.concatenate([p.trained for p in parts])[take]
        return Outcome(source[order], ids, offsets, trained, [c for p in parts for c in p.counts])
