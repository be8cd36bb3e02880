"""The token cache after the shuffle buffer: tokenize what is text, convert what is cached, collect segments.

:class:`CachedTokenizer` replaces the tokenize stage's function in its threads: text rows are tokenized exactly
as without a cache, cached rows become token chunks without a tokenizer call. :class:`CacheFiller` hands freshly
tokenized rows to the :class:`Collector`, which publishes a segment in a background thread once it is whole.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
from torchdata.nodes import BaseNode

from padpipe.chunks import TokenChunk
from padpipe.readers.aligned import concat
from padpipe.state import Child, StateSchema
from padpipe.token_cache import rows as cr
from padpipe.token_cache.plan import Session
from padpipe.token_cache.store import Segment
from padpipe.tokenizer.rows import ChunkTokenizer, as_text_column, bad_rows, pass_through


@dataclass(frozen=True)
class Filled:
    """A tokenized chunk, and the rows of it that were tokenized now (segment-file form, with their units)."""

    chunk: TokenChunk
    fresh: pa.RecordBatch | None = None
    units: np.ndarray | None = None


@dataclass(frozen=True)
class CachedTokenizer:
    """Tokenize the text rows of a batch with the stage's ``tokenize``, convert its cached rows (thread-safe)."""

    tokenize: ChunkTokenizer
    session: Session

    def __call__(self, batch: pa.RecordBatch) -> Filled:
        fields, stats = self.tokenize.fields, self.tokenize.stats
        if not isinstance(batch, pa.RecordBatch) or cr.STATE not in batch.schema.names:
            return Filled(self.tokenize(batch))  # rows from a state saved without the cache: plain text
        state = cr.state_of(batch)
        parts: list[tuple[np.ndarray, TokenChunk]] = []
        fresh = units = None
        text = state == cr.TEXT
        if text.any():
            rows = batch if text.all() else batch.filter(pa.array(text))
            source = cr.without_hidden(rows)
            bad = None
            if all(f in source.schema.names for f in fields):
                bad = bad_rows(source, [as_text_column(source.column(f)) for f in fields])
            chunk = self.tokenize(source)  # raises or skips bad rows exactly as without a cache
            good = np.ones(rows.num_rows, bool) if bad is None else ~bad
            ref = rows.column(cr.REF)
            units = cr.split_refs(ref.to_numpy())[0]
            if (units >= 0).any():
                fresh = cr.segment_rows(rows, chunk, fields, self.session.id_type, good)
            parts.append((np.flatnonzero(text)[good], self._with_ref(chunk, ref.filter(pa.array(good)))))
        with stats.timer("cache"):
            cached = state == cr.CACHED
            if cached.any():
                rows = batch.filter(pa.array(cached))
                columns = pass_through(cr.without_hidden(rows), fields)
                chunk = cr.chunk_of(rows, columns)
                stats.add("tokenize.rows", chunk.num_rows)
                stats.add("tokenize.tokens", chunk.num_tokens)
                parts.append((np.flatnonzero(cached), self._with_ref(chunk, rows.column(cr.REF))))
            stats.record_skip("tokenize.bad_text", int((state == cr.BAD).sum()))
            return Filled(_merge(parts), fresh, units)

    def _with_ref(self, chunk: TokenChunk, ref: pa.Array) -> TokenChunk:
        if not self.session.keep_ref:
            return chunk
        return TokenChunk(chunk.ids, chunk.offsets, chunk.type_ids, {**chunk.columns, cr.REF: ref})


def _merge(parts: list[tuple[np.ndarray, TokenChunk]]) -> TokenChunk:
    """The parts' rows back in the batch's order (each part: its rows' places in the batch, its chunk)."""
    if not parts:
        return TokenChunk.empty()
    if len(parts) == 1:
        return parts[0][1]
    places = np.concatenate([p[0] for p in parts])
    return TokenChunk.concat([p[1] for p in parts]).take(np.argsort(places, kind="stable"))


class CacheFiller(BaseNode[TokenChunk]):
    """After the cached stage's threads: pass the chunks on, hand fresh rows to the collector.

    ``reset`` checks that the location is writable; write errors from the writer thread are raised here (or
    counted: ``on_write_error``); at an epoch's end it waits for the pending writes. Its state holds its
    source's and the cache's fingerprint, checked on resume.
    """

    STATE = StateSchema("CacheFiller", 1, source=Child())

    def __init__(self, source: BaseNode, session: Session) -> None:
        super().__init__()
        self.source = source
        self.session = session

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        super().reset(initial_state)
        self.session.ready()  # an unwritable location fails here, in the consumer's thread
        self.session.collector.clear()
        self.source.reset(None if initial_state is None else self.STATE.check(initial_state, self._settings()).source)

    def next(self) -> TokenChunk:
        collector = self.session.collector
        collector.check()
        try:
            item = next(self.source)
        except StopIteration:
            collector.drain()
            raise
        if item.fresh is not None:
            collector.add(item.units, item.fresh)
        return item.chunk

    def get_state(self) -> dict[str, Any]:
        return self.STATE.make(self._settings(), source=self.source.state_dict())

    def _settings(self) -> dict[str, Any]:
        return {"fingerprint": self.session.fingerprint}


