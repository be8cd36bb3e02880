"""The file readers' common node: paths on any fsspec store, one shared listing, retries, lost files.

:class:`FileSource` adds to :class:`~padpipe.readers.source.UnitSource` the shared listing
(:mod:`padpipe.readers.listing`), retries (:mod:`padpipe.readers.retry`) with a failed read re-opened at the
current ``(unit, row)``, files checked against their listing each epoch (``on_missing``), a state's listing
digest (:mod:`padpipe.readers.listing_state`), and each batch's file and row in its schema metadata for errors.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar, Literal

import fsspec.core
import pyarrow as pa

from padpipe.errors import DataError, one_of
from padpipe.readers.files import RETRIES, FileAccess, FileFormat
from padpipe.readers.identity import ListingIdentity
from padpipe.readers.listing import SharedListing
from padpipe.readers.paths import ChangedFileError, FileRef, check_paths
from padpipe.readers.retry import Attempts, Retry, is_transient
from padpipe.readers.schema import check_columns, tag_source
from padpipe.readers.source import DEFAULT_CHUNK_ROWS, UnitSource, WorkUnit
from padpipe.sharing.consumer import Consumer
from padpipe.stats import PipelineStats

LOST = (FileNotFoundError, ChangedFileError)
IDENTITY = "_identity"  # the listing identity's key among a shared listing's attributes


class FileSource(UnitSource):
    """The node of the file readers (Parquet, Arrow IPC, JSONL, CSV); a reader names its ``FORMAT``.

    Args:
        paths: A file, folder, glob or list of them; local or any fsspec URL (``s3://``, ``hf://``, ...).
        columns: Columns to read, in this order (default: all).
        chunk_rows, seed, consumer, stats: As :class:`~padpipe.readers.source.ReaderNode`'s.
        storage_options: Keyword arguments for the fsspec filesystem (credentials, endpoint).
        retries: Retries of a transient storage error (an int), or a :class:`~padpipe.readers.retry.Retry`.
        on_missing: A file gone or changed since listing: ``"raise"`` a ``DataError`` naming it, or
            ``"skip"`` it (counted as ``read.missing_file``).
        listing: The pipeline's shared listing (the facade passes one); default: this reader's own.
        **options: The format's own settings (passed to ``FORMAT``).

    Example:
        >>> from padpipe.readers.parquet import ParquetReader  # a FileSource
        >>> reader = ParquetReader(paths="s3://bucket/train/*.parquet", retries=Retry(retries=8, max_seconds=300),
        ...                        on_missing="skip", storage_options={"anon": True})  # doctest: +SKIP
        >>> reader.reset(); reader.stats.snapshot().counters.get("read.retries", 0)  # doctest: +SKIP
        0
    """

    VERSION = 3
    FORMAT: ClassVar[type[FileFormat]]
    SUFFIXES: tuple[str, ...] = ()  # the FORMAT's, for the facade's checks of paths
    format: FileFormat
    identity: ListingIdentity

    def __init__(
        self,
        *,
        paths: str | Sequence[str],
        columns: Sequence[str] | None = None,
        chunk_rows: int = DEFAULT_CHUNK_ROWS,
        storage_options: dict[str, Any] | None = None,
        seed: int | None = None,
        consumer: Consumer | None = None,
        stats: PipelineStats | None = None,
        retries: int | Retry = 5,
        on_missing: Literal["raise", "skip"] = "raise",
        listing: SharedListing | None = None,
        **options: Any,
    ) -> None:
        one_of("on_missing", on_missing, ("raise", "skip"))
        if listing is not None and not isinstance(listing, SharedListing):
            raise TypeError(f"`listing` must be a SharedListing, but is {listing!r} instead.")
        self.paths = check_paths(paths)
        self.columns = check_columns(columns)
        self.storage_options = dict(storage_options or {})
        self.retry = Retry.of(retries)
        stats = stats or PipelineStats()
        self.access = FileAccess(self.paths, self.storage_options, self.retry, stats)
        fmt = self.FORMAT(self.access, name=type(self).__name__, columns=self.columns, chunk_rows=chunk_rows, **options)
        super().__init__(fmt, chunk_rows=chunk_rows, seed=seed, consumer=consumer, stats=stats)
        self.on_missing = on_missing
        self.listing = listing if listing is not None else SharedListing()
        self.identity = ListingIdentity(type(self).__name__)
        self._attempts = Attempts(self.retry)
        self._lost: set[str] = set()
        self._first_rows: dict[tuple[str, int], int] | None = None

    # -- the token cache's hooks ------------------------------------------------------------------
    def file_of(self, path: str) -> Any:
        """The listed file a unit at ``path`` is read from (``None`` before listing, or for no such file)."""
        return self.format.files.get(path)

    def listed_files(self) -> dict[str, Any]:
        """Each listed file by name (empty before listing)."""
        return dict(self.format.files)

    # -- UnitSource ---------------------------------------------------------------------------------
    def _list(self) -> list[WorkUnit]:
        """The format's units, from the pipeline's shared listing (listed by the first reader that needs it)."""
        fmt = self.format
        names = (*fmt.LISTING, IDENTITY)

        def make() -> tuple[list[WorkUnit], dict[str, Any]]:
            units = fmt.list_units()
            return units, {name: getattr(fmt, name) for name in fmt.LISTING} | {IDENTITY: self.access.identity}

        def decode(data: Any) -> tuple[list[WorkUnit], dict[str, Any]]:
            units, attrs = listing_from_plain(data, self.storage_options)
            if set(attrs) != set(names):
                raise KeyError(f"the shared listing has {sorted(attrs)}, expected {sorted(names)}")
            return units, attrs

        key = f"{type(self).__name__} {fmt.describe()} storage_options={self.storage_options!r}"
        units, attrs = self.listing.get(key, make, encode=listing_to_plain, decode=decode)
        for name, value in attrs.items():
            if name == IDENTITY:
                self.identity.text = value
            else:
                setattr(fmt, name, value)
        return units

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        super().reset(initial_state)
        self._attempts.succeeded()
        self.format.close()
        self.identity.new_epoch()
        if initial_state is not None:
            refs = [self.file_of(name) for name in dict.fromkeys(u.path for u in self._order[self._unit :])]
            self.identity.check_resumed(refs, cached=self.cache is not None, retried=self.access.retried)

    def next(self) -> pa.RecordBatch:
        while True:
            try:
                batch = super().next()
            except StopIteration:
                raise
            except LOST as exc:
                self._lose_file(exc)
                continue
            except Exception as exc:
                if not is_transient(exc):
                    raise
                unit = self._order[self._unit]
                self._reader = None
                self.format.reopen()
                self._attempts.failed(exc, f"{unit.path}: cannot read unit {unit.index} from row {self._row}")
                self.stats.add(RETRIES, 1)
                continue
            self._attempts.succeeded()
            unit = self._order[self._unit]
            return tag_source(batch, unit.path, *self._where(unit, unit.first + self._row - batch.num_rows))

    def _where(self, unit: WorkUnit, row: int) -> tuple[int, str]:
        """``(row, counted in what)`` of row ``row`` of ``unit``: a row of the file (``""``) where rows before it are
        known."""
        if self._first_rows is None:  # each unit's first row in its file (-1: not known), from the listing
            self._first_rows, counted = {}, dict[str, int | None]()
            for u in self.listed_units():
                before = counted.get(u.path, 0)
                self._first_rows[(u.path, u.index)] = -1 if before is None else before
                counted[u.path] = None if before is None or u.num_rows is None else before + u.num_rows
        first = self._first_rows.get((unit.path, unit.index), -1)
        if first >= 0 and (unit.num_rows is not None or unit.start == 0):
            return first + row, ""
        return row, f"its byte range from byte {unit.start}" if unit.stop is not None else f"its unit {unit.index}"

    def _read(self, unit: WorkUnit, start_row: int) -> Iterator[pa.RecordBatch]:
        if unit.path in self._lost:
            return iter(())
        self.identity.check_unchanged(
            self.file_of(unit.path), cached=self.cache is not None, retried=self.access.retried
        )
        return super()._read(unit, start_row)

    def _recoverable(self, exc: BaseException) -> bool:
        return isinstance(exc, LOST) or is_transient(exc)

    def _lose_file(self, exc: BaseException) -> None:
        """A file gone or resized since listing: raise, or skip the rest of it and count it once."""
        unit = self._order[self._unit]
        self._reader = None
        self.format.close()
        if self.on_missing == "raise":
            found = (
                str(exc) if isinstance(exc, ChangedFileError) else f"{unit.path}: vanished since it was listed ({exc})"
            )
            raise DataError(f"{found}; pass on_missing='skip' to skip such files.") from exc
        if unit.path not in self._lost:
            self._lost.add(unit.path)
            self.stats.record_skip("read.missing_file", 1)
        self._unit, self._row = self._unit + 1, 0


# -- the listing as plain data (shared by worker processes through a private JSON file) ------------
def listing_to_plain(listing: tuple[list[WorkUnit], dict[str, Any]]) -> dict[str, Any]:
    """A reader's listing (units and listing attributes) as JSON-able data; see :func:`listing_from_plain`.

    Example:
        >>> units = [WorkUnit("a.jsonl", 0, None, 0, 10)]
        >>> listing_to_plain((units, {"_identity": "a.jsonl\\t10\\t1.0"}))["units"]
        [['a.jsonl', 0, None, 0, 10]]
    """
    units, attrs = listing
    filesystems: list[tuple[Any, str]] = []
    plain_units = [[u.path, u.index, u.num_rows, u.start, u.stop] for u in units]
    return {
        "units": plain_units,
        "attrs": {k: _to_plain(v, filesystems) for k, v in attrs.items()},
        "filesystems": [url for _, url in filesystems],
    }


def listing_from_plain(data: Any, storage_options: dict[str, Any]) -> tuple[list[WorkUnit], dict[str, Any]]:
    """Inverse of :func:`listing_to_plain`; filesystems are made from their URLs and ``storage_options``."""
    filesystems = [fsspec.core.url_to_fs(url, **storage_options)[0] for url in data["filesystems"]]
    units = [
        WorkUnit(str(p), int(i), None if n is None else int(n), int(a), None if b is None else int(b))
        for p, i, n, a, b in data["units"]
    ]
    return units, {str(k): _from_plain(v, filesystems) for k, v in data["attrs"].items()}


def _to_plain(value: Any, filesystems: list[tuple[Any, str]]) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, FileRef):
        index = next((i for i, (fs, _) in enumerate(filesystems) if fs is value.fs), len(filesystems))
        if index == len(filesystems):
            filesystems.append((value.fs, value.fs.unstrip_protocol(value.path)))
        return {"t": "file", "v": [index, value.path, value.listed_size, value.listed_version, value.listed_content]}
    if isinstance(value, dict):
        return {"t": "dict", "v": [[str(k), _to_plain(v, filesystems)] for k, v in value.items()]}
    if isinstance(value, pa.Schema):
        return {"t": "schema", "v": base64.b64encode(value.serialize().to_pybytes()).decode()}
    raise TypeError(f"cannot share a listing that holds a {type(value).__name__}")


def _from_plain(data: Any, filesystems: list[Any]) -> Any:
    if not isinstance(data, dict):
        return data
    kind, value = data["t"], data["v"]
    if kind == "file":
        index, path, size, version, content = value
        return FileRef(filesystems[index], str(path), size, version, content)
    if kind == "dict":
        return {str(k): _from_plain(v, filesystems) for k, v in value}
    if kind == "schema":
        return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(value)))
    raise ValueError(f"unknown listing value kind {kind!r}")
