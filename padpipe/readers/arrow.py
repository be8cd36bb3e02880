"""Read Arrow IPC files, file or stream format: ``datasets`` cache files and ``save_to_disk`` folders."""

from __future__ import annotations

import json
import posixpath
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.ipc as ipc
from fsspec import AbstractFileSystem

from padpipe.errors import DataError
from padpipe.readers.file_source import FileSource
from padpipe.readers.files import FileFormat
from padpipe.readers.paths import FileRef
from padpipe.readers.retry import is_transient
from padpipe.readers.schema import require_columns
from padpipe.readers.source import WorkUnit

SUFFIXES = (".arrow", ".arrows", ".feather", ".ipc")
FILE_MAGIC = b"ARROW1"
RANDOM, OFFSETS, SEQUENTIAL = "random access", "stream offsets", "sequential stream"
BLOCK_BYTES = 8 << 20  # read-ahead of a remote file
HEAD_BYTES = 1 << 16  # read-ahead when only the schema is read
SAVED_FILES = ("datasets.arrow_dataset", "Dataset.save_to_disk", "state.json", "_data_files")
"""datasets' private name this reader reads (tests/integrations/test_contacts.py pins it): the key of a
``save_to_disk`` folder's ``state.json`` that lists its data files in order."""


class ArrowFormat(FileFormat):
    """Arrow IPC files and streams: each record batch is one work unit where it can be (see :class:`ArrowReader`)."""

    SUFFIXES = SUFFIXES
    LISTING = ("files", "modes")
    modes: dict[str, str]  # each file's mode: RANDOM, OFFSETS or SEQUENTIAL

    def describe(self) -> str:
        return f"read_arrow paths={list(self.access.paths)!r} columns={self.columns!r}"

    def list_units(self) -> list[WorkUnit]:
        units = []
        self.files, self.modes = {}, {}
        for file in self.access.expand(self.SUFFIXES, folder_files=_saved_dataset_files):
            mode, file_units = self.access.retried(f"{file.name}: read the schema", self._list_file, file)
            self.files[file.name], self.modes[file.name] = file, mode
            units += file_units
        return units

    def read_unit(self, unit: WorkUnit, start_row: int) -> Iterator[pa.RecordBatch]:
        file, mode = self.files[unit.path], self.modes[unit.path]
        if mode == SEQUENTIAL:
            with file.open(block_size=BLOCK_BYTES) as handle:
                yield from self.rows_from(ipc.open_stream(handle), start_row)
            return
        source, reader = self._source(file, mode)
        if mode == RANDOM:
            batch = reader.get_batch(unit.index)
        else:
            source.seek(unit.start)
            batch = ipc.read_record_batch(ipc.read_message(source), reader)
        yield from self.rows_from([batch], start_row)

    def _list_file(self, file: FileRef) -> tuple[str, list[WorkUnit]]:
        try:
            return self._list_units_of(file)
        except (pa.ArrowException, OSError, ValueError) as exc:
            if isinstance(exc, (DataError, FileNotFoundError, PermissionError)) or is_transient(exc):
                raise
            raise DataError(f"{file.name}: not a readable Arrow IPC file or stream ({exc}).") from exc

    def _list_units_of(self, file: FileRef) -> tuple[str, list[WorkUnit]]:
        with file.open(cache_type="none") as handle:
            magic = handle.read(len(FILE_MAGIC))
        if not magic:
            raise DataError(f"{file.name}: empty file; expected an Arrow IPC file or stream.")
        if magic == FILE_MAGIC:
            _, reader = self._source(file, RANDOM)
            require_columns(file.name, reader.schema.names, self.columns)
            count = reader.num_record_batches
            if not file.is_local:  # row counts would cost a read of every batch: balance by batch count
                return RANDOM, [WorkUnit(file.name, i) for i in range(count)]
            return RANDOM, [WorkUnit(file.name, i, num_rows=reader.get_batch(i).num_rows) for i in range(count)]
        if not file.is_local:
            with file.open(block_size=HEAD_BYTES) as handle:
                require_columns(file.name, ipc.open_stream(handle).schema.names, self.columns)
            return SEQUENTIAL, [WorkUnit(file.name, 0)]
        source = file.open_native(mmap=True)
        messages = ipc.MessageReader.open_stream(source)
        schema = ipc.read_schema(messages.read_next_message())
        require_columns(file.name, schema.names, self.columns)
        units = []
        while True:
            offset = source.tell()
            try:
                message = messages.read_next_message()
            except StopIteration:
                break
            if message.type != "record batch":  # dictionary batches: read the stream front to back
                return SEQUENTIAL, [WorkUnit(file.name, 0)]
            rows = ipc.read_record_batch(message, schema).num_rows  # zero-copy from the memory map
            units.append(WorkUnit(file.name, len(units), num_rows=rows, start=offset))
        return OFFSETS, units

    def _source(self, file: FileRef, mode: str) -> tuple[Any, Any]:
        """The open file and its reader (random access) or schema (stream); cached per file."""
        if self._open is None or self._open[0] != file.name:
            self.close()
            source = file.open_native(mmap=True, block_size=BLOCK_BYTES)
            if mode == RANDOM:
                reader = ipc.open_file(source)
            else:
                reader = ipc.read_schema(ipc.MessageReader.open_stream(source).read_next_message())
            self._open = (file.name, source, reader)
        return self._open[1], self._open[2]


