"""Cheap checks made while a pipeline is put together, so a typo fails at the call that made it, not in a worker.

What is cheap to know: a local path's first file, a Parquet footer or Arrow schema, a local JSON Lines file's
first row, ``columns=``, a ``datasets.Dataset``. Anything else, or a check that cannot decide (a file it cannot
open), is left to the reader.
"""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Iterator
from typing import Any

from padpipe._optional import missing
from padpipe.chat.options import MISSING_COLUMN
from padpipe.errors import DataError
from padpipe.readers.paths import GLOB_CHARS, check_paths
from padpipe.stage import Recipe

LOCAL_PROTOCOLS = (None, "file", "local")
SCHEMA_READERS = ("read_parquet", "read_arrow")
"""Readers whose schema one file's header gives cheaply."""
COLUMN_KEEPING_STAGES = ("shuffle",)
"""Stages between reader and tokenize that pass every column through unchanged."""


def check_sources(paths: Any, suffixes: tuple[str, ...]) -> None:
    """Raise at once for a local path that names nothing, or a URL whose fsspec backend is missing.

    Args:
        paths: What the reader was given (a path, glob, folder, URL or list of them).
        suffixes: The file name endings the reader looks for in folders.

    Raises:
        TypeError, ValueError: ``paths`` is not a path or a non-empty list of them.
        FileNotFoundError: A local path does not exist, or a local glob or folder holds no file
            the reader reads.
        MissingDependencyError: A URL needs a package that is not installed (``s3://``: s3fs).

    Example:
        >>> check_sources("no/such/*.parquet", (".parquet",))
        Traceback (most recent call last):
        ...
        FileNotFoundError: 'no/such/*.parquet' matches no files; expected at least one .parquet file there.
    """
    for pattern in check_paths(paths):
        path = _local(pattern)
        if path is None:
            _check_backends(pattern)
        elif _first_file(path, suffixes) is None:
            if not any(c in GLOB_CHARS for c in path) and not os.path.exists(path):
                raise FileNotFoundError(f"No such file or folder: {pattern!r}.")
            wanted = "/".join(suffixes)
            raise FileNotFoundError(f"{pattern!r} matches no files; expected at least one {wanted} file there.")


MISSING_STEPS = {
    ("tokens", "records"): ".tokenize(tokenizer, ...)",
    ("token batches", "records"): ".tokenize(tokenizer, ...) and then .batch(n) or .bucket(...)",
    ("token batches", "tokens"): ".batch(n) or .bucket(...)",
    ("tensors", "records"): ".tokenize(tokenizer, ...) and then .batch(n).pad(), .bucket(...).pad() or .pack(seq_len)",
    ("tensors", "tokens"): ".batch(n).pad(), .bucket(...).pad() or .pack(seq_len)",
    ("tensors", "token batches"): ".pad()",
}
"""``(what a method needs, what the pipeline yields)``: the stages that turn one into the other."""


def steps_missing(method: str, wanted: str, found: str) -> str:
    """The error for ``.method()`` on a pipeline that yields ``found`` where it needs ``wanted``.

    Example:
        >>> steps_missing("pad", "token batches", "records")
        '.pad() needs token batches as input, but this pipeline yields records here: add .tokenize(tokenizer, ...) and then .batch(n) or .bucket(...) before it.'
    """  # noqa: E501
    message = f".{method}() needs {wanted} as input, but this pipeline yields {found} here"
    add = MISSING_STEPS.get((wanted, found))
    return f"{message}: add {add} before it." if add else f"{message}."


def shuffle_too_late(pipe: Recipe) -> str:
    """The error for ``.shuffle()`` after the rows became tokens: shuffle the rows before that stage, and how.

    Example:
        >>> shuffle_too_late(pp.from_iterable([{"input_ids": [1]}]).tokens("input_ids"))
        ".shuffle() needs records as input, but this pipeline yields tokens here: shuffle the rows before .tokens(), e.g. pipe.shuffle(buffer_size, seed=0).tokens('input_ids')."
    """  # noqa: E501
    message = steps_missing("shuffle", "records", pipe.output).rstrip(".")
    first = next((s for s in pipe.stages if s.name in ("tokens", "tokenize")), None)
    if first is None:
        return message + "."
    if first.name == "tokenize":
        return f"{message}: shuffle the rows before .tokenize(), e.g. pipe.shuffle(buffer_size, seed=0).tokenize(...)."
    column = first.options["column"]
    if pipe.source.name == "from_hf" and pipe.stages[0] is first:
        return (
            f"{message}: shuffle the rows before they become tokens, pp.from_hf(ds).shuffle(buffer_size, seed=0)"
            f".tokens({column!r}) (pp.from_hf(ds, tokens={column!r}) is pp.from_hf(ds).tokens({column!r}))."
        )
    return f"{message}: shuffle the rows before .tokens(), e.g. pipe.shuffle(buffer_size, seed=0).tokens({column!r})."


