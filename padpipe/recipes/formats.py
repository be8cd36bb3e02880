"""Tell a corpus path's format (Parquet, Arrow, JSON Lines, CSV) from its name, or by looking inside a folder."""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Sequence

import padpipe as pp

SUFFIXES: dict[str, tuple[str, ...]] = {
    "parquet": (".parquet", ".parq", ".pq"),
    "arrow": (".arrow", ".arrows", ".feather", ".ipc"),
    "jsonl": tuple(base + comp for base in (".jsonl", ".ndjson", ".json") for comp in ("", ".gz", ".zst", ".zstd")),
    "csv": (".csv",),
}
READERS: dict[str, Callable[..., pp.Pipeline]] = {
    "parquet": pp.read_parquet,
    "arrow": pp.read_arrow,
    "jsonl": pp.read_jsonl,
    "csv": pp.read_csv,
}
GLOB_CHARS = frozenset("*?[")
SAVED_DATASET_FILES = ("state.json", "dataset_dict.json")


def format_of(path: str) -> str:
    """``"parquet"``, ``"arrow"``, ``"jsonl"`` or ``"csv"`` for a file, glob, folder or URL.

    A name (or glob) ending in a known suffix decides alone, without I/O. A folder is looked into:
    a ``save_to_disk`` folder is Arrow; otherwise the one format of the files it holds
    (recursively, names starting with ``.`` or ``_`` skipped).

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
    import fsspec.core

    fs, root = fsspec.core.url_to_fs(path)
    if any(c in GLOB_CHARS for c in root):
        files = []
        for match in sorted(fs.glob(root)):
            files += _files_in(fs, match) if fs.isdir(match) else [match]
    elif fs.isdir(root):
        if any(fs.exists(posixpath.join(root, name)) for name in SAVED_DATASET_FILES):
            return "arrow"  # read_arrow reads a saved Dataset (and names the splits of a DatasetDict)
        files = _files_in(fs, root)
    elif fs.exists(root):
        known = ", ".join(s for suffixes in SUFFIXES.values() for s in suffixes[:1])
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


def read_corpus(paths: Sequence[str], *, columns: list[str] | None = None) -> pp.Pipeline:
    """One reader over ``paths``, all of one format (``columns``: those to read; default: all).

    Example:
        >>> read_corpus([pp.examples.SAMPLE_JSONL], columns=["text"]).source.name
        'read_jsonl'
    """
    formats = {path: format_of(path) for path in paths}
    kinds = sorted(set(formats.values()))
    if len(kinds) > 1:
        raise ValueError(
            f"The paths of one corpus must share one format, but they are {formats!r}; "
            "pass a dict of corpora to mix formats."
        )
    return READERS[kinds[0]](list(paths), columns=columns)


def _suffix_format(path: str) -> str | None:
    name = path.rstrip("/").lower()
    return next((kind for kind, suffixes in SUFFIXES.items() if name.endswith(suffixes)), None)


def _files_in(fs: object, folder: str) -> list[str]:
    root = folder.rstrip("/")
    keep = []
    for path in fs.find(root):  # type: ignore[attr-defined]
        parts = path[len(root) :].strip("/").split("/")
        if not any(p.startswith((".", "_")) for p in parts):
            keep.append(path)
    return keep
