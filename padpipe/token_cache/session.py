"""The token cache in a built pipeline: the reader serves cached rows and marks the rest to be cached.

Each built pipeline (per loader, per DataLoader worker) opens one :class:`CacheSession` of the recipe's
:class:`~padpipe.token_cache.plan.CachePlan` and hands it, through the build context, to the reader, the cached
stage and the buffers between them (:mod:`padpipe.token_cache.state`). The reader's pieces walk the published
segments (:mod:`padpipe.token_cache.walk`) and the rest is tokenized and published
(:mod:`padpipe.token_cache.fill`), in the same order and batch sizes as without a cache (docs/cache.md).
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from padpipe.chunks import TokenChunk
from padpipe.readers.source import UnitSource, WorkUnit
from padpipe.stats import PipelineStats
from padpipe.token_cache import rows as cr
from padpipe.token_cache import state
from padpipe.token_cache.chat_rows import CachedChat
from padpipe.token_cache.check import segment_problem
from padpipe.token_cache.fill import CachedTokenizer, CacheFiller, Collector
from padpipe.token_cache.plan import CachePlan
from padpipe.token_cache.store import CacheError, Segment, ipc_bytes
from padpipe.token_cache.walk import BYTES, ROWS, Walk, span, unit_kind

_VERSION_KEYS = ("ETag", "etag", "generation", "mtime", "LastModified", "last_modified", "updated", "created")


class CacheSession:
    """One built pipeline's use of a token cache: the reader's hook, the collector, its units, counters and the
    references its buffers save (:class:`padpipe.buffers.References`).

    Args:
        plan: The recipe's cache.
        stats: Counters (``cache.hit_rows``, ``cache.miss_rows``, ``cache.bad_files``, ...).
    """

    def __init__(self, plan: CachePlan, stats: PipelineStats) -> None:
        self.plan, self.store, self.about, self.fields = plan, plan.store, plan.about, plan.fields
        self.fingerprint = digest(plan.about)
        self.id_type = plan.id_type
        self.hidden = cr.hidden_types(self.id_type, type_ids=plan.type_ids, chat=plan.chat)
        self.stats = stats
        self.key = f"{self.store.url()}|{self.fingerprint}"  # resolved: a relative path and its absolute form agree
        self.writable = True
        self.keep_ref = False  # whether tokenize keeps row references on its chunks (a bucket stage follows)
        self.collector = Collector(self)
        self._filler: CacheFiller | None = None
        self._ready_pid = -1
        self._units: dict[tuple[str, int, int], tuple[int, str]] = {}
        self._listed: list[WorkUnit] | None = None
        self._by_index: dict[tuple[str, int], WorkUnit] = {}
        self._versions: dict[str, str] = {}
        self._lock = threading.Lock()
        self._folders: list[str] = []  # unit number -> folder (references carry the number)
        self._numbers: dict[str, int] = {}
        self._covered: dict[int, set[tuple[int, int]]] = {}  # unit number -> published [lo, hi) ranges seen

    # -- hooks for the builders ----------------------------------------------------------------------
    def tokenizer(self, tokenize: Any) -> Any:
        """The tokenize stage's function with the cache: tokenize text rows, convert cached ones."""
        return CachedTokenizer(tokenize, self)

    def chat(self, chat: Any) -> Any:
        """The chat stage's function with the cache: render text rows, read back cached ones."""
        return CachedChat(chat, self)

    def filler(self, node: Any) -> CacheFiller:
        """The node after the cached stage's threads that hands fresh rows to the collector."""
        self._filler = CacheFiller(node, self)
        return self._filler

    def references_after(self, node: Any) -> CacheSession | None:
        """This session, for a bucket stage right after the ``tokenize`` it fills (``node``: its chunks then keep
        their rows' references, which the bucket saves instead of its buffered rows); else ``None``."""
        if node is not self._filler or self.plan.chat:
            return None
        self.keep_ref = True
        return self

    # -- the reader hook ----------------------------------------------------------------------------
    def rows(self, reader: UnitSource, unit: WorkUnit, start_row: int) -> Iterator[pa.RecordBatch]:
        """The rows of piece ``unit`` from its row ``start_row``, cached or as text to tokenize."""
        whole = self._whole(reader, unit)
        lo, hi = span(reader, whole, unit)
        self.ready()
        reader.format.drop_position_hint()  # the piece is read in parts: a saved block offset means nothing here
        kind = unit_kind(reader, whole)
        uid, folder = self._unit(reader, whole, kind)
        walk = Walk(self, reader, unit, whole, kind, uid, folder, start_row)
        if kind == BYTES:
            yield from walk.run(whole.start + lo, whole.start + hi, skip=start_row)
        elif kind == ROWS:
            yield from walk.run(lo + start_row, hi)
        else:
            yield from walk.run(start_row, None)

    # -- the buffers' references (padpipe.buffers.References) ------------------------------------------
    def chunk(self, ref: pa.Array) -> dict[str, Any] | None:
        """The compact state of token rows with references ``ref``, or ``None`` unless the cache holds them all."""
        return state.references(self, ref)

    def records(self, batch: pa.RecordBatch) -> dict[str, Any] | None:
        """The compact state of reader rows, or ``None`` (rows not tokenized yet are saved whole)."""
        return None if (cr.state_of(batch) == cr.TEXT).any() else state.references(self, batch.column(cr.REF))

    def resolve_chunk(self, saved: dict[str, Any], truncate_to: int | None) -> TokenChunk:
        """The token rows a compact state names, read back (cut to ``truncate_to`` tokens)."""
        return state.resolve_chunk(self, saved, truncate_to)

    def resolve_records(self, saved: dict[str, Any]) -> pa.RecordBatch:
        """The reader rows a compact state names, read back."""
        return state.resolve(self, saved)

    # -- units and segments -------------------------------------------------------------------------
    def unit_number(self, folder: str) -> int:
        """This session's number for a unit folder (references carry it instead of the folder)."""
        with self._lock:
            if folder not in self._numbers:
                self._numbers[folder] = len(self._folders)
                self._folders.append(folder)
            return self._numbers[folder]

    def unit_folder(self, uid: int) -> str:
        """The folder of a unit number."""
        with self._lock:
            return self._folders[uid]

    def covered(self, uid: int, positions: np.ndarray) -> bool:
        """Whether every position of unit ``uid`` is in a segment this session published or read."""
        with self._lock:
            spans = sorted(self._covered.get(uid, ()))
        if not spans:
            return False
        los = np.array([s[0] for s in spans], np.int64)
        his = np.maximum.accumulate(np.array([s[1] for s in spans], np.int64))
        index = np.searchsorted(los, positions, side="right") - 1
        return bool(np.all(index >= 0) and np.all(positions < his[np.maximum(index, 0)]))

    def _mark_covered(self, uid: int, lo: int, hi: int) -> None:
        with self._lock:
            self._covered.setdefault(uid, set()).add((lo, hi))

    def segments(self, folder: str) -> list[Segment]:
        """The unit's published segments ([] when the cache cannot be read under ``on_write_error='skip'``)."""
        try:
            return self.store.segments(folder)
        except CacheError:
            if self.plan.on_write_error == "raise":
                raise
            self.stats.add("cache.read_errors", 1)
            return []

    def load(self, folder: str, segment: Segment, uid: int, kind: str | None) -> pa.Table | None:
        """A segment's rows after its checks, or ``None`` (counted as ``cache.bad_files``, deleted)."""
        table = self.store.read(folder, segment)
        if table is not None and segment_problem(table, segment, kind, self.plan) is not None:
            table = None
        if table is None:
            self.stats.add("cache.bad_files", 1)
            self.store.remove(folder, segment)
            return None
        self._mark_covered(uid, segment.lo, segment.hi)
        return table

    def publish(self, uid: int, folder: str, segment: Segment, rows: pa.Table) -> None:
        """Write a complete segment (called by the collector's writer thread)."""
        if not self.writable:
            return
        try:
            published = self.store.write(folder, segment, ipc_bytes(rows))
        except CacheError as exc:
            self._write_failed(exc)
            return
        self._mark_covered(uid, segment.lo, segment.hi)
        self.stats.add("cache.written_files", 1)
        self.stats.add("cache.written_bytes", published.nbytes)

    def ready(self) -> None:
        """Once per process: write ``about.json`` (which proves the location writable), sweep stale temporary files."""
        if self._ready_pid == os.getpid():
            return
        self._ready_pid = os.getpid()
        try:
            self.store.describe(self.fingerprint, self.about)
        except CacheError as exc:
            self._write_failed(exc)
        swept = self.store.sweep(self.fingerprint)  # left by writers that died
        if swept:
            self.stats.add("cache.swept_temp_files", swept)

    # -- helpers ------------------------------------------------------------------------------------
    def _write_failed(self, exc: CacheError) -> None:
        if self.plan.on_write_error == "raise":
            hint = "; pass cache=pp.TokenCache(path, on_write_error='skip') to go on without writing (counted)"
            raise CacheError(f"{str(exc).rstrip('.')}{hint}.") from exc
        self.writable = False
        self.stats.add("cache.write_errors", 1)

    def _whole(self, reader: UnitSource, piece: WorkUnit) -> WorkUnit:
        """The listed unit a piece (of this epoch's share, or re-shared by an elastic resume) was cut from."""
        units = reader.listed_units()
        if self._listed is not units:
            self._by_index = {(u.path, u.index): u for u in units}
            self._listed = units
        return self._by_index[(piece.path, piece.index)]

    def _unit(self, reader: UnitSource, whole: WorkUnit, kind: str) -> tuple[int, str]:
        """This session's number for ``whole`` and its folder (``-1`` when it cannot be cached)."""
        key = (whole.path, whole.index, whole.start)
        cacheable = kind != BYTES or reader.format.record_row_positions()  # rows cut by bytes are keyed by position
        if key not in self._units:
            if not cacheable:
                self._units[key] = (-1, "")
            else:
                identity = {
                    "reader": type(reader).__name__,
                    "input": reader.format.describe(),
                    "kind": kind,
                    "file": self._file_identity(reader, whole.path),
                    "index": whole.index,
                    "start": whole.start,
                    "stop": whole.stop,
                    "rows": whole.num_rows,
                }
                folder = f"{self.fingerprint}/{digest(identity)}"
                self._units[key] = (self.unit_number(folder), folder)
        return self._units[key]

    def _file_identity(self, reader: UnitSource, path: str) -> str:
        """The file's name, size, version and content digest, as listed: a changed file is a different unit.

        A file rewritten after the listing fails the reader's check before it is read, never hitting old ids.
        """
        ref = reader.file_of(path)
        if ref is None or not hasattr(ref, "fs"):
            return path
        if path not in self._versions:
            identity = ref.identity  # name, size, version (mtime/ETag) and content digest, from the listing
            if ref.listed_version is None:
                info = ref.fs.info(ref.path)
                identity += f"\t{next((str(info[k]) for k in _VERSION_KEYS if info.get(k) is not None), None)}"
            self._versions[path] = identity
        return self._versions[path]


def digest(value: Any) -> str:
    """A short stable hash of a JSON-able value.

    Example:
        >>> digest({"a": 1}) == digest({"a": 1}), len(digest("x"))
        (True, 20)
    """
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:20]
