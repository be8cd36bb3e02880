"""Read Parquet files one row group at a time, streaming ``chunk_rows`` rows per record batch."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterator, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from padpipe._shard import Consumer
from padpipe.errors import DataError
from padpipe.pipes._paths import FileRef, check_paths, expand_paths
from padpipe.pipes._schema import check_columns, require_columns
from padpipe.pipes._source import DEFAULT_CHUNK_ROWS, UnitSource, WorkUnit
from padpipe.stats import PipelineStats

SUFFIXES = (".parquet", ".parq", ".pq")
LIST_THREADS = 8


class ParquetReader(UnitSource):
    """Parquet files as record batches; each row group is one work unit.

    Row groups are listed from the file footers on the first ``reset`` (no data is read then) and
    read with ``ParquetFile.iter_batches``, so memory holds about one batch, never a whole file.
    A resumed reader decodes its row group from the start and drops the rows already read.

    Args:
        paths: A file, folder (searched recursively for ``.parquet``/``.parq``/``.pq`` files),
            glob or list of them; local or any fsspec URL (``s3://bucket/train/*.parquet``).
        columns: Columns to read, in this order (default: all of each file's columns).
        chunk_rows: Most rows per emitted record batch.
        storage_options: Keyword arguments for the fsspec filesystem (credentials, endpoint).
        seed: Shuffle the row-group order per epoch with ``(seed, epoch)``; ``None`` keeps file order.
        consumer: This reader's share of the row groups; default: detected on first ``reset``.
        stats: Counters to report into.

    Raises:
        DataError: On ``reset``, when a file is not a readable Parquet file or lacks a requested
            column; while reading, when a page cannot be decoded. The message names the file.

    Example:
        >>> reader = ParquetReader(paths=pp.examples.SAMPLE_PARQUET, columns=["idx"], chunk_rows=3)
        >>> reader.reset(); next(reader).to_pylist()
        [{'idx': 0}, {'idx': 1}, {'idx': 2}]
    """

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
    ) -> None:
        super().__init__(chunk_rows=chunk_rows, seed=seed, consumer=consumer, stats=stats)
        self.paths = check_paths(paths)
        self.columns = check_columns(columns)
        self.storage_options = dict(storage_options or {})
        self._files: dict[str, FileRef] = {}
        self._open: tuple[str, Any, pq.ParquetFile] | None = None

    def describe(self) -> str:
        return f"read_parquet paths={list(self.paths)!r} columns={self.columns!r}"

    def list_units(self) -> list[WorkUnit]:
        files = expand_paths(self.paths, suffixes=SUFFIXES, storage_options=self.storage_options)
        with ThreadPoolExecutor(max_workers=min(LIST_THREADS, len(files))) as pool:
            footers = list(pool.map(self._footer, files))
        units = []
        for file, metadata in zip(files, footers):
            self._files[file.name] = file
            units += [WorkUnit(file.name, i, metadata.row_group(i).num_rows) for i in range(metadata.num_row_groups)]
        return units

    def read_unit(self, unit: WorkUnit, start_row: int) -> Iterator[pa.RecordBatch]:
        parquet = self._parquet(unit.path)
        skip = start_row
        for batch in parquet.iter_batches(batch_size=self.chunk_rows, row_groups=[unit.index], columns=self.columns):
            if skip >= batch.num_rows:
                skip -= batch.num_rows
                continue
            batch, skip = batch.slice(skip), 0
            yield batch if self.columns is None else batch.select(self.columns)

    # -- helpers ------------------------------------------------------------------------------------
    def _footer(self, file: FileRef) -> pq.FileMetaData:
        handle, parquet = _open(file)
        try:
            require_columns(file.name, parquet.schema_arrow.names, self.columns)
            return parquet.metadata
        finally:
            handle.close()

    def _parquet(self, name: str) -> pq.ParquetFile:
        """The open file ``name``; consecutive units of one file share the handle and footer."""
        if self._open is None or self._open[0] != name:
            if self._open is not None:
                self._open[1].close()
                self._open = None
            handle, parquet = _open(self._files[name])
            self._open = (name, handle, parquet)
        return self._open[2]


def _open(file: FileRef) -> tuple[Any, pq.ParquetFile]:
    handle = pa.OSFile(file.path) if file.is_local else file.open()
    try:
        return handle, pq.ParquetFile(handle)
    except (pa.ArrowException, OSError) as exc:
        handle.close()
        raise DataError(f"{file.name}: not a readable Parquet file ({exc}).") from exc
