"""Read JSON Lines files (plain, ``.gz``, ``.zst``), parsing blocks of lines with ``pyarrow.json``."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Sequence
from typing import Any, Literal

import pyarrow as pa
import pyarrow.json as pj

from padpipe.errors import DataError, one_of, positive
from padpipe.readers import jsonl_blocks as blocks
from padpipe.readers.file_source import FileSource
from padpipe.readers.files import FileAccess, FileFormat
from padpipe.readers.paths import FileRef
from padpipe.readers.retry import is_transient
from padpipe.readers.schema import conform
from padpipe.readers.source import WorkUnit
from padpipe.sharing.shares import Measure
from padpipe.state import Int, ListOf, Loaded, Optional, load_value

BAD_ROW = "read.bad_row"
"""Skip reason of a line skipped under ``on_error="skip"``, per file: ``read.bad_row:<file>``."""
SUFFIXES = tuple(base + comp for comp in ("", ".gz", ".zst", ".zstd") for base in (".jsonl", ".ndjson", ".json"))
POSITION_COLUMN = "__padpipe_pos"  # each row's byte offset, where the token cache asks for it (record_row_positions)


class JsonlFormat(FileFormat):
    """JSON Lines files: the units are a plain file's byte ranges, or a whole compressed file (see JsonlReader).

    Its position state is the byte offset and first row of the block being read (``"block"``).
    """

    SUFFIXES = SUFFIXES
    LISTING = ("files", "schema", "reference")
    POSITION = {"block": Optional(ListOf(Int(0), length=2))}
    row_positions = False  # add each row's byte offset as POSITION_COLUMN (record_row_positions)

    def __init__(
        self,
        access: FileAccess,
        *,
        name: str,
        columns: Sequence[str] | None,
        chunk_rows: int,
        unit_bytes: int = 64 << 20,
        block_bytes: int = 2 << 20,
        on_error: Literal["raise", "skip"] = "raise",
        json_columns: Sequence[str] = (),
    ) -> None:
        super().__init__(access, name=name, columns=columns, chunk_rows=chunk_rows)
        positive("unit_bytes", unit_bytes)
        positive("block_bytes", block_bytes)
        one_of("on_error", on_error, ("raise", "skip"))
        self.on_error = on_error
        self.json_columns = tuple(json_columns)
        self.unit_bytes = unit_bytes
        self.block_bytes = block_bytes
        self.schema: pa.Schema | None = None
        self.reference = ""
        self._block: tuple[int, int] | None = None  # (byte offset, unit row) of the block being read
        self._resume_at: tuple[int, int] | None = None

    @property
    def options(self) -> pj.ParseOptions:
        """How blocks are parsed: the schema's typed keys given, its untyped ones (null: unseen) inferred."""
        if self.schema is None:
            return pj.ParseOptions()
        typed = pa.schema([f for f in self.schema if not pa.types.is_null(f.type)])
        return pj.ParseOptions(
            explicit_schema=typed, unexpected_field_behavior="infer" if len(typed) < len(self.schema) else "ignore"
        )

    def describe(self) -> str:
        as_text = f" json_columns={list(self.json_columns)!r}" if self.json_columns else ""
        paths = list(self.access.paths)
        return f"read_jsonl paths={paths!r} columns={self.columns!r} unit_bytes={self.unit_bytes}{as_text}"

    def fingerprint(self) -> str:
        return f"{super().fingerprint()} unit_bytes={self.unit_bytes} block_bytes={self.block_bytes}"

    def record_row_positions(self) -> bool:
        """Add each row's byte offset as ``POSITION_COLUMN`` (blocks are cut by bytes, so the cache keys rows by it)."""
        self.row_positions = True
        return True

    def list_units(self) -> list[WorkUnit]:
        files = self.access.expand(self.SUFFIXES)
        units = []
        self.files = {}
        for file in files:
            self.files[file.name] = file
            if file.size() == 0:
                raise DataError(f"{file.name}: empty file (0 bytes); expected JSON Lines.")
            if blocks.compression_of(file.name):
                units.append(WorkUnit(file.name, 0))
                continue
            size = file.size()
            for i, start in enumerate(range(0, size, self.unit_bytes)):
                units.append(WorkUnit(file.name, i, start=start, stop=min(start + self.unit_bytes, size)))
        self._take_schema(files)
        return units

    def measure(self, unit: WorkUnit) -> Measure:
        """Bytes: a plain file's byte range can be cut anywhere (a line belongs where it starts)."""
        if unit.stop is None:  # a compressed file: one whole unit, weighed by its stored size
            return Measure(self.files[unit.path].listed_size or 1, cuttable=False)
        return Measure(unit.stop - unit.start)

    def piece(self, unit: WorkUnit, lo: int, hi: int) -> WorkUnit:
        if unit.stop is None or (lo, hi) == (0, unit.stop - unit.start):
            return unit
        return dataclasses.replace(unit, start=unit.start + lo, stop=unit.start + hi)

    def read_unit(self, unit: WorkUnit, start_row: int) -> Iterator[pa.RecordBatch]:
        file = self.files[unit.path]
        begin, row = unit.start, 0
        if self._resume_at is not None and self._resume_at[1] <= start_row:
            begin, row = self._resume_at
        self._resume_at = None
        self._block = (begin, row)  # where a retry re-opens, until the first block is read
        stop = math.inf if unit.stop is None else unit.stop
        with blocks.open_stream(file) as stream:
            for offset, block in blocks.line_blocks(stream, begin, stop, self.block_bytes):
                self._block = (offset, row)
                batch, block = self._parse(file, offset, block)
                if batch is not None and self.row_positions:
                    batch = _with_positions(batch, blocks.row_starts(block, offset))
                if batch is not None and row + batch.num_rows > start_row:
                    yield batch.slice(max(0, start_row - row))
                row += 0 if batch is None else batch.num_rows

    def reopen(self) -> None:
        self.close()
        self._resume_at = self._block

    def drop_position_hint(self) -> None:
        self._block = self._resume_at = None

    # -- state: (unit, row) plus the current block's byte offset ------------------------------------
    def check_position(self, loaded: Loaded, unit: WorkUnit | None) -> None:
        block = loaded["block"]
        if block is not None:  # where the block holding `row` starts: within the unit, at or before `row`
            start, stop = (0, -1) if unit is None else (unit.start, unit.stop)
            load_value("JsonlReader", "block", block[0], Int(start, stop))
            load_value("JsonlReader", "block", block[1], Int(0, loaded.row))

    def restore_position(self, loaded: Loaded | None) -> None:
        self._block = None
        block = None if loaded is None else loaded["block"]
        self._resume_at = None if block is None else (int(block[0]), int(block[1]))

    def position(self, reading: bool) -> dict[str, Any]:
        block = self._block if reading else self._resume_at
        return {"block": None if block is None else list(block)}

    def _take_schema(self, files: list[FileRef]) -> None:
        """Fix the schema from the first block that has rows (see the class docs)."""
        for file in files:
            first = self.access.retried(f"{file.name}: read the first block", self._first_block, file)
            table = None if first is None else self._parse(file, 0, first[1], count=False)[0]
            if table is None or table.num_rows == 0:
                continue
            sniffed = pa.schema([f.with_type(blocks.no_timestamps(f.type)) for f in table.schema])
            names = self.columns or sniffed.names
            self.schema = pa.schema([sniffed.field(n) if n in sniffed.names else pa.field(n, pa.null()) for n in names])
            self.reference = f"the first block of {file.name}"
            return

    def _first_block(self, file: FileRef) -> tuple[int, bytes] | None:
        try:
            with blocks.open_stream(file) as stream:
                return next(blocks.line_blocks(stream, 0, math.inf, self.block_bytes), None)
        except (OSError, pa.ArrowException) as exc:
            if is_transient(exc) or isinstance(exc, (FileNotFoundError, PermissionError)):
                raise
            raise DataError(f"{file.name}: cannot read the file ({exc}).") from exc

    def _parse(
        self, file: FileRef, offset: int, block: bytes, *, count: bool = True
    ) -> tuple[pa.RecordBatch | None, bytes]:
        """``(rows, block)``: a bad line raises a ``DataError`` naming it, or with ``on_error="skip"`` is blanked.

        A skipped line becomes spaces of the same length in the returned block (a blank line, which
        is no row), so every other row keeps its byte offset and its row number, and a resumed read
        skips it again. ``count``: count skips in the stats (not while the schema is sniffed at listing).
        """
        for _ in range(block.count(b"\n") + 1):
            if not block or block.isspace():
                return None, block
            try:
                return self._parse_block(file, offset, block), block
            except blocks.LineError as bad:
                if self.on_error == "raise":
                    number = blocks.lines_before(file, offset) + bad.line + 1
                    hint = "; pass on_error='skip' to read_jsonl to skip such lines (counted per file)"
                    raise DataError(f"{file.name} line {number}: {bad.problem}{hint}.") from bad.__cause__
                block = blocks.blank_line(block, bad.line)
                if count:
                    self.access.stats.record_skip(f"{BAD_ROW}:{file.name}", 1)
        raise AssertionError("unreachable: every line of the block was blanked")

    def _parse_block(self, file: FileRef, offset: int, block: bytes) -> pa.RecordBatch | None:
        bad_byte = blocks.invalid_utf8(block)
        if bad_byte is not None:
            line, column = bad_byte
            byte = block.split(b"\n", line + 1)[line][column]
            raise blocks.LineError(
                line,
                f"invalid UTF-8 (byte {column + 1} of the line is 0x{byte:02x}); JSON Lines files "
                "must be UTF-8 (re-encode the file, e.g. with iconv)",
            )
        options = self.options
        if self.json_columns:
            typed = options.explicit_schema
            try:
                table = blocks.parse_lines(block, self.json_columns, typed)
            except blocks.LineError as bad:
                hint = f"; keys keep the types of {self.reference}" if typed is not None else ""
                raise blocks.LineError(bad.line, f"{bad.problem}{hint}") from bad.__cause__
            return self._conformed(file, offset, table)
        try:
            table = blocks.parse_block(block, options)
        except pa.ArrowInvalid as exc:
            first = blocks.lines_before(file, offset) + 1 if self.on_error == "raise" else 1  # only named on raise
            line, problem = blocks.locate_error(block, options, exc, first_line=first)
            typed = self.schema is not None and not problem.startswith("invalid JSON")
            hint = f"; keys keep the types of {self.reference}" if typed else ""
            raise blocks.LineError(line, f"{problem}{hint}") from exc
        return self._conformed(file, offset, table)

    def _conformed(self, file: FileRef, offset: int, table: pa.Table) -> pa.RecordBatch | None:
        if table.num_rows == 0:
            return None
        batch = table.combine_chunks().to_batches()[0]
        if self.schema is None:
            return batch
        where = f"{file.name} (block at byte {offset})"
        return conform(batch, self.schema, where=where, reference=self.reference)


