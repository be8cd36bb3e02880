"""The text fields of an input, found as ``inspect`` finds them (for the demo and other commands)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from padpipe.inspection.sample import choose_fields, first_schema, make_reader, source_pipeline
from padpipe.stats import PipelineStats


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
