"""Byte-level helpers of the JSONL reader: open (and decompress), cut whole-line blocks, parse, locate errors."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import numpy as np
import pyarrow as pa
import pyarrow.json as pj

from padpipe.readers.paths import FileRef

SCAN_BYTES = 1 << 16
READ_AHEAD_BYTES = 8 << 20  # one range request per 8 MiB of a remote file
COMPRESSION = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd"}
JSON_KINDS = {dict: "object", list: "array", str: "string", bool: "boolean", int: "number", float: "number"}


def compression_of(name: str) -> str | None:
    """``"gzip"``, ``"zstd"`` or ``None``, told by the file name's last suffix."""
    return next((codec for suffix, codec in COMPRESSION.items() if name.endswith(suffix)), None)


@contextmanager
def open_stream(file: FileRef) -> Iterator[pa.NativeFile]:
    """The file's (decompressed) bytes as a pyarrow input stream; seekable when not compressed."""
    raw = file.open_native(block_size=READ_AHEAD_BYTES)
    codec = compression_of(file.name)
    stream = pa.CompressedInputStream(raw, codec) if codec else raw
    try:
        yield stream
    finally:
        stream.close()
        raw.close()


def line_blocks(stream: pa.NativeFile, start: int, stop: float, block_bytes: int) -> Iterator[tuple[int, bytes]]:
    """Blocks ``(offset, bytes)`` of whole lines, covering every line that starts in ``[start, stop)``.

    A line starts at offset 0 or right after a ``\\n``. A block starting at ``offset`` ends at
    the last ``\\n`` within ``block_bytes`` (or after the first line, when that is longer), or
    at the end of the line holding byte ``stop - 1``, or at the end of the file. The cut depends
    only on the offset, so a reader resumed at a block's offset cuts the same blocks again.
    ``stop`` may be ``math.inf``. A compressed stream is advanced to ``start`` by reading.
    """
    buf, pos = b"", 0
    if start > 0:
        pos = _advance(stream, start - 1)
        while True:
            piece = stream.read(SCAN_BYTES)
            if not piece:
                return
            newline = piece.find(b"\n")
            if newline >= 0:
                pos, buf = pos + newline + 1, piece[newline + 1 :]
                break
            pos += len(piece)
    eof = False

    def newline_from(i: int) -> int:
        """Index of the first newline at or after ``i`` in ``buf``, reading more as needed."""
        nonlocal buf, eof
        while True:
            found = buf.find(b"\n", i)
            if found >= 0 or eof:
                return found
            chunk = stream.read(block_bytes)
            eof = not chunk
            buf += chunk

    while pos < stop:
        while len(buf) < block_bytes and not eof:
            chunk = stream.read(block_bytes)
            eof = not chunk
            buf += chunk
        if not buf:
            return
        need = stop - pos
        if need <= block_bytes:
            newline = newline_from(int(need) - 1)
        else:
            newline = buf.rfind(b"\n", 0, block_bytes)
            if newline < 0:
                newline = newline_from(block_bytes)
        end = len(buf) if newline < 0 else newline + 1
        yield pos, buf[:end]
        pos, buf = pos + end, buf[end:]


def row_starts(block: bytes, offset: int) -> np.ndarray:
    """Byte offsets (in the file) where the block's rows start: its lines that are not blank.

    ``pyarrow.json`` skips lines of only spaces, tabs and ``\\r``; the others are its rows, in order.

    Example:
        >>> row_starts(b'{"a":1}\\n \\n{"a":2}\\n', 100).tolist()
        [100, 110]
    """
    data = np.frombuffer(block, dtype=np.uint8)
    starts = np.concatenate([[0], np.flatnonzero(data == 10) + 1])
    starts = starts[starts < len(data)]
    if not len(starts):
        return np.zeros(0, np.int64)
    ink = np.concatenate([[0], np.cumsum(~np.isin(data, (9, 10, 13, 32)))])
    ends = np.append(starts[1:], len(data))
    return (starts[ink[ends] > ink[starts]] + offset).astype(np.int64)


def parse_block(block: bytes, options: pj.ParseOptions) -> pa.Table:
    """Parse a block of JSON lines in one vectorized call (blank lines are skipped)."""
    read = pj.ReadOptions(use_threads=False, block_size=len(block) + 1)
    return pj.read_json(pa.BufferReader(block), read_options=read, parse_options=options)


class LineError(Exception):
    """A line of a block that cannot be a row: its index in the block and what is wrong with it."""

    def __init__(self, line: int, problem: str) -> None:
        super().__init__(problem)
        self.line, self.problem = line, problem


