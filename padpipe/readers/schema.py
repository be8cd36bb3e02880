"""Column checks shared by the readers: validate ``columns``, name missing ones, unify drifting schemas, tag sources."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from padpipe.errors import DataError


def check_columns(columns: Any) -> tuple[str, ...] | None:
    """Validate a ``columns`` argument (``None`` or a non-empty list of names) without I/O.

    Example:
        >>> check_columns(["text", "label"])
        ('text', 'label')
        >>> check_columns("text")
        Traceback (most recent call last):
        ...
        TypeError: `columns` must be None or a list of column names, but is 'text' instead.
    """
    if columns is None:
        return None
    names = isinstance(columns, (list, tuple)) and all(isinstance(c, str) for c in columns)
    if not names:
        raise TypeError(f"`columns` must be None or a list of column names, but is {columns!r} instead.")
    if not columns or len(set(columns)) != len(columns):
        raise ValueError(f"`columns` must be a non-empty list of distinct names, but is {list(columns)!r} instead.")
    return tuple(columns)


def require_columns(where: str, available: Sequence[str], columns: Sequence[str] | None) -> None:
    """Raise :class:`DataError` naming ``where`` unless every requested column is available.

    Example:
        >>> require_columns("a.parquet", ["text", "id"], ["txt"])
        Traceback (most recent call last):
        ...
        padpipe.errors.DataError: a.parquet: no column 'txt'; available columns: ['text', 'id'].
    """
    for name in columns or ():
        if name not in available:
            raise DataError(f"{where}: no column {name!r}; available columns: {list(available)!r}.")


def conform(batch: pa.RecordBatch, schema: pa.Schema, *, where: str, reference: str) -> pa.RecordBatch:
    """Give ``batch`` exactly the fields of ``schema``, in order (for inputs whose schema drifts).

    A field missing from ``batch`` or all-null there (type ``null``) becomes nulls of the
    schema's type; a field of another type is cast when that is lossless (int64 to double),
    else :class:`DataError`; columns not in ``schema`` are dropped. A field whose schema type is
    ``null`` (no value seen when the schema was taken) keeps the type the batch has.

    Args:
        batch: The rows just read.
        schema: The schema every batch of the input gets.
        where: The rows' location for messages (``"a.jsonl lines 1-5000"``).
        reference: Where ``schema`` was taken from, for messages.

    Example:
        >>> schema = pa.schema([("text", pa.string()), ("score", pa.float64())])
        >>> conform(pa.record_batch({"score": [1, 2]}), schema, where="b", reference="a").to_pylist()
        [{'text': None, 'score': 1.0}, {'text': None, 'score': 2.0}]
    """
    if batch.schema.equals(schema):
        return batch
    names = batch.schema.names
    arrays = []
    for field in schema:
        if field.name not in names:
            arrays.append(pa.nulls(batch.num_rows, field.type))
            continue
        column = batch.column(field.name)
        if column.type == field.type or pa.types.is_null(field.type):
            arrays.append(column)
        elif pa.types.is_null(column.type):
            arrays.append(pa.nulls(batch.num_rows, field.type))
        else:
            problem = "" if castable(column.type, field.type) else "a value of another kind"
            if not problem:
                try:
                    arrays.append(column.cast(field.type))
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                    problem = str(exc)
            if problem:
                raise DataError(
                    f"{where}: column {field.name!r} is {column.type} here but {field.type} in {reference}; "
                    f"expected one type per column ({problem})."
                )
    return pa.RecordBatch.from_arrays(arrays, names=schema.names)


def castable(found: pa.DataType, expected: pa.DataType) -> bool:
    """Whether values of type ``found`` may be cast to ``expected`` without changing what they mean.

    Within one kind only: integers to integers or floats (a safe cast still fails on overflow),
    floats to floats, text to text (``string``/``large_string``/``string_view``, dictionary-encoded
    text), binary to binary, lists and structs whose items are castable. ``null`` casts to
    anything. A number is never turned into text (``1010`` into ``'1010'``) nor text into numbers.

    Example:
        >>> castable(pa.int32(), pa.int64()), castable(pa.int64(), pa.string()), castable(pa.large_string(), pa.string())
        (True, False, True)
    """  # noqa: E501
    t = pa.types
    if found == expected or t.is_null(found):
        return True
    if t.is_dictionary(found):
        return castable(found.value_type, expected)
    kinds = (
        (t.is_integer, lambda x: t.is_integer(x) or t.is_floating(x)),
        (t.is_floating, t.is_floating),
        (_is_text, _is_text),
        (_is_binary, _is_binary),
        (t.is_boolean, t.is_boolean),
    )
    for is_kind, accepts in kinds:
        if is_kind(found):
            return accepts(expected)
    if _is_list(found) and _is_list(expected):
        return castable(found.value_type, expected.value_type)
    if t.is_struct(found) and t.is_struct(expected):
        names = [f.name for f in found]
        return names == [f.name for f in expected] and all(castable(a.type, b.type) for a, b in zip(found, expected))
    return t.is_timestamp(found) and t.is_timestamp(expected) or t.is_date(found) and t.is_date(expected)


def _is_text(kind: pa.DataType) -> bool:
    return pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind)


def _is_binary(kind: pa.DataType) -> bool:
    return pa.types.is_binary(kind) or pa.types.is_large_binary(kind) or pa.types.is_fixed_size_binary(kind)


def _is_list(kind: pa.DataType) -> bool:
    return pa.types.is_list(kind) or pa.types.is_large_list(kind)


SOURCE_METADATA = b"padpipe.source"
ROW_METADATA = b"padpipe.first_row"
"""Schema metadata key a file reader sets on each record batch: the file the rows came from."""
ROWS_METADATA = b"padpipe.rows"
"""Schema metadata key of rows gathered from several files (a shuffle's output): each row's file and row."""


def tag_source(batch: pa.RecordBatch, source: str, row: int | None = None, rows_of: str = "") -> pa.RecordBatch:
    """``batch`` with ``source`` (the file it was read from) in its schema metadata (zero-copy).

    ``row``: where the batch's first row is (counting from 0) in the file, or in ``rows_of`` of it
    (``"its byte range from byte 4096"``) when the rows before that are not counted.

    Example:
        >>> batch = tag_source(pa.record_batch({"a": [1, 2, 3, 4]}), "a.parquet", 70)
        >>> source_of(batch), row_of(batch, 3)
        ('a.parquet', 'row 73 of a.parquet')
    """
    metadata = dict(batch.schema.metadata or {})
    metadata[SOURCE_METADATA] = source.encode()
    if row is not None:
        metadata[ROW_METADATA] = f"{row}\t{rows_of}".encode()
    else:
        metadata.pop(ROW_METADATA, None)
    return batch.replace_schema_metadata(metadata)


def source_of(batch: pa.RecordBatch) -> str | None:
    """The file a record batch was read from (see :func:`tag_source`), or ``None``."""
    value = (batch.schema.metadata or {}).get(SOURCE_METADATA)
    return None if value is None else value.decode(errors="replace")


def row_of(batch: pa.RecordBatch, row: int) -> str | None:
    """Where row ``row`` of a tagged batch is in its file, in words (see :func:`tag_source`, :func:`tag_rows`), or
    ``None``."""
    places, where = row_origins(batch)
    if not 0 <= row < len(where) or where[row, 0] < 0:
        return None
    return f"row {where[row, 1]} of {places[where[row, 0]]}"


def row_origins(batch: pa.RecordBatch) -> tuple[list[str], np.ndarray]:
    """Where each row of ``batch`` is: ``(places, where)``; row ``i`` is row ``where[i, 1]`` of ``places[where[i, 0]]``.

    A place is a file, or a part of one (``"its byte range from byte 4096 of a.jsonl"``); an unknown
    row has ``where[i, 0] == -1``. Read from a reader's tag (:func:`tag_source`) or a shuffle's (:func:`tag_rows`).

    Example:
        >>> places, where = row_origins(tag_source(pa.record_batch({"a": [1, 2]}), "a.parquet", 70))
        >>> places, where.tolist()
        (['a.parquet'], [[0, 70], [0, 71]])
    """
    metadata = batch.schema.metadata or {}
    unknown = np.full((batch.num_rows, 2), -1, dtype=np.int64)
    if ROWS_METADATA in metadata:
        return _decode_rows(metadata[ROWS_METADATA], batch.num_rows) or ([], unknown)
    first, source = metadata.get(ROW_METADATA), source_of(batch)
    if first is None or source is None:
        return [], unknown
    start, _, rows_of = first.decode(errors="replace").partition("\t")
    try:
        rows = int(start) + np.arange(batch.num_rows, dtype=np.int64)
    except (ValueError, OverflowError):  # not a tag padpipe wrote (a crafted state)
        return [], unknown
    return [f"{rows_of + ' of ' if rows_of else ''}{source}"], np.stack([np.zeros_like(rows), rows], axis=1)


def tag_rows(batch: pa.RecordBatch, places: list[str], where: np.ndarray) -> pa.RecordBatch:
    """``batch``, rows gathered from several files, with each row's place in its schema metadata (zero-copy).

    ``places`` and ``where`` as :func:`row_origins` returns them; only the places its rows name are kept.

    Example:
        >>> batch = tag_rows(pa.record_batch({"a": [1, 2]}), ["a.jsonl", "b.jsonl"], np.array([[1, 7], [-1, -1]]))
        >>> row_of(batch, 0), row_of(batch, 1)
        ('row 7 of b.jsonl', None)
    """
    metadata = {k: v for k, v in (batch.schema.metadata or {}).items() if k not in _TAGS}
    known = where[:, 0] >= 0
    if known.any():
        used, index = np.unique(where[known, 0], return_inverse=True)
        compact = where.astype("<i8")  # a copy
        compact[known, 0] = index
        names = json.dumps([places[int(i)] for i in used]).encode()
        metadata[ROWS_METADATA] = names + b"\n" + compact.tobytes()
    return batch.replace_schema_metadata(metadata or None)


def slice_rows(batch: pa.RecordBatch, offset: int, length: int | None = None) -> pa.RecordBatch:
    """``batch.slice(offset, length)`` whose tags still name each row's own place (a plain slice keeps the first's).

    Example:
        >>> part = slice_rows(tag_source(pa.record_batch({"a": [1, 2, 3]}), "a.parquet", 70), 2)
        >>> row_of(part, 0)
        'row 72 of a.parquet'
    """
    part = batch.slice(offset, length)
    if not any(key in (batch.schema.metadata or {}) for key in _TAGS):
        return part
    places, where = row_origins(batch)
    return tag_rows(part, places, where[offset : offset + part.num_rows])


def _decode_rows(value: bytes, num_rows: int) -> tuple[list[str], np.ndarray] | None:
    """The places and rows of :func:`tag_rows`, or ``None`` when ``value`` is not that (a crafted state)."""
    names, _, raw = value.partition(b"\n")
    try:
        places = json.loads(names)
    except ValueError:
        return None
    if not isinstance(places, list) or not all(isinstance(p, str) for p in places) or len(raw) != 16 * num_rows:
        return None
    where = np.frombuffer(raw, dtype="<i8").reshape(num_rows, 2).astype(np.int64)
    if ((where[:, 0] < -1) | (where[:, 0] >= len(places))).any():
        return None
    return places, where


def untag_source(batch: pa.RecordBatch) -> pa.RecordBatch:
    """``batch`` without the source tags (for rows gathered from several files)."""
    metadata = batch.schema.metadata
    if not metadata or not any(key in metadata for key in _TAGS):
        return batch
    rest = {k: v for k, v in metadata.items() if k not in _TAGS}
    return batch.replace_schema_metadata(rest or None)


_TAGS = (SOURCE_METADATA, ROW_METADATA, ROWS_METADATA)
