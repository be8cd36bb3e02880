"""Counters every stage reports into: rows, tokens, padding, skips and time per stage.

``print(loader.stats())`` gives a short report people can read; ``loader.stats().as_dict()`` the same figures
under flat, stable keys for loggers (docs/inspect.md lists them).
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields

OVERLAP = "stages overlap in threads, so shares may sum past 100%"
"""Why the stage times of ``str(stats)`` may add up to more than the wall time."""


@dataclass(frozen=True)
class StatsSnapshot:
    """A consistent copy of a pipeline's counters; the snapshots of processes that read one pipeline add up.

    Attributes:
        rows: Rows that reached the output (batched or packed).
        batches: Batches produced; in ``loader.stats()``, those the loader returned to the loop (those trained,
            where a trainer notes them: ``PipelineLoader.trained``).
        real_tokens: Non-padding tokens in the output.
        padded_tokens: Token slots in the output, padding included.
        skipped: Rows dropped under an explicit policy, by reason.
        seconds: Wall time spent inside each stage's own work, by stage.
        counters: Other per-stage counters, ``"stage.name" -> value``.
        wall_seconds: Seconds from the pipeline's first work to this snapshot (0.0 before it).

    Example:
        >>> snap = StatsSnapshot(rows=64, batches=2, real_tokens=900, padded_tokens=1024,
        ...                      skipped={"tokenize.bad_text": 1}, seconds={"tokenize": 0.5, "pad": 0.01},
        ...                      counters={}, wall_seconds=2.0)
        >>> print(snap)
        padpipe stats after 2.00 s
          rows     64 in 2 batches (32.0 rows per batch)
          tokens   900 real in 1,024 slots: padding efficiency 87.9%
          skipped  1 (tokenize.bad_text 1)
          time per stage (share of the 2.00 s wall time; stages overlap in threads, so shares may sum past 100%):
            tokenize  0.500 s  25.0%
            pad       0.010 s   0.5%
        >>> snap.as_dict()["share/tokenize"], (snap + snap).rows
        (0.25, 128)
    """

    rows: int
    batches: int
    real_tokens: int
    padded_tokens: int
    skipped: dict[str, int]
    seconds: dict[str, float]
    counters: dict[str, int]
    wall_seconds: float = 0.0

    @property
    def padding_efficiency(self) -> float:
        """Real tokens divided by padded slots (1.0 means no padding); 0.0 before any batch."""
        return self.real_tokens / self.padded_tokens if self.padded_tokens else 0.0

    @property
    def time_share(self) -> dict[str, float]:
        """Each stage's own time over the wall time (threads overlap: a share may pass 1.0)."""
        wall = self.wall_seconds
        return {stage: (s / wall if wall > 0 else 0.0) for stage, s in self.seconds.items()}

    def as_dict(self) -> dict[str, int | float]:
        """The snapshot as one flat dict with stable keys, for loggers (see the module docs).

        Example:
            >>> snap = StatsSnapshot(rows=2, batches=1, real_tokens=5, padded_tokens=8, skipped={},
            ...                      seconds={"pad": 0.5}, counters={"read.rows": 2}, wall_seconds=1.0)
            >>> snap.as_dict()  # doctest: +NORMALIZE_WHITESPACE
            {'rows': 2, 'batches': 1, 'real_tokens': 5, 'padded_tokens': 8, 'padding_efficiency': 0.625,
             'skipped': 0, 'wall_seconds': 1.0, 'seconds/pad': 0.5, 'share/pad': 0.5, 'counters/read.rows': 2}
        """
        out: dict[str, int | float] = {
            "rows": self.rows,
            "batches": self.batches,
            "real_tokens": self.real_tokens,
            "padded_tokens": self.padded_tokens,
            "padding_efficiency": self.padding_efficiency,
            "skipped": sum(self.skipped.values()),
            "wall_seconds": self.wall_seconds,
        }
        out.update({f"skipped/{reason}": n for reason, n in sorted(self.skipped.items())})
        out.update({f"seconds/{stage}": s for stage, s in sorted(self.seconds.items())})
        out.update({f"share/{stage}": s for stage, s in sorted(self.time_share.items())})
        out.update({f"counters/{name}": n for name, n in sorted(self.counters.items())})
        return out

    def merge(self, *others: StatsSnapshot) -> StatsSnapshot:
        """This snapshot plus ``others`` (say one per DataLoader worker): counts and times summed.

        Example:
            >>> a = StatsSnapshot(1, 1, 4, 4, {"x": 1}, {"pad": 1.0}, {}, wall_seconds=3.0)
            >>> b = StatsSnapshot(2, 1, 4, 8, {"x": 2}, {"pad": 0.5}, {"n": 1}, wall_seconds=2.0)
            >>> m = a.merge(b); m.rows, m.skipped, m.seconds, m.wall_seconds, m.padding_efficiency
            (3, {'x': 3}, {'pad': 1.5}, 3.0, 0.6666666666666666)
        """
        parts = (self, *others)
        summed = {f.name: [getattr(p, f.name) for p in parts] for f in fields(self)}
        totals = {name: _sum_dicts(v) if isinstance(v[0], dict) else sum(v) for name, v in summed.items()}
        return StatsSnapshot(**{**totals, "wall_seconds": max(summed["wall_seconds"])})  # they ran side by side

    def __add__(self, other: StatsSnapshot) -> StatsSnapshot:
        if not isinstance(other, StatsSnapshot):
            return NotImplemented
        return self.merge(other)

    def __str__(self) -> str:
        per_batch = f" ({self.rows / self.batches:.1f} rows per batch)" if self.batches else ""
        lines = [
            f"padpipe stats after {self.wall_seconds:.2f} s",
            f"  rows     {self.rows:,} in {self.batches:,} batches{per_batch}",
            f"  tokens   {self.real_tokens:,} real in {self.padded_tokens:,} slots: "
            f"padding efficiency {self.padding_efficiency:.1%}",
        ]
        skipped = sum(self.skipped.values())
        reasons = ", ".join(f"{reason} {n:,}" for reason, n in sorted(self.skipped.items()))
        lines.append(f"  skipped  {skipped:,}" + (f" ({reasons})" if reasons else ""))
        if self.seconds:
            lines.append(f"  time per stage (share of the {self.wall_seconds:.2f} s wall time; {OVERLAP}):")
            share = self.time_share
            width = max(len(stage) for stage in self.seconds)
            for stage, seconds in sorted(self.seconds.items(), key=lambda item: (-item[1], item[0])):
                lines.append(f"    {stage:<{width}}  {seconds:.3f} s  {share[stage]:>5.1%}")
        return "\n".join(lines)


