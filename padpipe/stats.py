"""Counters every stage reports into: rows, tokens, padding, skips and time per stage."""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator


@dataclass(frozen=True)
class StatsSnapshot:
    """A consistent copy of a pipeline's counters.

    Attributes:
        rows: Rows that reached the output (batched or packed).
        batches: Batches produced.
        real_tokens: Non-padding tokens in the output.
        padded_tokens: Token slots in the output, padding included.
        skipped: Rows dropped under an explicit policy, by reason.
        seconds: Wall time spent inside each stage's own work, by stage.
        counters: Other per-stage counters, ``"stage.name" -> value``.
    """

    rows: int
    batches: int
    real_tokens: int
    padded_tokens: int
    skipped: dict[str, int]
    seconds: dict[str, float]
    counters: dict[str, int]

    @property
    def padding_efficiency(self) -> float:
        """Real tokens divided by padded slots (1.0 means no padding); 0.0 before any batch."""
        return self.real_tokens / self.padded_tokens if self.padded_tokens else 0.0

    def __str__(self) -> str:
        skipped = sum(self.skipped.values())
        return (
            f"rows={self.rows} batches={self.batches} real_tokens={self.real_tokens} "
            f"padded_tokens={self.padded_tokens} efficiency={self.padding_efficiency:.3f} skipped={skipped}"
        )


class PipelineStats:
    """Thread-safe counters shared by the stages of one built pipeline.

    Example:
        >>> s = PipelineStats()
        >>> s.record_batch(rows=2, real_tokens=5, padded_tokens=8)
        >>> s.snapshot().padding_efficiency
        0.625
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rows = 0
        self._batches = 0
        self._real = 0
        self._padded = 0
        self._skipped: dict[str, int] = defaultdict(int)
        self._seconds: dict[str, float] = defaultdict(float)
        self._counters: dict[str, int] = defaultdict(int)

    def record_batch(self, *, rows: int, real_tokens: int, padded_tokens: int) -> None:
        """Count one output batch."""
        with self._lock:
            self._rows += rows
            self._batches += 1
            self._real += real_tokens
            self._padded += padded_tokens

    def record_skip(self, reason: str, count: int = 1) -> None:
        """Count rows dropped under an explicit policy, e.g. ``"tokenize.bad_text"``."""
        if count:
            with self._lock:
                self._skipped[reason] += count

    def add(self, name: str, value: int) -> None:
        """Add ``value`` to the free-form counter ``name`` (``"stage.what"``)."""
        with self._lock:
            self._counters[name] += value

    @contextmanager
    def timer(self, stage: str) -> Iterator[None]:
        """Add the wall time of the ``with`` block to ``stage``'s own time."""
        start = time.perf_counter()
        try:
            yield
        finally:
            elapsed = time.perf_counter() - start
            with self._lock:
                self._seconds[stage] += elapsed

    def snapshot(self) -> StatsSnapshot:
        """A consistent copy of all counters."""
        with self._lock:
            return StatsSnapshot(
                rows=self._rows,
                batches=self._batches,
                real_tokens=self._real,
                padded_tokens=self._padded,
                skipped=dict(self._skipped),
                seconds=dict(self._seconds),
                counters=dict(self._counters),
            )