def parse_lines(block: bytes, json_columns: Sequence[str], schema: pa.Schema | None) -> pa.Table:
    """Parse a block of JSON lines one by one, each value of ``json_columns`` kept as its JSON text, as written.

    Arrow's JSON reader gives each nested key one struct type for all rows: a key one row has gains a null
    in every other row, keys come in the first row's order, and a value that is a string in one row and a
    list in another fails. Conversations must reach a chat template as the file holds them, so their
    columns are read as JSON text (``datasets`` stores such columns as its ``Json`` feature); the other keys
    are typed by ``schema`` (``None``: inferred). Blank lines are no rows.

    Raises:
        LineError: A line that is not a JSON object, or a value that does not fit ``schema``.

    Example:
        >>> block = b'{"m": {"b": 1, "a": null}, "n": 1}\\n{"m": {"c": 2}, "n": 2}\\n'
        >>> parse_lines(block, ["m"], None).to_pylist()
        [{'n': 1, 'm': '{"b": 1, "a": null}'}, {'n': 2, 'm': '{"c": 2}'}]
    """
    rows: list[tuple[int, dict]] = []
    texts: dict[str, list[str | None]] = {key: [] for key in json_columns}
    seen: set[str] = set()
    for i, line in enumerate(block.split(b"\n")):
        if not line.strip():
            continue
        value = _object(line, i)
        for key, column in texts.items():
            if key in value:
                seen.add(key)
            found = value.pop(key, None)
            column.append(None if found is None else json.dumps(found, ensure_ascii=False))
        rows.append((i, value))
    typed = None if schema is None else pa.schema([f for f in schema if f.name not in texts])
    try:
        table = pa.Table.from_pylist([row for _, row in rows], schema=typed)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        for i, row in rows:
            try:
                pa.Table.from_pylist([row], schema=typed)
            except (pa.ArrowInvalid, pa.ArrowTypeError) as err:
                raise LineError(i, _clean(str(err))) from err
        raise LineError(rows[0][0], _clean(str(exc))) from exc
    columns = {key: json_text(column) for key, column in texts.items() if key in seen}
    if not table.num_columns:  # no other key: the table has no rows to add the columns to
        return pa.table(columns) if columns else pa.table({"": pa.nulls(len(rows))}).drop_columns([""])
    for key, column in columns.items():
        table = table.append_column(pa.field(key, JSON_TEXT), column)
    return table


JSON_TEXT = pa.json_(pa.string())
"""The type of a column read as JSON text (Arrow's canonical ``arrow.json``, ``datasets``' ``Json`` feature)."""


def json_text(texts: Sequence[str | None]) -> pa.Array:
    """JSON texts as an ``arrow.json`` column.

    Example:
        >>> json_text(['{"a": null}', None]).to_pylist()
        ['{"a": null}', None]
    """
    return pa.ExtensionArray.from_storage(JSON_TEXT, pa.array(list(texts), pa.string()))


def locate_error(block: bytes, options: pj.ParseOptions, exc: Exception, *, first_line: int = 1) -> tuple[int, str]:
    """``(line index in block, problem)`` for a block that failed to parse.

    Lines are checked one by one with ``json.loads`` (syntax, one object per line), then with
    pyarrow (type conversions); a type change between rows is placed by pyarrow's row number.
    Without an explicit schema (the first block, where types are taken from), a key whose type
    changes is blamed on the lines of the rarer type, so a wrong type on line 1 is blamed on line
    1. ``first_line`` is the file's line number of the block's first line (for the message).
    """
    lines = block.split(b"\n")
    rows = [i for i, line in enumerate(lines) if line.strip()]
    try:
        values = [_object(lines[i], i) for i in rows]
    except LineError as bad:
        return bad.line, bad.problem
    for i in rows:
        try:
            parse_block(lines[i] + b"\n", options)
        except pa.ArrowInvalid as err:
            return i, _clean(str(err))
    found = re.search(r" in row (\d+)", str(exc))
    row = int(found.group(1)) if found else 0
    changed = re.search(r"Column\(/([^/)]*)\) changed from (\w+) to (\w+)", str(exc))
    if options.explicit_schema is None and changed and rows:
        return _rarer_type(rows, values, *changed.groups(), first_line=first_line)
    return rows[min(row, len(rows) - 1)] if rows else 0, _clean(str(exc))


