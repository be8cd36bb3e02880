"""The token cache in a built pipeline: the reader serves cached rows and marks the rest to be cached.

A :class:`CacheSession` is made per built pipeline (per loader, per DataLoader worker) from the
user's :class:`padpipe.cache.TokenCache`. The reader calls :meth:`CacheSession.rows` for each
piece it reads; it walks the piece's positions (row numbers of the whole unit, or byte offsets of
a JSONL range, or row numbers from the start for a unit that cannot be cut) over the segments
published for that unit so far:

* a stretch some segment covers comes from that segment (memory-mapped; size, CRC and its rows
  checked first, see :mod:`padpipe.token_cache.check`; a file that fails is counted as
  ``cache.bad_files``, deleted and tokenized again);
* a stretch none covers is read from the source as text, tagged with its positions, and split into
  segments of :data:`~padpipe.token_cache.walk.SEGMENT_ROWS` rows (aligned to multiples of it where rows are numbered),
  each
  announced to the :class:`~padpipe.token_cache.fill.Collector` once all its rows are out; the
  collector publishes a segment when all of its rows have been tokenized downstream.

Cut points move from epoch to epoch, so a piece is assembled from whatever segments cover it,
tokenizing only what is missing. Rows come out in the same order and batch sizes as without a
cache (the reader's boundaries depend on row numbers only), so every later stage sees the same
stream.
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

from padpipe.readers.source import UnitSource, WorkUnit
from padpipe.stats import PipelineStats
from padpipe.token_cache import rows as cr
from padpipe.token_cache.chat_fill import CachedChat
from padpipe.token_cache.check import Limits, segment_problem
from padpipe.token_cache.fill import CachedTokenizer, CacheFiller, Collector
from padpipe.token_cache.store import CacheError, Segment, Store, ipc_bytes
from padpipe.token_cache.walk import BYTES, ROWS, Walk, span, unit_kind

_VERSION_KEYS = ("ETag", "etag", "generation", "mtime", "LastModified", "last_modified", "updated", "created")

_lock = threading.Lock()
_uids: dict[tuple[str, str], int] = {}  # (store key, unit folder) -> unit number in this process
_folders: list[tuple[str, str]] = []
_covered: dict[int, set[tuple[int, int]]] = {}  # unit number -> published [lo, hi) ranges seen here
_sessions: dict[str, CacheSession] = {}  # store key -> the latest session on it in this process


class CacheSession:
    """One built pipeline's use of a token cache (reader hook, collector, counters).

    Args:
        store: Where the cache lives.
        fingerprint: The tokenizer and tokenize options' fingerprint (see :func:`fingerprint`).
        about: What the fingerprint stands for (written once to ``about.json``).
        id_type: The Arrow type ids are kept in.
        type_ids: Whether the tokenizer makes token type ids.
        fields: The columns a segment stores as nulls: the text columns (for chat, the conversation columns).
        on_write_error: ``"raise"`` a :class:`CacheError` naming the path, or ``"skip"``: count
            it as ``cache.write_errors`` and go on without writing.
        stats: Counters (``cache.hit_rows``, ``cache.miss_rows``, ``cache.bad_files``, ...).
        vocab_size: Every id is below it (a segment that holds another is a bad file).
        max_length: Most tokens a row can have (``None``: no limit); a longer row makes a bad file.
        chat: Whether it caches the chat stage (a segment row holds what a conversation became: its token
            rows, trained flags and counters; see :mod:`padpipe.token_cache.chat_rows`) rather than ``tokenize``.
    """

    def __init__(
        self,
        store: Store,
        fingerprint: str,
        about: dict[str, Any],
        *,
        id_type: pa.DataType,
        type_ids: bool,
        fields: tuple[str, ...],
        on_write_error: str,
        stats: PipelineStats,
        vocab_size: int,
        max_length: int | None,
        chat: bool = False,
    ) -> None:
        self.store, self.fingerprint, self.about = store, fingerprint, about
        self.id_type, self.type_ids, self.fields = id_type, type_ids, fields
        self.limits = Limits(id_type, type_ids, vocab_size, max_length, chat)
        self.hidden = cr.hidden_types(id_type, type_ids=type_ids, chat=chat)
        self.on_write_error = on_write_error
        self.stats = stats
        self.key = f"{store.url()}|{fingerprint}"  # the resolved location: a relative path and its absolute form agree
        self.writable = True
        self.keep_ref = False  # whether tokenize keeps row references on its chunks (a bucket stage follows)
        self.collector = Collector(self)
        self._ready_pid = -1
        self._units: dict[tuple[str, int, int], tuple[int, str]] = {}
        self._listed: list[WorkUnit] | None = None
        self._by_index: dict[tuple[str, int], WorkUnit] = {}
        self._versions: dict[str, str] = {}
        with _lock:
            _sessions[self.key] = self

    # -- hooks for the builders ----------------------------------------------------------------------
    def tokenizer(self, tokenize: Any) -> Any:
        """The tokenize stage's function with the cache: tokenize text rows, convert cached ones."""
        return CachedTokenizer(tokenize, self)

    def chat(self, chat: Any) -> Any:
        """The chat stage's function with the cache: render text rows, read back cached ones."""
        return CachedChat(chat, self)

    def filler(self, node: Any) -> Any:
        """The node after the tokenize threads that hands fresh rows to the collector."""
        return CacheFiller(node, self)

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

    # -- segments -----------------------------------------------------------------------------------
    def segments(self, folder: str) -> list[Segment]:
        """The unit's published segments ([] when the cache cannot be read under ``on_write_error='skip'``)."""
        try:
            return self.store.segments(folder)
        except CacheError:
            if self.on_write_error == "raise":
                raise
            self.stats.add("cache.read_errors", 1)
            return []

    def load(self, folder: str, segment: Segment, uid: int, kind: str | None) -> pa.Table | None:
        """A segment's rows after its checks, or ``None`` (counted as ``cache.bad_files``, deleted)."""
        table = self.store.read(folder, segment)
        if table is not None and segment_problem(table, segment, kind, self.limits) is not None:
            table = None
        if table is None:
            self.stats.add("cache.bad_files", 1)
            self.store.remove(folder, segment)
            return None
        mark_covered(uid, segment.lo, segment.hi)
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
        mark_covered(uid, segment.lo, segment.hi)
        self.stats.add("cache.written_files", 1)
        self.stats.add("cache.written_bytes", published.nbytes)

    # -- helpers ------------------------------------------------------------------------------------
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

    def _write_failed(self, exc: CacheError) -> None:
        if self.on_write_error == "raise":
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
        """This process's number for ``whole`` and its folder (``-1`` when it cannot be cached)."""
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
                self._units[key] = (unit_number(self.key, folder), folder)
        return self._units[key]

    def _file_identity(self, reader: UnitSource, path: str) -> str:
        """The file's name, size, version and content digest, as listed: a changed file is a different unit.

        The reader checks the file against its listing once per epoch before reading from it
        (``FileSource._check_file``), so a file rewritten with the same size and mtime after this
        pipeline listed it is a ``ChangedFileError`` (the reader's ``on_missing`` applies), never a
        hit on the old ids.
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


def unit_number(store_key: str, folder: str) -> int:
    """This process's number for a unit folder (refs carry it instead of the folder)."""
    with _lock:
        if (store_key, folder) not in _uids:
            _uids[(store_key, folder)] = len(_folders)
            _folders.append((store_key, folder))
        return _uids[(store_key, folder)]


def unit_folder(uid: int) -> tuple[str, str]:
    """``(store key, folder)`` of a unit number."""
    with _lock:
        return _folders[uid]


def mark_covered(uid: int, lo: int, hi: int) -> None:
    """Record that positions ``[lo, hi)`` of unit ``uid`` are in a published segment."""
    with _lock:
        _covered.setdefault(uid, set()).add((lo, hi))


def covered(uid: int, positions: np.ndarray) -> bool:
    """Whether every position of unit ``uid`` is in a segment published or read in this process."""
    with _lock:
        spans = sorted(_covered.get(uid, ()))
    if not spans:
        return False
    los = np.array([s[0] for s in spans], np.int64)
    his = np.maximum.accumulate(np.array([s[1] for s in spans], np.int64))
    index = np.searchsorted(los, positions, side="right") - 1
    return bool(np.all(index >= 0) and np.all(positions < his[np.maximum(index, 0)]))


def session_for(store_key: str) -> CacheSession | None:
    """The session on ``store_key`` in this process, if a pipeline with that cache was built here."""
    with _lock:
        return _sessions.get(store_key)