def check_budget(max_tokens: int | None, on_oversize: str, max_length: int | None) -> None:
    """Raise ``ValueError`` when ``bucket(max_tokens)`` cannot hold one row that ``tokenize`` lets through.

    Under ``on_oversize="raise"`` a row of ``max_length`` tokens (the tokenize stage's truncation
    length) would stop the epoch with an error; ``"truncate"`` and ``"drop"`` say what to do instead.

    Example:
        >>> check_budget(10, "raise", 512)
        Traceback (most recent call last):
        ...
        ValueError: `max_tokens` must hold one row of max_length=512 tokens (the tokenize stage's truncation), but is 10 instead; raise it, lower max_length, or pass on_oversize='truncate' or 'drop'.
    """  # noqa: E501
    if max_tokens is None or max_length is None or on_oversize != "raise" or max_tokens >= max_length:
        return
    raise ValueError(
        f"`max_tokens` must hold one row of max_length={max_length} tokens (the tokenize stage's truncation), but is "
        f"{max_tokens} instead; raise it, lower max_length, or pass on_oversize='truncate' or 'drop'."
    )


def check_fields(pipe: Recipe) -> None:
    """Raise :class:`~padpipe.errors.DataError` when a column the pipeline reads is not in its input.

    Checks the reader's ``columns`` and the tokenize stage's ``fields`` (the chat stage's columns) against what is cheap to
    know without reading rows (see the module docs); anything else passes.

    Example:
        >>> pipe = pp.read_parquet(pp.examples.SAMPLE_PARQUET).tokenize(pp.examples.tokenizer(), fields="text")
        >>> check_fields(pipe)
        Traceback (most recent call last):
        ...
        padpipe.errors.DataError: tokenize: text field 'text' is not in the data; expected one of the columns ['sentence1', 'sentence2', 'label', 'idx'].
    """  # noqa: E501
    options = pipe.source.options
    if pipe.source.name == "read_jsonl":
        _check_jsonl_fields(pipe)
        return
    available = _known_columns(pipe.source.name, options)
    if available is None:
        return
    where, names = available
    columns = options.get("columns")
    if columns is not None:
        for name in columns:
            if name not in names:
                raise DataError(f"{where}: no column {name!r}; available columns: {list(names)!r}.")
        names = list(columns)
    for stage in _column_keeping(pipe):
        if stage.name == "tokenize":
            for name in stage.options["fields"]:
                if name not in names:
                    raise DataError(
                        f"tokenize: text field {name!r} is not in the data; expected one of the columns "
                        f"{list(names)!r}."
                    )
        if stage.name == "chat":
            for name in stage.options["options"].named():
                if name not in names:
                    raise DataError(f"chat: column {name!r} is not in the data; {MISSING_COLUMN.format(list(names))}")


def _check_jsonl_fields(pipe: Recipe) -> None:
    """A text field tokenize raises on must be a key of the first file's first row (where it is local)."""
    tokenize = next((s for s in _column_keeping(pipe) if s.name == "tokenize"), None)
    if tokenize is None or tokenize.options["on_error"] != "raise":
        return
    path = _local(check_paths(pipe.source.options["paths"])[0])
    file = None if path is None else _first_file(path, pipe.source.options["reader"].SUFFIXES)
    keys = None if file is None else _first_row_keys(file)
    columns = pipe.source.options.get("columns")
    for name in tokenize.options["fields"] if keys is not None else ():
        if name not in keys and (columns is None or name in columns):
            raise DataError(
                f"tokenize: text field {name!r} is not in the first row of {file}; expected one of its keys {keys!r}."
            )


def _column_keeping(pipe: Recipe) -> Iterator[Any]:
    """The stages from the reader up to the first that changes the columns (that one included)."""
    for stage in pipe.stages:
        yield stage
        if stage.name not in COLUMN_KEEPING_STAGES:
            return


