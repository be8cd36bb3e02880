"""Entry points that start a pipeline from files, Hugging Face datasets or any iterable."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Literal

from padpipe import _build
from padpipe._checks import check_sources
from padpipe.errors import one_of, positive
from padpipe.pipeline import Pipeline, Stage
from padpipe.readers.arrow import ArrowReader
from padpipe.readers.csv import CsvReader
from padpipe.readers.hf import hf_reader
from padpipe.readers.iterable import IterableReader
from padpipe.readers.jsonl import JsonlReader
from padpipe.readers.listing import SharedListing
from padpipe.readers.parquet import ParquetReader
from padpipe.readers.retry import Retry

PathsLike = str | Sequence[str]


def _start(name: str, reader: type[Any], **options: Any) -> Pipeline:
    positive("chunk_rows", options.get("chunk_rows", 1))
    return Pipeline(Stage(name, _build.source, {"reader": reader, **options}))


def _read_files(
    name: str,
    reader: type[Any],
    paths: PathsLike,
    columns: Sequence[str] | None,
    chunk_rows: int,
    storage_options: dict | None,
    retries: int | Retry,
    on_missing: str,
    **options: Any,
) -> Pipeline:
    """A file reader's pipeline: its storage options checked, its local paths that name nothing refused now (not
    in the loader), and one listing shared by all its loaders and workers."""
    Retry.of(retries)
    one_of("on_missing", on_missing, ("raise", "skip"))
    positive("chunk_rows", chunk_rows)
    check_sources(paths, reader.SUFFIXES)
    files = {"paths": paths, "columns": columns, "storage_options": storage_options, "listing": SharedListing()}
    return _start(name, reader, chunk_rows=chunk_rows, retries=retries, on_missing=on_missing, **files, **options)


def read_parquet(
    paths: PathsLike,
    *,
    columns: Sequence[str] | None = None,
    chunk_rows: int = 1024,
    storage_options: dict | None = None,
    retries: int | Retry = 5,
    on_missing: Literal["raise", "skip"] = "raise",
) -> Pipeline:
    """Read Parquet files row group by row group.

    Args:
        paths: A path, glob, folder or list of them; local or any fsspec URL (``s3://...``).
        columns: Columns to read (default: all).
        chunk_rows: Most rows per chunk passed downstream.
        storage_options: Options for the fsspec filesystem (credentials, endpoint).
        retries: Retries of a transient storage error (connection reset, timeout, 5xx), with
            exponential backoff; or a ``padpipe.readers.retry.Retry`` policy.
        on_missing: A file gone or resized since it was listed: ``"raise"`` or ``"skip"`` it
            (counted in stats as ``read.missing_file``).

    Files are listed once per pipeline, on first use, shared by its loaders and workers; a local path
    that names no file, or a URL whose fsspec backend is not installed, fails here, at once.

    Example:
        >>> pipe = pp.read_parquet(pp.examples.SAMPLE_PARQUET, columns=["sentence1", "label"])
        >>> next(iter(pipe.loader())).num_rows
        1024
    """
    return _read_files("read_parquet", ParquetReader, paths, columns, chunk_rows, storage_options, retries, on_missing)


def read_arrow(
    paths: PathsLike,
    *,
    columns: Sequence[str] | None = None,
    chunk_rows: int = 1024,
    storage_options: dict | None = None,
    retries: int | Retry = 5,
    on_missing: Literal["raise", "skip"] = "raise",
) -> Pipeline:
    """Read Arrow IPC files, file or stream format (``datasets`` cache files, ``save_to_disk`` folders).

    Takes :func:`read_parquet`'s arguments (``paths`` may name a ``save_to_disk`` folder).

    Example:
        >>> pipe = pp.read_arrow("my_dataset/")  # doctest: +SKIP
    """
    return _read_files("read_arrow", ArrowReader, paths, columns, chunk_rows, storage_options, retries, on_missing)


def read_jsonl(
    paths: PathsLike,
    *,
    columns: Sequence[str] | None = None,
    chunk_rows: int = 1024,
    storage_options: dict | None = None,
    retries: int | Retry = 5,
    on_missing: Literal["raise", "skip"] = "raise",
    on_error: Literal["raise", "skip"] = "raise",
) -> Pipeline:
    """Read JSON Lines files: plain, ``.gz`` or ``.zst``; one JSON object per line.

    Takes :func:`read_parquet`'s arguments (``columns``: the keys to keep) and this one:

    Args:
        on_error: A line that cannot be a row (invalid UTF-8 or JSON, a value of the wrong
            type): ``"raise"`` a ``DataError`` naming file and line, or ``"skip"`` it (counted per
            file in ``loader.stats().skipped`` as ``read.bad_row:<file>``).

    Example:
        >>> pipe = pp.read_jsonl(pp.examples.SAMPLE_JSONL)
        >>> sorted(next(iter(pipe.loader())).schema.names)
        ['id', 'text']
    """
    one_of("on_error", on_error, ("raise", "skip"))
    return _read_files(
        "read_jsonl", JsonlReader, paths, columns, chunk_rows, storage_options, retries, on_missing, on_error=on_error
    )


def read_csv(
    paths: PathsLike,
    *,
    columns: Sequence[str] | None = None,
    chunk_rows: int = 1024,
    storage_options: dict | None = None,
    retries: int | Retry = 5,
    on_missing: Literal["raise", "skip"] = "raise",
) -> Pipeline:
    """Read CSV files with a header line (``pyarrow.csv``; column types from each file's first MiB).

    Takes :func:`read_parquet`'s arguments. A file is one work unit, shared whole between consumers; a resumed
    reader parses its file again up to the saved row.

    Example:
        >>> import pathlib, tempfile
        >>> path = pathlib.Path(tempfile.mkdtemp(), "pairs.csv")
        >>> _ = path.write_text("sentence1,sentence2,label\\nA cat.,A dog.,0\\n")
        >>> next(iter(pp.read_csv(str(path)).loader())).to_pylist()
        [{'sentence1': 'A cat.', 'sentence2': 'A dog.', 'label': 0}]
    """
    return _read_files("read_csv", CsvReader, paths, columns, chunk_rows, storage_options, retries, on_missing)


def from_hf(
    dataset: Any, *, columns: Sequence[str] | None = None, chunk_rows: int = 1024, tokens: str | None = None
) -> Pipeline:
    """Read a ``datasets.Dataset`` (its Arrow table, zero-copy) or a streaming ``IterableDataset``.

    Args:
        dataset: A ``datasets.Dataset`` or ``datasets.IterableDataset``. A ``DatasetDict`` is an
            error asking for a split.
        columns: Columns to read (default: all).
        chunk_rows: Most rows per chunk passed downstream.
        tokens: The token ids' column of an already tokenized dataset: shorthand for
            ``from_hf(ds).tokens(tokens)`` (:meth:`padpipe.Pipeline.tokens`).

    Example:
        >>> import datasets
        >>> ds = datasets.Dataset.from_dict({"text": ["a", "b"]})
        >>> next(iter(pp.from_hf(ds).loader())).num_rows
        2
        >>> ds = datasets.Dataset.from_dict({"input_ids": [[2, 7, 3], [2, 3]]})
        >>> next(iter(pp.from_hf(ds, tokens="input_ids").batch(2).pad(pad_id=0).loader()))["input_ids"].tolist()
        [[2, 7, 3], [2, 3, 0]]
    """
    if tokens is not None and not isinstance(tokens, str):
        raise TypeError(f"`tokens` must be a column name, but is {tokens!r} instead.")
    reader, options = hf_reader(dataset, columns=columns)
    pipe = _start("from_hf", reader, chunk_rows=chunk_rows, **options)
    return pipe if tokens is None else pipe.tokens(tokens)


def from_iterable(iterable: Iterable[dict[str, Any]], *, chunk_rows: int = 1024) -> Pipeline:
    """Read any re-iterable of dicts (a list, a generator factory's result per epoch).

    Each epoch iterates ``iterable`` again (pass a list, or an object whose ``__iter__`` starts over);
    resume skips the rows already read.

    Example:
        >>> next(iter(pp.from_iterable([{"text": "a"}, {"text": "b"}]).loader())).to_pylist()
        [{'text': 'a'}, {'text': 'b'}]
    """
    return _start("from_iterable", IterableReader, iterable=iterable, chunk_rows=chunk_rows)
