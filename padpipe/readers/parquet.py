"""Read Parquet files one row group at a time, streaming ``chunk_rows`` rows per record batch."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from padpipe.errors import DataError
from padpipe.readers.file_source import FileSource
from padpipe.readers.files import FileFormat
from padpipe.readers.paths import FileRef
from padpipe.readers.retry import is_transient
from padpipe.readers.schema import require_columns
from padpipe.readers.source import WorkUnit

SUFFIXES = (".parquet", ".parq", ".pq")


class ParquetFormat(FileFormat):
    """Parquet files: each row group is one work unit (see :class:`ParquetReader`)."""

    SUFFIXES = SUFFIXES

    def describe(self) -> str:
        return f"read_parquet paths={list(self.access.paths)!r} columns={self.columns!r}"

    def list_units(self) -> list[WorkUnit]:
        files = self.access.expand(self.SUFFIXES)
        footers = self.access.map(self._footer, files)
        units = []
        self.files = {}
        for file, metadata in zip(files, footers):
            self.files[file.name] = file
            units += [WorkUnit(file.name, i, metadata.row_group(i).num_rows) for i in range(metadata.num_row_groups)]
        return units

    def read_unit(self, unit: WorkUnit, start_row: int) -> Iterator[pa.RecordBatch]:
        parquet = self._parquet(unit.path)
        yield from self.rows_from(parquet.iter_batches(self.chunk_rows, [unit.index], columns=self.columns), start_row)

    def _footer(self, file: FileRef) -> pq.FileMetaData:
        handle, parquet = self.access.retried(f"{file.name}: read the footer", _open, file)
        try:
            require_columns(file.name, parquet.schema_arrow.names, self.columns)
            return parquet.metadata
        finally:
            handle.close()

    def _parquet(self, name: str) -> pq.ParquetFile:
        """The open file ``name``; consecutive units of one file share the handle and footer."""
        if self._open is None or self._open[0] != name:
            self.close()
            handle, parquet = _open(self.files[name])
            self._open = (name, handle, parquet)
        return self._open[2]


class ParquetReader(FileSource):
    """Parquet files as record batches; each row group is one work unit.

    Row groups are listed from the footers on the first ``reset`` and read with
    ``ParquetFile.iter_batches`` (memory holds about one row group's columns); remote files with
    pyarrow's ``pre_buffer`` (a row group's column chunks in a few coalesced range requests). A
    resumed reader decodes its row group from the start and drops the rows already read. Shares
    are equal to within one row: a row group may be cut between two consumers.

    Takes :class:`~padpipe.readers.file_source.FileSource`'s arguments (a folder is searched for
    ``.parquet``/``.parq``/``.pq`` files).

    Raises:
        DataError: On ``reset``, when a file is not a readable Parquet file or lacks a requested
            column; while reading, when a page cannot be decoded, a file vanished, or a storage
            error outlasts the retries. The message names the file.

    Example:
        >>> reader = ParquetReader(paths=pp.examples.SAMPLE_PARQUET, columns=["idx"], chunk_rows=3)
        >>> reader.reset(); next(reader).to_pylist()
        [{'idx': 0}, {'idx': 1}, {'idx': 2}]
    """

    FORMAT = ParquetFormat
    SUFFIXES = SUFFIXES


def _open(file: FileRef) -> tuple[Any, pq.ParquetFile]:
    handle = file.open_native(cache_type="none")
    try:
        return handle, pq.ParquetFile(handle, pre_buffer=not file.is_local)
    except (pa.ArrowException, OSError) as exc:
        handle.close()
        if is_transient(exc) or isinstance(exc, (FileNotFoundError, PermissionError)):
            raise
        raise DataError(f"{file.name}: not a readable Parquet file ({exc}).") from exc
