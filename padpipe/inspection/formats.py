"""A corpus path's format (Parquet, Arrow, JSON Lines, CSV) from its name, or by looking inside; its reader; records."""

from __future__ import annotations

import os
import posixpath
from collections.abc import Callable, Sequence
from typing import Any

import fsspec.core

from padpipe.pipeline import Pipeline
from padpipe.readers import arrow, jsonl, parquet
from padpipe.readers.csv import CsvFormat
from padpipe.readers.paths import GLOB_CHARS
from padpipe.sources import from_hf, read_arrow, read_csv, read_jsonl, read_parquet

FORMATS: dict[str, tuple[tuple[str, ...], Callable[..., Pipeline]]] = {
    "parquet": (parquet.SUFFIXES, read_parquet),
    "arrow": (arrow.SUFFIXES, read_arrow),
    "jsonl": (jsonl.SUFFIXES, read_jsonl),
    "csv": (CsvFormat.SUFFIXES, read_csv),
}
"""Each format's file suffixes (its reader's) and reader."""
SAVED_DATASET_FILES = ("state.json", "dataset_dict.json")


def format_of(path: str, storage_options: dict[str, Any] | None = None) -> str:
    """``"parquet"``, ``"arrow"``, ``"jsonl"`` or ``"csv"`` for a file, glob, folder or URL.

    A name (or glob) ending in a known suffix decides alone, without I/O. A folder is looked into:
    a ``save_to_disk`` folder is Arrow; otherwise the one format of the files it holds
    (recursively, names starting with ``.`` or ``_`` skipped).

    Args:
        path: The file, glob, folder or URL.
        storage_options: fsspec options for a URL.

    Raises:
        FileNotFoundError: Nothing is there, or a folder holds no file of a known format.
        ValueError: A file of an unknown format, or a folder or glob with several formats.

    Example:
        >>> format_of("s3://bucket/c4/en/*.json.gz")
        'jsonl'
    """
    found = _suffix_format(path)
    if found is not None:
        return found
    fs, root = fsspec.core.url_to_fs(path, **(storage_options or {}))
    if any(c in GLOB_CHARS for c in root):
        files = []
        for match in sorted(fs.glob(root)):
            files += _files_in(fs, match) if fs.isdir(match) else [match]
    elif fs.isdir(root):
        if any(fs.exists(posixpath.join(root, name)) for name in SAVED_DATASET_FILES):
            return "arrow"  # read_arrow reads a saved Dataset (and names the splits of a DatasetDict)
        files = _files_in(fs, root)
    elif fs.exists(root):
        known = ", ".join(suffixes[0] for suffixes, _ in FORMATS.values())
        raise ValueError(f"{path!r}: unknown file format; expected a name ending in {known} (or a compressed .jsonl).")
    else:
        raise FileNotFoundError(f"No such file or folder: {path!r}.")
    formats = sorted({f for f in map(_suffix_format, files) if f is not None})
    if not formats:
        raise FileNotFoundError(f"{path!r} holds no Parquet, Arrow, JSON Lines or CSV files.")
    if len(formats) > 1:
        raise ValueError(
            f"{path!r} holds files of several formats {formats!r}; expected one format per corpus "
            "(pass a dict of corpora to mix them)."
        )
    return formats[0]


def read_corpus(
    paths: Sequence[str], *, columns: list[str] | None = None, storage_options: dict[str, Any] | None = None
) -> Pipeline:
    """One reader over ``paths``, all of one format (``columns``: those to read; default: all).

    Example:
        >>> read_corpus([pp.examples.SAMPLE_JSONL], columns=["text"]).source.name
        'read_jsonl'
    """
    formats = {path: format_of(path, storage_options) for path in paths}
    kinds = sorted(set(formats.values()))
    if len(kinds) > 1:
        raise ValueError(
            f"The paths of one corpus must share one format, but they are {formats!r}; "
            "pass a dict of corpora to mix formats."
        )
    return FORMATS[kinds[0]][1](list(paths), columns=columns, storage_options=storage_options)


def _suffix_format(path: str) -> str | None:
    name = path.rstrip("/").lower()
    return next((kind for kind, (suffixes, _) in FORMATS.items() if name.endswith(suffixes)), None)


def _files_in(fs: Any, folder: str) -> list[str]:
    root = folder.rstrip("/")
    return [path for path in fs.find(root) if not any(p.startswith((".", "_")) for p in path[len(root) :].split("/"))]


def records(data: Any) -> Pipeline:
    """A pipeline of records from a path or a list of them, a ``datasets`` dataset, or a pipeline (as it is).

    Example:
        >>> records(pp.examples.CHATS_JSONL).source.name
        'read_jsonl'
    """
    if isinstance(data, Pipeline):
        return data
    data = [data] if isinstance(data, (str, os.PathLike)) else data
    if isinstance(data, (list, tuple)) and data and all(isinstance(p, (str, os.PathLike)) for p in data):
        return read_corpus([os.fspath(p) for p in data])
    if type(data).__module__.split(".")[0] == "datasets":
        return from_hf(data)
    raise TypeError(
        "`data` must be a path, a list of paths, a datasets.Dataset or IterableDataset, or a padpipe.Pipeline of "
        f"records, but is {type(data).__name__} instead."
    )