class JsonlReader(FileSource):
    """JSON Lines files as record batches: one JSON object per line, blank lines skipped.

    Blocks of about ``block_bytes``, cut at a newline, are parsed in one ``pyarrow.json`` call. A plain file is
    split into byte ranges of ``unit_bytes`` (a range owns every line that *starts* in it), shared by bytes
    (docs/distributed.md); a compressed file is one unit. The state holds the current block's byte offset, so a
    resumed or retried read seeks there (a compressed file is decompressed up to it) and re-parses that block.

    The schema is fixed per reader: the keys (or ``columns``) and types of the first block that
    has rows (date-like strings kept as strings). Later a missing key comes out as nulls, a key not
    in the schema is dropped, a value of another type is an error naming the line; a requested key
    absent from the first block takes its type from each block.

    Takes :class:`~padpipe.readers.file_source.FileSource`'s arguments (a folder is searched for
    ``.jsonl``/``.ndjson``/``.json`` files, optionally ``.gz``/``.zst``) and the format's:

    Args:
        unit_bytes: Size of the byte ranges a plain file is split into.
        block_bytes: About how many bytes are parsed at once.
        on_error: A line that cannot be a row (invalid UTF-8, invalid JSON, not an object, a
            value of the wrong type): ``"raise"`` a ``DataError`` naming the file and line, or
            ``"skip"`` it, counted per file in the stats' ``skipped`` as ``read.bad_row:<file>``
            (every other row comes once; resume stays exact).
        json_columns: Keys whose values are kept as their JSON text, exactly as written (no key
            added, dropped or reordered by Arrow's struct inference, a string in one row and a list
            in another allowed); lines are then parsed one by one in Python. ``.chat()`` asks this
            for its conversation columns.

    Raises:
        DataError: ``"<file> line N: invalid JSON: ..."`` for a line that is not a JSON object,
            ``"<file> line N: ..."`` for a value of the wrong type or invalid UTF-8 (unless
            ``on_error="skip"``), and errors naming the file when it vanished or a storage error
            outlasts the retries.

    Example:
        >>> reader = JsonlReader(paths=pp.examples.SAMPLE_JSONL, columns=["id"], chunk_rows=2)
        >>> reader.reset(); next(reader).to_pylist()
        [{'id': 0}, {'id': 1}]
    """

    FORMAT = JsonlFormat
    SUFFIXES = SUFFIXES
    JSON_COLUMNS = True  # takes json_columns
    POSITION_COLUMN = POSITION_COLUMN
    format: JsonlFormat


def _with_positions(batch: pa.RecordBatch, starts: object) -> pa.RecordBatch:
    """``batch`` with each row's byte offset in the file; ``-1`` for all when they cannot be told apart."""
    positions = pa.array(starts if len(starts) == batch.num_rows else [-1] * batch.num_rows, pa.int64())  # type: ignore[arg-type]
    return batch.append_column(POSITION_COLUMN, positions)