def _object(line: bytes, i: int) -> dict:
    """Line ``i`` of a block as a JSON object; else :class:`LineError` saying what it is."""
    try:
        value = json.loads(line)
    except ValueError as err:
        where = f" (column {err.colno})" if isinstance(err, json.JSONDecodeError) else ""
        raise LineError(i, f"invalid JSON: {getattr(err, 'msg', err)}{where}") from None
    if not isinstance(value, dict):
        kind = _json_kind(value)
        raise LineError(i, f"invalid JSON: expected an object, found {'null' if value is None else _article(kind)}")
    return value


def _rarer_type(
    rows: list[int], values: list[dict], key: str, before: str, after: str, *, first_line: int
) -> tuple[int, str]:
    """The first line of ``key``'s rarer type (ties: ``after``, the later one) and what is wrong with it."""
    kinds = [_json_kind(v.get(key)) for v in values]
    counts = {kind: kinds.count(kind) for kind in (before, after)}
    rare, common = (before, after) if counts[before] < counts[after] else (after, before)
    blamed = rows[kinds.index(rare)]
    other = first_line + rows[kinds.index(common)]
    return blamed, (
        f"key {key!r} is {_article(rare)}, but {_article(common)} on {counts[common]} other line(s) "
        f"(first: line {other}); expected one type per key"
    )


def _json_kind(value: object) -> str:
    """pyarrow's name of a JSON value's kind: number, string, boolean, object, array or null."""
    return JSON_KINDS.get(type(value), "null")


def _article(kind: str) -> str:
    return f"an {kind}" if kind[0] in "aeiou" else f"a {kind}"


def invalid_utf8(block: bytes) -> tuple[int, int] | None:
    """``(line index in block, byte offset in that line)`` of the first byte that is not UTF-8, or ``None``.

    Arrow checks the whole block at once (zero-copy); only a bad block is decoded by Python to
    place the byte.

    Example:
        >>> invalid_utf8(b'{"a": "x"}\\n{"a": "\\xff"}\\n')
        (1, 7)
    """
    offsets = pa.py_buffer(np.array([0, len(block)], dtype=np.int64).tobytes())
    array = pa.Array.from_buffers(pa.large_binary(), 1, [None, offsets, pa.py_buffer(block)])
    try:
        array.cast(pa.large_string())
        return None
    except pa.ArrowInvalid:
        pass
    try:
        block.decode("utf-8")
    except UnicodeDecodeError as err:
        line_start = block.rfind(b"\n", 0, err.start) + 1
        return block.count(b"\n", 0, err.start), err.start - line_start
    return None


def blank_line(block: bytes, line: int) -> bytes:
    """``block`` with line number ``line`` (from 0) replaced by spaces: no row, every byte offset kept.

    Example:
        >>> blank_line(b'{"a":1}\\n{bad\\n{"a":2}\\n', 1)
        b'{"a":1}\\n    \\n{"a":2}\\n'
    """
    lines = block.split(b"\n")
    lines[line] = b" " * len(lines[line])
    return b"\n".join(lines)


def lines_before(file: FileRef, offset: int) -> int:
    """Number of ``\\n`` in the file's (decompressed) bytes before ``offset`` (error path only)."""
    count = 0
    with open_stream(file) as stream:
        while offset > 0:
            piece = stream.read(min(offset, 1 << 20))
            if not piece:
                break
            count += piece.count(b"\n")
            offset -= len(piece)
    return count


def _advance(stream: pa.NativeFile, offset: int) -> int:
    if stream.seekable():
        return stream.seek(offset)
    pos = 0
    while pos < offset:
        piece = stream.read(min(offset - pos, 1 << 20))
        if not piece:
            break
        pos += len(piece)
    return pos


def _clean(message: str) -> str:
    """pyarrow's message without its block-relative row, keys named as dotted paths."""
    message = re.sub(r" in row \d+", "", message.removeprefix("JSON parse error: "))
    changed = re.fullmatch(r"Column\(/?(.*)\) changed from (\w+) to (\w+)", message)
    if changed:
        key, before, after = changed.groups()
        return f"key {key.replace('/', '.')!r} is a {after}, expected a {before}"
    return message


def no_timestamps(type_: pa.DataType) -> pa.DataType:
    """``type_`` with timestamps (pyarrow infers them from date-like strings) turned back into strings."""
    if pa.types.is_timestamp(type_):
        return pa.string()
    if pa.types.is_struct(type_):
        return pa.struct([f.with_type(no_timestamps(f.type)) for f in type_])
    if pa.types.is_list(type_) or pa.types.is_large_list(type_):
        item = type_.value_field.with_type(no_timestamps(type_.value_type))
        return pa.list_(item) if pa.types.is_list(type_) else pa.large_list(item)
    return type_
