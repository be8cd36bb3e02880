"""What a file format gets from its reader: the paths to list, retries, and the files it listed.

A :class:`FileFormat` lists units from the files :meth:`FileAccess.expand` finds and opens the
:class:`~padpipe.readers.paths.FileRef` of a unit to read it, retried by :meth:`FileAccess.retried`; the rest is
the reader's (:class:`~padpipe.readers.file_source.FileSource`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import pyarrow as pa

from padpipe.readers.format import Format
from padpipe.readers.paths import FileRef, FolderFiles, expand_paths
from padpipe.readers.retry import Retry, call
from padpipe.stats import PipelineStats

LOCAL_THREADS, REMOTE_THREADS = 8, 32  # files read at once at listing (their first and last bytes, footers)
RETRIES = "read.retries"
T = TypeVar("T")


class FileAccess:
    """The paths a file reader reads, and retried access to them.

    Args:
        paths: Checked paths (:func:`~padpipe.readers.paths.check_paths`).
        storage_options: Keyword arguments for the fsspec filesystem.
        retry: The retry policy of transient storage errors.
        stats: Counters (retries are counted as ``read.retries``).
    """

    def __init__(
        self, paths: Sequence[str], storage_options: dict[str, Any], retry: Retry, stats: PipelineStats
    ) -> None:
        self.paths, self.storage_options, self.retry, self.stats = paths, storage_options, retry, stats
        self.identity = ""  # the listing identity of the last expand: one line a file

    def expand(self, suffixes: tuple[str, ...], folder_files: FolderFiles | None = None) -> list[FileRef]:
        """The files ``paths`` name (see :func:`~padpipe.readers.paths.expand_paths`), listing retried, measured."""
        files = self.retried(
            f"listing {list(self.paths)!r}",
            lambda: expand_paths(
                self.paths, suffixes=suffixes, storage_options=self.storage_options, folder_files=folder_files
            ),
        )
        files = self.map(lambda f: self.retried(f"{f.name}: read its first and last bytes", f.measured), files)
        self.identity = "\n".join(f.identity for f in files)
        return files

    @staticmethod
    def map(fn: Callable[[FileRef], T], files: list[FileRef]) -> list[T]:
        """``fn`` of each file, in order, several files at once (more where each is a round trip to a store)."""
        threads = LOCAL_THREADS if all(f.is_local for f in files) else REMOTE_THREADS
        with ThreadPoolExecutor(max_workers=max(1, min(threads, len(files)))) as pool:
            return list(pool.map(fn, files))

    def retried(self, what: str, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` with transient errors retried (counted as ``read.retries``); ``what`` names the file."""
        return call(self.retry, what, fn, *args, on_retry=lambda: self.stats.add(RETRIES, 1))


class FileFormat(Format):
    """A format of files: lists its units from the files it finds, and keeps them by name.

    Args:
        access: The reader's paths and retries.
        name: The reader's name (``"ParquetReader"``), in its fingerprint.
        columns: Checked columns to read (``None``: all).
        chunk_rows: Most rows per record batch the reader emits (a hint for batch sizes).
    """

    SUFFIXES: tuple[str, ...] = ()  # the files of a folder this format reads
    LISTING: tuple[str, ...] = ("files",)  # what list_units sets, shared with the pipeline's other readers
    _open: tuple[str, Any, Any] | None = None  # (name, handle, its reader) kept open between units of one file

    def __init__(self, access: FileAccess, *, name: str, columns: Sequence[str] | None, chunk_rows: int) -> None:
        self.access, self.name, self.columns, self.chunk_rows = access, name, columns, chunk_rows
        self.files: dict[str, FileRef] = {}

    def fingerprint(self) -> str:
        """The reader and its columns: the listing itself is checked by the reader's listing identity."""
        return f"{self.name} columns={list(self.columns) if self.columns else None!r}"

    def close(self) -> None:
        if self._open is not None:
            handle, self._open = self._open[1], None
            try:
                handle.close()
            except Exception:  # a broken connection may fail to close; it is dropped either way
                pass

    def rows_from(self, batches: Iterable[pa.RecordBatch], start_row: int) -> Iterator[pa.RecordBatch]:
        """``batches`` from row ``start_row`` on, as the ``columns`` (in their order)."""
        for batch in batches:
            if start_row < batch.num_rows:
                batch, start_row = batch.slice(start_row), 0
                yield batch if self.columns is None else batch.select(self.columns)
            else:
                start_row -= batch.num_rows
