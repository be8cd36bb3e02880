"""Column checks shared by the readers: validate ``columns``, name missing ones, unify drifting schemas."""

from __future__ import annotations

from typing import Any, Sequence

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
            try:
                arrays.append(column.cast(field.type))
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise DataError(
                    f"{where}: column {field.name!r} is {column.type} here but {field.type} in {reference}; "
                    f"expected one type per column ({exc})."
                ) from exc
    return pa.RecordBatch.from_arrays(arrays, names=schema.names)
