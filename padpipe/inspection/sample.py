"""What ``inspect`` reads: the input's reader and text fields, a seeded sample spread over its units, its size.

The input goes through padpipe's own readers (:func:`~padpipe.inspection.formats.read_corpus`). A
sample is drawn unit by unit (row groups, record batches, byte ranges) in a seeded random order, a
few random rows from each of at least :data:`SPREAD` units, not the first rows of the first file.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from padpipe._progress import Progress
from padpipe.errors import DataError
from padpipe.inspection.formats import FORMATS, read_corpus
from padpipe.pipeline import Pipeline
from padpipe.readers import jsonl
from padpipe.readers.paths import check_paths
from padpipe.readers.schema import require_columns
from padpipe.readers.source import UnitSource, WorkUnit
from padpipe.sharing.consumer import Consumer
from padpipe.stats import PipelineStats

SPREAD = 32
"""A sample takes rows from at least this many units (all of them when there are fewer)."""
OVERSAMPLE = 4
"""From a unit that gives ``k`` rows to the sample, at most ``OVERSAMPLE * k`` rows are read."""
READERS = {read.__name__: name for name, (_, read) in FORMATS.items()} | {"from_hf": "datasets"}
"""The format ``inspect`` reports, by the name of the reader of its input."""


@dataclass(frozen=True)
class Corpus:
    """How big the whole input is, and how that is known.

    Attributes:
        rows: Rows in the input (exact or estimated).
        exact: Whether ``rows`` is a count, not an estimate.
        how: Where the figure comes from, for the report.
        units: Work units of the input (row groups, record batches, byte ranges).
        units_read: Units read from (all of them when every row was read).
        files: Input files (0 for a ``datasets`` object).
        bytes: Total size of the input files.
    """

    rows: int
    exact: bool
    how: str
    units: int
    units_read: int
    files: int
    bytes: int


def source_pipeline(data: Any, *, storage_options: dict[str, Any] | None = None) -> Pipeline:
    """A reader pipeline for ``data``: a path, glob, folder, URL or list of them, or a reader pipeline.

    Example:
        >>> source_pipeline(pp.examples.SAMPLE_JSONL).source.name
        'read_jsonl'
    """
    if isinstance(data, Pipeline):
        if data.stages or data.source.name not in READERS:
            raise ValueError(
                "`data` must be a path or a reader's pipeline without stages (pp.read_parquet(...), "
                f"pp.read_jsonl(...), pp.from_hf(...)), but is a pipeline with stages "
                f"{[s.name for s in data.stages]!r} instead."
            )
        return data
    return read_corpus(list(check_paths(data)), storage_options=storage_options)


def make_reader(pipe: Pipeline, stats: PipelineStats) -> UnitSource:
    """The source node of ``pipe`` for this process alone (no sharding, file order), not yet listed."""
    options = dict(pipe.source.options)
    reader = options.pop("reader")
    return reader(seed=None, consumer=Consumer(), stats=stats, **options)


def first_schema(reader: UnitSource, units: Sequence[WorkUnit]) -> pa.Schema:
    """The schema of the input's first rows; ``DataError`` when it has none."""
    for unit in units:
        rows = reader._read(unit, 0)
        try:
            batch = next(rows, None)
        finally:
            rows.close()
        if batch is not None:
            return batch.schema
    raise DataError(f"{reader.format.describe()}: the input has no rows.")


def choose_fields(
    schema: pa.Schema, fields: str | Sequence[str] | None, where: str, *, option: str = "the text field(s) to tokenize"
) -> tuple[str, ...]:
    """The text fields to tokenize: ``fields`` checked against ``schema``, else ``text``, else its string columns.

    ``option`` says in the error how to name them (``"--fields A [B]"`` in a command line).

    Example:
        >>> schema = pa.schema([("sentence1", pa.string()), ("sentence2", pa.string()), ("label", pa.int64())])
        >>> choose_fields(schema, None, "a.parquet")
        ('sentence1', 'sentence2')
        >>> choose_fields(schema, "sentence", "a.parquet")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        padpipe.errors.DataError: a.parquet: no column 'sentence'; available columns: ['sentence1', ...].
    """
    if fields is not None:
        chosen = (fields,) if isinstance(fields, str) else tuple(fields)
        if len(chosen) not in (1, 2) or not all(isinstance(f, str) and f for f in chosen):
            raise ValueError(f"`fields` must be one column name or two for pairs, but is {fields!r} instead.")
        require_columns(where, schema.names, chosen)
        return chosen
    if "text" in schema.names:
        return ("text",)
    strings = [f.name for f in schema if pa.types.is_string(f.type) or pa.types.is_large_string(f.type)]
    if len(strings) in (1, 2):
        return tuple(strings)
    raise DataError(
        f"{where}: no 'text' column and {len(strings)} string columns, not one or two; pass {option}, "
        f"from the columns {schema.names!r}."
    )


