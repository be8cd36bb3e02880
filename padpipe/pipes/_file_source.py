"""The file readers' common base: paths on any fsspec store, one shared listing, retries, lost files.

:class:`FileSource` adds to :class:`~padpipe.pipes._source.UnitSource` what reading files from
object storage needs:

* the listing (glob plus per-file metadata) is made once per pipeline and shared with its other
  loaders and DataLoader workers (:mod:`padpipe.pipes._listing`);
* a transient storage error while listing, opening or reading is retried with backoff
  (:mod:`padpipe.pipes._retry`); a read that failed mid-unit re-opens the file and goes on from
  the current ``(unit, row)``, so no row is lost or repeated; when retries run out, a
  ``DataError`` names the file, the attempts and the last error;
* a file that vanished or changed size since it was listed is a ``DataError`` naming it, or with
  ``on_missing="skip"`` is skipped (rest of it) and counted as ``read.missing_file``; resume stays
  exact because the position moves past it like past any unit.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Literal, Sequence, TypeVar

import pyarrow as pa

from padpipe._shard import Consumer
from padpipe.errors import DataError, one_of
from padpipe.pipes._listing import SharedListing
from padpipe.pipes._paths import ChangedFileError, FileRef, FolderFiles, check_paths, expand_paths
from padpipe.pipes._retry import Attempts, Retry, call, is_transient
from padpipe.pipes._schema import check_columns
from padpipe.pipes._source import DEFAULT_CHUNK_ROWS, UnitSource, WorkUnit
from padpipe.stats import PipelineStats

LOST = (FileNotFoundError, ChangedFileError)
RETRIES = "read.retries"
T = TypeVar("T")


class FileSource(UnitSource):
    """Base of the file readers (Parquet, Arrow IPC, JSONL); subclasses implement ``list_files``.

    Args:
        paths: A file, folder, glob or list of them; local or any fsspec URL (``s3://``,
            ``gs://``, ``hf://``, ``https://``, ``file://``).
        columns: Columns to read, in this order (default: all).
        chunk_rows: Most rows per emitted record batch.
        storage_options: Keyword arguments for the fsspec filesystem (credentials, endpoint).
        seed: Shuffle the unit order per epoch with ``(seed, epoch)``; ``None`` keeps file order.
        consumer: This reader's share of the units; default: detected on first ``reset``.
        stats: Counters to report into.
        retries: Retries of a transient storage error (an int), or a
            :class:`~padpipe.pipes._retry.Retry` policy for backoff and total time as well.
        on_missing: A file gone or resized since listing: ``"raise"`` a ``DataError`` naming
            it, or ``"skip"`` it (counted in stats as ``read.missing_file``).
        listing: The pipeline's shared listing (the facade passes one); default: this reader's own.

    Example:
        >>> from padpipe.pipes.read_parquet import ParquetReader  # a FileSource
        >>> reader = ParquetReader(paths="s3://bucket/train/*.parquet", retries=Retry(retries=8, max_seconds=300),
        ...                        on_missing="skip", storage_options={"anon": True})  # doctest: +SKIP
        >>> reader.reset(); reader.stats.snapshot().counters.get("read.retries", 0)  # doctest: +SKIP
        0
    """

    SUFFIXES: tuple[str, ...] = ()
    LISTING_ATTRS: tuple[str, ...] = ("_files",)  # what list_files sets besides the units

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
    ) -> None:
        super().__init__(chunk_rows=chunk_rows, seed=seed, consumer=consumer, stats=stats)
        one_of("on_missing", on_missing, ("raise", "skip"))
        if listing is not None and not isinstance(listing, SharedListing):
            raise TypeError(f"`listing` must be a SharedListing, but is {listing!r} instead.")
        self.paths = check_paths(paths)
        self.columns = check_columns(columns)
        self.storage_options = dict(storage_options or {})
        self.retry = Retry.of(retries)
        self.on_missing = on_missing
        self.listing = listing if listing is not None else SharedListing()
        self._files: dict[str, Any] = {}
        self._attempts = Attempts(self.retry)
        self._lost: set[str] = set()

    # -- subclass hooks -----------------------------------------------------------------------------
    def list_files(self) -> list[WorkUnit]:
        """List the input (I/O: glob, footers) and set the ``LISTING_ATTRS`` attributes."""
        raise NotImplementedError

    def drop_handles(self) -> None:
        """Close the files the reader keeps open between units (after an error, before re-opening)."""

    def reopen(self) -> None:
        """Get ready to re-read the current unit from the current row after a transient error."""
        self.drop_handles()

    # -- helpers for subclasses ---------------------------------------------------------------------
    def expand(self, folder_files: FolderFiles | None = None) -> list[FileRef]:
        """The files ``paths`` name (see :func:`~padpipe.pipes._paths.expand_paths`), listing retried."""
        options = {"suffixes": self.SUFFIXES, "storage_options": self.storage_options, "folder_files": folder_files}
        return self.retried(f"listing {list(self.paths)!r}", lambda: expand_paths(self.paths, **options))

    def retried(self, what: str, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` with transient errors retried (counted as ``read.retries``); ``what`` names the file."""
        return call(self.retry, what, fn, *args, on_retry=lambda: self.stats.add(RETRIES, 1))

    # -- UnitSource ---------------------------------------------------------------------------------
    def list_units(self) -> list[WorkUnit]:
        def make() -> tuple[list[WorkUnit], dict[str, Any]]:
            units = self.list_files()
            return units, {name: getattr(self, name) for name in self.LISTING_ATTRS}

        key = f"{type(self).__name__} {self.describe()} storage_options={self.storage_options!r}"
        units, attrs = self.listing.get(key, make)
        for name, value in attrs.items():
            setattr(self, name, value)
        return units

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        super().reset(initial_state)
        self._attempts.succeeded()
        self.drop_handles()

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
                self.reopen()
                self._attempts.failed(exc, f"{unit.path}: cannot read unit {unit.index} from row {self._row}")
                self.stats.add(RETRIES, 1)
                continue
            self._attempts.succeeded()
            return batch

    def _read(self, unit: WorkUnit, start_row: int) -> Iterator[pa.RecordBatch]:
        return iter(()) if unit.path in self._lost else super()._read(unit, start_row)

    def _recoverable(self, exc: BaseException) -> bool:
        return isinstance(exc, LOST) or is_transient(exc)

    def _lose_file(self, exc: BaseException) -> None:
        """A file gone or resized since listing: raise, or skip the rest of it and count it once."""
        unit = self._order[self._unit]
        self._reader = None
        self.drop_handles()
        if self.on_missing == "raise":
            found = str(exc) if isinstance(exc, ChangedFileError) else f"{unit.path}: vanished since it was listed ({exc})"
            raise DataError(f"{found}; pass on_missing='skip' to skip such files.") from exc
        if unit.path not in self._lost:
            self._lost.add(unit.path)
            self.stats.record_skip("read.missing_file", 1)
        self._unit, self._row = self._unit + 1, 0
