"""Read CSV files with ``pyarrow.csv``: the shortest file format, written to the reader protocol alone.

A format lists units and reads one (:mod:`padpipe.readers.format`); the reader node it is named in
(:class:`~padpipe.readers.file_source.FileSource`) shares the listing, plans each consumer's share
of each epoch, checks files against their listing, retries, and saves and checks positions.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pyarrow.csv as pv

from padpipe.readers.file_source import FileSource
from padpipe.readers.files import FileFormat
from padpipe.readers.unit import WorkUnit

BLOCK_BYTES = 1 << 20  # bytes pyarrow parses at once; column types come from each file's first block


class CsvFormat(FileFormat):
    """CSV files with a header line; each file is one work unit, read front to back."""

    SUFFIXES = (".csv",)

    def describe(self) -> str:
        return f"read_csv paths={list(self.access.paths)!r} columns={self.columns!r}"

    def list_units(self) -> list[WorkUnit]:
        self.files = {file.name: file for file in self.access.expand(self.SUFFIXES)}
        return [WorkUnit(name, 0) for name in self.files]

    def read_unit(self, unit: WorkUnit, start_row: int) -> Iterator[pa.RecordBatch]:
        convert = pv.ConvertOptions(include_columns=self.columns)
        with self.files[unit.path].open_native() as handle:
            for batch in pv.open_csv(handle, pv.ReadOptions(block_size=BLOCK_BYTES), convert_options=convert):
                yield batch.slice(min(start_row, batch.num_rows))
                start_row = max(0, start_row - batch.num_rows)


class CsvReader(FileSource):
    """CSV files as record batches (``FileSource``'s arguments; see :class:`CsvFormat`).

    A resumed reader re-parses its file up to the saved row. Files are shared whole between
    consumers (their row counts are unknown until read).

    Example:
        >>> import pathlib, tempfile
        >>> path = pathlib.Path(tempfile.mkdtemp(), "a.csv"); _ = path.write_text("id,text\\n0,a\\n1,b\\n")
        >>> reader = CsvReader(paths=str(path), chunk_rows=1); reader.reset(); next(reader).to_pylist()
        [{'id': 0, 'text': 'a'}]
    """

    FORMAT = CsvFormat
    SUFFIXES = CsvFormat.SUFFIXES