class ArrowReader(FileSource):
    """Arrow IPC input as record batches; each record batch is one work unit where it can be.

    The *file* format (``ARROW1`` first: ``.feather``, ``pa.ipc.new_file``) is read by batch
    number. A local *stream* file (``datasets`` cache files, ``save_to_disk`` shards) is
    memory-mapped and its message headers scanned once to find each batch's offset; a remote one,
    or one with dictionary batches, is one unit read front to back. A ``save_to_disk`` folder is
    read in its ``state.json`` order (a saved ``DatasetDict`` is an error naming its splits). A
    resumed reader re-reads its record batch and drops the rows already read. Local batches know
    their rows, so shares are equal to within a row; remote files are shared by whole batches.

    Takes :class:`~padpipe.readers.file_source.FileSource`'s arguments (a folder is searched for
    ``.arrow``/``.arrows``/``.feather``/``.ipc`` files, unless it is a ``save_to_disk`` folder).

    Raises:
        DataError: On ``reset``, when a file is empty, not Arrow IPC, truncated (local streams) or
            lacks a requested column; while reading, when a file vanished or a storage error
            outlasts the retries. The message names the file.

    Example:
        >>> ds = datasets.Dataset.from_dict({"text": ["a", "b"]}); ds.save_to_disk("saved")  # doctest: +SKIP
        >>> reader = ArrowReader(paths="saved"); reader.reset(); next(reader).to_pylist()  # doctest: +SKIP
        [{'text': 'a'}, {'text': 'b'}]
    """

    FORMAT = ArrowFormat
    SUFFIXES = SUFFIXES


def _saved_dataset_files(fs: AbstractFileSystem, folder: str) -> list[str] | None:
    """The data files of a ``Dataset.save_to_disk`` folder in ``state.json`` order, else ``None``."""
    state_path = posixpath.join(folder, "state.json")
    if fs.exists(state_path):
        with fs.open(state_path, "rb") as handle:
            state = json.load(handle)
        key = SAVED_FILES[3]
        if not isinstance(state, dict) or not isinstance(state.get(key), list):
            raise DataError(
                f"{state_path}: a Dataset.save_to_disk state must list its data files under {key!r}, but has keys "
                f"{sorted(state) if isinstance(state, dict) else type(state).__name__} instead (another datasets "
                "release?): read its .arrow files with read_arrow([...]) in the order you want."
            )
        if state[key]:
            return [posixpath.join(folder, entry["filename"]) for entry in state[key]]
    dict_path = posixpath.join(folder, "dataset_dict.json")
    if fs.exists(dict_path):
        with fs.open(dict_path, "rb") as handle:
            splits = json.load(handle).get("splits", [])
        raise DataError(
            f"{folder}: is a saved DatasetDict, not one dataset; pass one split's folder, one of {splits!r}."
        )
    return None