def detect_fields(
    data: Any,
    fields: str | Sequence[str] | None = None,
    *,
    option: str = "the text field(s) to tokenize",
    storage_options: dict[str, Any] | None = None,
) -> tuple[str, ...]:
    """``fields`` checked against ``data``'s columns, else ``text``, else its only one or two string columns.

    Reads the schema of the first rows only.

    Args:
        data: What :func:`padpipe.inspect` takes: a path, glob, folder, URL or a list of them, or a reader pipeline.
        fields: The field(s) asked for; ``None`` finds them.
        option: How the error tells the user to name them when none is found (e.g. ``"--fields A [B]"``).
        storage_options: fsspec options for a URL.

    Raises:
        DataError: A field asked for is not a column, or none is given and none is found.

    Example:
        >>> detect_fields(pp.examples.SAMPLE_PARQUET), detect_fields(pp.examples.SAMPLE_JSONL)
        (('sentence1', 'sentence2'), ('text',))
    """
    pipe = source_pipeline(data, storage_options=storage_options)
    reader = make_reader(pipe, PipelineStats())
    units = reader.listed_units()
    where = units[0].path if units else reader.format.describe()
    return choose_fields(first_schema(reader, units), fields, where, option=option)


def draw_sample(
    reader: UnitSource, units: Sequence[WorkUnit], fields: Sequence[str], *, rows: int, seed: int, progress: bool | None
) -> tuple[pa.Table, Corpus]:
    """About ``rows`` rows (fewer if the input is smaller) in a random order, and the corpus size.

    Units are visited in a seeded random order; each gives up to ``ceil(rows / min(units, SPREAD))``
    rows chosen at random among the first ``OVERSAMPLE`` times that many of its rows.

    Returns:
        ``(table, corpus)``: the sampled rows of ``fields``, shuffled; the corpus's size.
    """
    rng = np.random.default_rng([seed, 0x1A5])
    per_unit = -(-rows // min(len(units), SPREAD))
    parts: list[pa.Table] = []
    taken = visited = read_rows = full_rows = 0
    full_bytes = 0.0
    all_complete = True
    sizes = _unit_bytes(reader, units)
    with Progress("inspect: reading a sample", total=rows, enabled=progress) as bar:
        for i in rng.permutation(len(units)):
            want = min(per_unit, rows - taken)
            if want <= 0:
                break
            unit = units[int(i)]
            table, complete = _read_some(reader, unit, fields, limit=OVERSAMPLE * want)
            visited, read_rows = visited + 1, read_rows + table.num_rows
            all_complete &= complete
            if complete and sizes is not None:
                full_rows, full_bytes = full_rows + table.num_rows, full_bytes + sizes[int(i)]
            k = min(want, table.num_rows)
            parts.append(table.take(np.sort(rng.choice(table.num_rows, size=k, replace=False))))
            taken += k
            bar.update(k)
        if taken < rows:  # the input holds fewer rows: the line ends at what it holds, not at "26%"
            bar.set_total(taken)
    sample = pa.concat_tables(parts) if parts else pa.table({f: pa.array([], pa.string()) for f in fields})
    sample = sample.take(rng.permutation(sample.num_rows))
    return sample, _corpus(reader, units, visited, read_rows, all_complete, full_rows, full_bytes)


def _read_some(reader: UnitSource, unit: WorkUnit, fields: Sequence[str], *, limit: int) -> tuple[pa.Table, bool]:
    """Up to about ``limit`` rows of ``unit`` from its start, and whether that is the whole unit."""
    batches, count = [], 0
    rows = reader._read(unit, 0)
    complete = True
    try:
        for batch in rows:
            batches.append(batch.select(fields))
            count += batch.num_rows
            if count >= limit:
                complete = unit.num_rows is not None and count >= unit.num_rows
                break
    finally:
        rows.close()
    if not batches:
        return pa.table({f: pa.array([], pa.string()) for f in fields}), complete
    return pa.Table.from_batches(batches), complete


def _unit_bytes(reader: UnitSource, units: Sequence[WorkUnit]) -> list[float] | None:
    """Bytes of input behind each unit (a JSONL byte range, a file's share), or ``None`` when not files."""
    files = files_of(reader)
    if not files:
        return None
    per_file: dict[str, int] = {}
    for unit in units:
        per_file[unit.path] = per_file.get(unit.path, 0) + 1
    ranges = isinstance(reader, jsonl.JsonlReader)
    return [
        float(u.stop - u.start) if ranges and u.stop is not None else files[u.path] / per_file[u.path] for u in units
    ]


def files_of(reader: UnitSource) -> dict[str, int]:
    """Each listed file's size in bytes (``{}`` for a reader of something else than files)."""
    return {name: ref.size() for name, ref in reader.listed_files().items()}


def _corpus(
    reader: UnitSource,
    units: Sequence[WorkUnit],
    visited: int,
    read_rows: int,
    all_complete: bool,
    full_rows: int,
    full_bytes: float,
) -> Corpus:
    files = files_of(reader)
    total_bytes = sum(files.values())
    common = {"units": len(units), "units_read": visited, "files": len(files), "bytes": total_bytes}
    if units and all(u.num_rows is not None for u in units):
        return Corpus(sum(u.num_rows or 0 for u in units), True, "counted from metadata", **common)
    if visited == len(units) and all_complete:
        return Corpus(read_rows, True, "every unit read", **common)
    if full_bytes > 0:
        how = f"estimated from {full_rows:,} rows in {_size(full_bytes)} of {_size(total_bytes)}"
        return Corpus(max(round(full_rows / full_bytes * total_bytes), read_rows), False, how, **common)
    estimate = math.ceil(read_rows / max(visited, 1) * len(units))
    return Corpus(estimate, False, "at least: rows per unit read times units (units read in part)", **common)


def _size(n: float) -> str:
    """``n`` bytes for people: ``"1.5 MB"``."""
    unit = "B"
    for unit in ("B", "KB", "MB", "GB", "TB"):  # noqa: B007 (the unit is read after the loop)
        if n < 1024:
            break
        n /= 1024
    return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