@dataclass
class _Pending:
    uid: int
    folder: str
    segment: Segment
    rows: int
    parts: list[pa.RecordBatch]
    count: int = 0

    def take(self, batch: pa.RecordBatch) -> pa.RecordBatch | None:
        """Keep the rows of ``batch`` in this segment; return the others (``None`` when none)."""
        positions = batch.column(cr.POS).to_numpy()
        inside = (positions >= self.segment.lo) & (positions < self.segment.hi)
        if inside.all():
            self.parts.append(batch)
            self.count += batch.num_rows
            return None
        if inside.any():
            self.parts.append(batch.filter(pa.array(inside)))
            self.count += int(inside.sum())
        return batch.filter(pa.array(~inside))


class Collector:
    """Fresh rows sorted into announced segments; complete segments written by one background thread."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.generation = 0
        self._lock = threading.Lock()
        self._open: dict[int, list[_Pending]] = {}
        self._orphans: dict[int, list[pa.RecordBatch]] = {}  # rows whose segment is not announced yet
        self._writer: ThreadPoolExecutor | None = None
        self._writes: list[Future] = []

    def clear(self) -> None:
        """Forget rows and announcements of the pass being replaced (each reset starts a new generation)."""
        with self._lock:
            self.generation += 1
            self._open.clear()
            self._orphans.clear()

    def expect(self, generation: int, uid: int, folder: str, segment: Segment, rows: int) -> None:
        """The reader has sent all ``rows`` rows of ``segment``; publish it when they are all tokenized."""
        with self._lock:
            if generation != self.generation or not self.session.writable:
                return
            pending = _Pending(uid, folder, segment, rows, [])
            left = [rest for batch in self._orphans.pop(uid, []) if (rest := pending.take(batch)) is not None]
            if left:
                self._orphans[uid] = left
            if pending.count >= rows:
                self._publish(pending)
            else:
                self._open.setdefault(uid, []).append(pending)

    def add(self, units: np.ndarray, fresh: pa.RecordBatch) -> None:
        """Route freshly tokenized rows (segment-file form) to their segments."""
        if not self.session.writable:  # after a write error under on_write_error='skip'
            return
        with self._lock:
            for uid in np.unique(units[units >= 0]).tolist():
                batch: pa.RecordBatch | None = fresh.filter(pa.array(units == uid))
                pending = self._open.get(uid, [])
                for p in list(pending):
                    batch = p.take(batch) if batch is not None else None
                    if p.count >= p.rows:
                        pending.remove(p)
                        self._publish(p)
                if batch is not None and batch.num_rows:
                    self._orphans.setdefault(uid, []).append(batch)

    def check(self) -> None:
        """Raise the first error of a finished write (``on_write_error='raise'``)."""
        done = [f for f in self._writes if f.done()]
        self._writes = [f for f in self._writes if not f.done()]
        for future in done:
            future.result()

    def drain(self) -> None:
        """Wait for every pending write (the end of an epoch)."""
        writes, self._writes = self._writes, []
        for future in writes:
            future.result()

    def _publish(self, pending: _Pending) -> None:
        table = _segment_table(pending, self.session)
        if table is None:
            self.session.stats.add("cache.dropped_segments", 1)
            return
        if self._writer is None:
            self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="padpipe-cache-writer")
        self._writes.append(
            self._writer.submit(self.session.publish, pending.uid, pending.folder, pending.segment, table)
        )


def _segment_table(pending: _Pending, session: Session) -> pa.Table | None:
    """The segment's rows sorted by position, or ``None`` when they are not exactly its rows."""
    segment = pending.segment
    if not pending.parts:
        schema = pa.schema([*session.hidden.items(), (cr.STATE, pa.int8()), (cr.POS, pa.int64())])
        return schema.empty_table()
    batch = concat(pending.parts)
    positions = batch.column(cr.POS).to_numpy()
    order = np.argsort(positions, kind="stable")
    positions = positions[order]
    if len(positions) != pending.rows or np.any(np.diff(positions) <= 0):
        return None
    if positions[0] < segment.lo or positions[-1] >= segment.hi:
        return None
    # without the batches' row origins (which file and row each came from: the reader's tag, kept for errors):
    # cached rows make no errors, and the same rows must make the same bytes whichever batches they came in
    return pa.Table.from_batches([batch.take(pa.array(order))]).replace_schema_metadata(None)
