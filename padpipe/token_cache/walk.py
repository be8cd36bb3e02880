"""The reader side of the token cache: one piece's walk over its unit's published segments and the gaps.

:class:`Walk` reads a stretch a segment covers from it (checked first; a file that fails is counted, deleted and
tokenized again), and a stretch none covers as text rows tagged with their positions, announced to the collector
segment by segment (:data:`SEGMENT_ROWS` rows each).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa

from padpipe.readers.source import UnitSource, WorkUnit
from padpipe.token_cache import rows as cr
from padpipe.token_cache.plan import Session
from padpipe.token_cache.store import Segment

SEGMENT_ROWS = 4096
ROWS, BYTES, WHOLE = "rows", "bytes", "whole"  # how a unit's positions are counted


class Walk:
    """One piece's walk over its unit's segments and gaps (see the module docs)."""

    def __init__(
        self,
        session: Session,
        reader: UnitSource,
        unit: WorkUnit,
        whole: WorkUnit,
        kind: str,
        uid: int,
        folder: str,
        start_row: int,
    ) -> None:
        self.session, self.reader, self.unit, self.whole, self.kind = session, reader, unit, whole, kind
        self.uid, self.folder, self.start_row = uid, folder, start_row
        self.generation = session.collector.generation

    def run(self, start: int, stop: int | None, skip: int = 0) -> Iterator[pa.RecordBatch]:
        segments = self.session.segments(self.folder) if self.uid >= 0 else []
        self.skip, p = skip, start
        while stop is None or p < stop:
            segment = _covering(segments, p)
            table = None if segment is None else self.session.load(self.folder, segment, self.uid, self.kind)
            if segment is not None and table is None:
                segments.remove(segment)
                continue
            if segment is not None and table is not None:
                end = segment.hi if stop is None else min(segment.hi, stop)
                positions = table.column(cr.POS).to_numpy()
                a, b = np.searchsorted(positions, [p, end])
                yield from self._out(cr.as_cached_rows(table.slice(a, b - a), self.uid), cached=True)
                p = end
                if segment.end and stop is None:
                    return
                continue
            gap_end = min((s.lo for s in segments if s.lo > p), default=stop)
            after, ended = yield from self._fill(p, gap_end)
            if ended or after <= p:  # the unit's end, or a source shorter than its metadata said
                return
            p = after

    def _out(self, batch: pa.RecordBatch, *, cached: bool) -> Iterator[pa.RecordBatch]:
        if self.skip:
            drop = min(self.skip, batch.num_rows)
            batch, self.skip = batch.slice(drop), self.skip - drop
        if batch.num_rows:
            self.session.stats.add("cache.hit_rows" if cached else "cache.miss_rows", batch.num_rows)
            yield batch

    def _text(self, p: int, gap_end: int | None) -> Iterator[pa.RecordBatch]:
        """Source rows from position ``p`` (to ``gap_end``; the base reader stops at the piece's end)."""
        reader, whole = self.reader, self.whole
        if self.kind == WHOLE:
            return reader.rows(self.unit, p)
        reader.format.drop_position_hint()
        if self.kind == BYTES:  # rows to skip are skipped here, counted from the gap's start
            return reader.rows(reader.format.piece(whole, p - whole.start, int(gap_end) - whole.start), 0)  # type: ignore[arg-type]
        return reader.rows(reader.format.piece(whole, p, int(gap_end)), 0)  # type: ignore[arg-type]

    def _fill(self, p: int, gap_end: int | None) -> Iterator[pa.RecordBatch]:
        """Text rows of ``[p, gap_end)``, announced segment by segment; returns ``(next position, unit ended)``.

        Row-numbered segments end at multiples of :data:`SEGMENT_ROWS`; JSONL segments hold
        :data:`SEGMENT_ROWS` rows each and end where the next one's first row starts.
        """
        s, bytes_kind = self.session, self.kind == BYTES
        seg_lo, seg_rows, known, full = p, 0, True, False
        position, skipped, done = p, self.skip > 0, False
        for batch in self._text(p, gap_end):
            if bytes_kind:
                positions = batch.column(cr.POS).to_numpy()
                if gap_end is not None and len(positions) and positions[-1] >= gap_end:
                    keep = int(np.searchsorted(positions, gap_end))
                    batch, positions, done = batch.slice(0, keep), positions[:keep], True
                if self.skip:
                    drop = min(self.skip, batch.num_rows)
                    batch, positions, self.skip = batch.slice(drop), positions[drop:], self.skip - drop
            else:
                take = batch.num_rows if gap_end is None else min(batch.num_rows, gap_end - position)
                batch, positions = batch.slice(0, take), np.arange(position, position + take, dtype=np.int64)
                done = gap_end is not None and position + take >= gap_end
            for part, pos in self._parts(batch, positions, seg_rows):
                if bytes_kind and (full or (skipped and seg_rows == 0)):
                    if full:
                        self._announce(seg_lo, int(pos[0]), False, seg_rows, known)
                    seg_lo, seg_rows, known, full, skipped = int(pos[0]), 0, True, False, False
                yield from self._out(cr.as_text_rows(part, cr.refs(self.uid, pos), s.hidden), cached=False)
                seg_rows, known = seg_rows + len(pos), known and bool(pos.min() >= 0)
                position = int(pos[-1]) + 1
                if bytes_kind:
                    full = seg_rows == SEGMENT_ROWS
                elif position % SEGMENT_ROWS == 0:
                    self._announce(seg_lo, position, False, seg_rows, known)
                    seg_lo, seg_rows, known = position, 0, True
            if done:
                break
        ended = self.kind == WHOLE and not done
        if bytes_kind:
            if not skipped:  # rows were skipped and none came after: nothing to announce
                self._announce(seg_lo, int(gap_end), False, seg_rows, known)  # type: ignore[arg-type]
            return int(gap_end), False  # type: ignore[arg-type]
        if seg_rows or ended:
            self._announce(seg_lo, position, ended, seg_rows, known)
        return position, ended

    def _parts(
        self, batch: pa.RecordBatch, positions: np.ndarray, seg_rows: int
    ) -> Iterator[tuple[pa.RecordBatch, np.ndarray]]:
        """Cut a text batch where segments end: at multiples of SEGMENT_ROWS, or every SEGMENT_ROWS rows (JSONL)."""
        if not len(positions):
            return
        if self.kind == BYTES:
            cuts = list(range((SEGMENT_ROWS - seg_rows) % SEGMENT_ROWS or SEGMENT_ROWS, len(positions), SEGMENT_ROWS))
        else:
            first = int(positions[0])
            cuts = list(range(_next_bound(first) - first, len(positions), SEGMENT_ROWS))
        start = 0
        for stop in cuts + [len(positions)]:
            if stop > start:
                yield batch.slice(start, stop - start), positions[start:stop]
            start = stop

    def _announce(self, lo: int, hi: int, end: bool, rows: int, known: bool) -> None:
        if self.uid >= 0 and known and hi >= lo:
            self.session.collector.expect(self.generation, self.uid, self.folder, Segment(lo, hi, end, 0, 0), rows)


def _next_bound(position: int) -> int:
    """The next segment boundary after ``position`` in a row-numbered unit."""
    return (position // SEGMENT_ROWS + 1) * SEGMENT_ROWS


def _covering(segments: list[Segment], p: int) -> Segment | None:
    """The segment reaching furthest that covers position ``p`` (an empty last segment covers its start)."""
    best = None
    for s in segments:
        if (s.lo <= p < s.hi or (s.end and s.lo == s.hi == p)) and (best is None or s.hi > best.hi):
            best = s
    return best


def span(reader: UnitSource, whole: WorkUnit, piece: WorkUnit) -> tuple[int, int]:
    """Where ``piece`` lies in ``whole``, ``[lo, hi)`` in the unit's measure (rows, or bytes for a JSONL range).

    The inverse of ``reader.format.piece``: readers narrow a unit by its row range (``first``/``last``),
    or by its index or byte range (``start``/``stop``).

    Example:
        >>> whole = WorkUnit("a.parquet", 0, num_rows=100)
        >>> span(None, whole, WorkUnit("a.parquet", 0, num_rows=30, first=50, last=80))
        (50, 80)
    """
    if whole.num_rows is None:
        if whole.stop is None or not reader.format.measure(whole).cuttable:  # a whole unit
            return 0, reader.format.measure(whole).weight
        return piece.start - whole.start, piece.stop - whole.start  # type: ignore[operator]
    if (piece.start, piece.stop) != (whole.start, whole.stop):  # an index range (datasets.Dataset)
        return piece.start - whole.start, piece.stop - whole.start  # type: ignore[operator]
    last = piece.last if piece.last is not None else whole.first + whole.num_rows
    return piece.first - whole.first, last - whole.first


def unit_kind(reader: UnitSource, unit: WorkUnit) -> str:
    """How the cache counts positions in ``unit``: row numbers, byte offsets (JSONL) or rows of a whole unit."""
    measure = reader.format.measure(unit)
    if not measure.cuttable:
        return WHOLE
    return ROWS if unit.num_rows is not None else BYTES