FIRST_ROW_BYTES = 1 << 20
"""At most this much of a JSON Lines file is read to find its first row's keys (longer: no check)."""


def _first_row_keys(path: str) -> list[str] | None:
    """The keys of a local JSON Lines file's first row (``.gz``/``.zst`` too); ``None`` if that is not cheap to know."""
    import pyarrow as pa

    try:
        with pa.input_stream(path, compression="detect") as stream:
            head = stream.read(FIRST_ROW_BYTES)
    except (pa.ArrowException, OSError):
        return None
    lines = head.split(b"\n")
    for line in lines[:-1] if len(head) == FIRST_ROW_BYTES else lines:  # a last line cut short is not read
        if line.strip():
            try:
                row = json.loads(line)
            except ValueError:
                return None  # the reader names the line
            return list(row) if isinstance(row, dict) else None
    return None


def _known_columns(source: str, options: dict[str, Any]) -> tuple[str, list[str]] | None:
    """Where the columns come from and their names, when cheap to know; else ``None``."""
    if source == "from_hf":
        names = getattr(options.get("dataset"), "column_names", None)
        return ("<datasets>", list(names)) if names is not None else None
    if source not in SCHEMA_READERS:
        return None
    for path in filter(None, map(_local, check_paths(options["paths"]))):
        file = _first_file(path, options["reader"].SUFFIXES)
        names = _schema_names(file, parquet=source == "read_parquet") if file is not None else None
        if names is not None:
            return file, names
    return None


def _local(pattern: str) -> str | None:
    """The local path ``pattern`` names, or ``None`` for a URL (a protocol other than a file's, or a chain)."""
    import fsspec.core

    protocol, path = fsspec.core.split_protocol(pattern)
    return path if "::" not in pattern and protocol in LOCAL_PROTOCOLS else None


def _schema_names(path: str, *, parquet: bool) -> list[str] | None:
    """The column names in a local file's header (Parquet footer, Arrow IPC schema); ``None`` if unreadable."""
    import pyarrow as pa
    import pyarrow.ipc as ipc
    import pyarrow.parquet as pq

    try:
        if parquet:
            return list(pq.read_schema(path).names)
        with pa.memory_map(path) as source:
            try:
                return list(ipc.open_file(source).schema.names)
            except pa.ArrowInvalid:
                source.seek(0)
                return list(ipc.open_stream(source).schema.names)
    except (pa.ArrowException, OSError):
        return None


def _first_file(path: str, suffixes: tuple[str, ...]) -> str | None:
    """One local file the reader would read for ``path`` (a file, folder or glob), or ``None``."""
    if any(c in GLOB_CHARS for c in path):
        matches: Iterator[str] = glob.iglob(path, recursive=True)
        first = next((f for f in (_usable(m, suffixes) for m in matches) if f is not None), None)
        if first is not None:
            return first
        from fsspec.implementations.local import LocalFileSystem  # fsspec's glob also matches dot-files

        return next((f for f in (_usable(m, suffixes) for m in LocalFileSystem().glob(path)) if f is not None), None)
    return _usable(path, suffixes)


def _usable(path: str, suffixes: tuple[str, ...]) -> str | None:
    """``path`` if it is a file, the first file with one of ``suffixes`` in it if a folder, else ``None``."""
    if os.path.isfile(path):
        return path
    if not os.path.isdir(path):
        return None
    for folder, subfolders, files in os.walk(path):
        subfolders[:] = sorted(d for d in subfolders if not d.startswith((".", "_")))  # as the readers skip them
        for name in sorted(files):
            if name.endswith(suffixes) and not name.startswith((".", "_")):
                return os.path.join(folder, name)
    return None


def _check_backends(url: str) -> None:
    """Raise ``MissingDependencyError`` when a protocol of ``url`` needs a package that is not installed."""
    import fsspec
    import fsspec.core
    from fsspec.registry import known_implementations

    for piece in url.split("::"):
        protocol = fsspec.core.split_protocol(piece)[0]
        if protocol in LOCAL_PROTOCOLS:
            continue
        try:
            fsspec.get_filesystem_class(protocol)
        except ImportError:
            package = known_implementations.get(protocol, {}).get("class", protocol).partition(".")[0]
            raise missing(package, f"reading {url!r}") from None