def _sum_dicts(dicts: Iterable[dict]) -> dict:
    out: dict = {}
    for d in dicts:
        for key, value in d.items():
            out[key] = out.get(key, 0) + value
    return out


class PipelineStats:
    """Thread-safe counters shared by the stages of one built pipeline.

    The wall clock starts at the first thing a stage reports (time, a batch, a count), so a
    loader built long before its first batch does not count the wait.

    Example:
        >>> s = PipelineStats()
        >>> s.record_batch(rows=2, real_tokens=5, padded_tokens=8)
        >>> s.snapshot().padding_efficiency
        0.625
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._started: float | None = None
        self._rows = self._batches = self._real = self._padded = 0
        self._skipped: dict[str, int] = defaultdict(int)
        self._seconds: dict[str, float] = defaultdict(float)
        self._counters: dict[str, int] = defaultdict(int)
        self._included: list[Callable[[], StatsSnapshot]] = []

    def include(self, source: Callable[[], StatsSnapshot]) -> None:
        """Add ``source()`` (say, the counters of worker processes) to every later :meth:`snapshot`.

        Example:
            >>> s, other = PipelineStats(), PipelineStats()
            >>> other.record_batch(rows=3, real_tokens=3, padded_tokens=4)
            >>> s.include(other.snapshot); s.snapshot().rows
            3
        """
        with self._lock:
            self._included.append(source)

    def _start(self, now: float) -> None:
        """Start the wall clock at ``now`` unless it runs already (call with the lock held)."""
        if self._started is None:
            self._started = now

    def record_batch(self, *, rows: int, real_tokens: int, padded_tokens: int) -> None:
        """Count one output batch."""
        with self._lock:
            self._start(time.perf_counter())
            self._rows += rows
            self._batches += 1
            self._real += real_tokens
            self._padded += padded_tokens

    def record_skip(self, reason: str, count: int = 1) -> None:
        """Count rows dropped under an explicit policy, e.g. ``"tokenize.bad_text"``."""
        if count:
            with self._lock:
                self._start(time.perf_counter())
                self._skipped[reason] += count

    def add(self, name: str, value: int) -> None:
        """Add ``value`` to the free-form counter ``name`` (``"stage.what"``)."""
        with self._lock:
            self._start(time.perf_counter())
            self._counters[name] += value

    @contextmanager
    def timer(self, stage: str) -> Iterator[None]:
        """Add the wall time of the ``with`` block to ``stage``'s own time."""
        start = time.perf_counter()
        if self._started is None:
            with self._lock:
                self._start(start)
        try:
            yield
        finally:
            elapsed = time.perf_counter() - start
            with self._lock:
                self._seconds[stage] += elapsed

    def snapshot(self) -> StatsSnapshot:
        """A consistent copy of all counters (with those of any :meth:`include`-d source)."""
        own = self._own_snapshot()
        return own.merge(*(source() for source in list(self._included))) if self._included else own

    def _own_snapshot(self) -> StatsSnapshot:
        with self._lock:
            wall = 0.0 if self._started is None else time.perf_counter() - self._started
            counts = (self._rows, self._batches, self._real, self._padded)  # StatsSnapshot's fields, in order
            return StatsSnapshot(*counts, dict(self._skipped), dict(self._seconds), dict(self._counters), wall)
