"""Turn the ``paths`` a reader was given into a sorted list of files, local or on any fsspec store.

A path may be a file, a folder (searched recursively for files with the reader's suffixes), a glob
(``data/*.parquet``, ``s3://bucket/**/*.jsonl.gz``) or a list of those. Listing does I/O, so
readers call :func:`expand_paths` from ``list_units`` (on the first ``reset``), never in
``__init__``; :func:`check_paths` validates the argument without touching storage.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, BinaryIO, Callable, Sequence

import fsspec.core
from fsspec import AbstractFileSystem
from fsspec.implementations.local import LocalFileSystem

GLOB_CHARS = frozenset("*?[")

FolderFiles = Callable[[AbstractFileSystem, str], "list[str] | None"]


@dataclass(frozen=True)
class FileRef:
    """One input file: the filesystem that holds it and its path there.

    Attributes:
        fs: The fsspec filesystem.
        path: The path in ``fs``'s own form (no protocol).
    """

    fs: AbstractFileSystem
    path: str

    @property
    def is_local(self) -> bool:
        """Whether the file is on the local disk (so it can be memory-mapped)."""
        return isinstance(self.fs, LocalFileSystem)

    @property
    def name(self) -> str:
        """The path for messages: plain for local files, a URL (``s3://...``) otherwise."""
        return self.path if self.is_local else self.fs.unstrip_protocol(self.path)

    def open(self) -> BinaryIO:
        """Open the file for binary reading (seekable)."""
        return self.fs.open(self.path, "rb")

    def size(self) -> int:
        """Size of the file in bytes."""
        return int(self.fs.size(self.path))


def check_paths(paths: Any) -> tuple[str, ...]:
    """Validate a ``paths`` argument without I/O and return it as a tuple of strings.

    Example:
        >>> check_paths("data/*.parquet")
        ('data/*.parquet',)
        >>> check_paths([])
        Traceback (most recent call last):
        ...
        ValueError: `paths` must name at least one file, folder or glob, but is [] instead.
    """
    items = [paths] if isinstance(paths, (str, os.PathLike)) else paths
    if not isinstance(items, (list, tuple)) or not all(isinstance(p, (str, os.PathLike)) for p in items):
        raise TypeError(f"`paths` must be a path, a glob or a list of them, but is {paths!r} instead.")
    if not items:
        raise ValueError(f"`paths` must name at least one file, folder or glob, but is {paths!r} instead.")
    return tuple(os.fspath(p) for p in items)


def expand_paths(
    paths: Sequence[str],
    *,
    suffixes: tuple[str, ...],
    storage_options: dict[str, Any] | None = None,
    folder_files: FolderFiles | None = None,
) -> list[FileRef]:
    """List the files that ``paths`` name, in order: each pattern's files sorted, patterns as given.

    Args:
        paths: Files, folders or globs, local or fsspec URLs (``s3://``, ``memory://``, ...).
        suffixes: File name endings a folder search keeps (``(".parquet",)``); files named
            directly or matched by a glob are kept whatever their name.
        storage_options: Keyword arguments for the fsspec filesystem (credentials, endpoint).
        folder_files: Optional hook ``(fs, folder) -> paths or None`` that lists a folder in a
            format-specific way (a ``save_to_disk`` folder's ``state.json``); ``None`` falls back
            to the recursive search.

    Returns:
        One :class:`FileRef` per file. In a folder search, files and folders whose names start
        with ``.`` or ``_`` (``_SUCCESS``, ``.cache``) are skipped.

    Raises:
        FileNotFoundError: A pattern names nothing, or a folder or glob holds no matching file.

    Example:
        >>> [f.name for f in expand_paths(["memory://docs/*.jsonl"], suffixes=(".jsonl",))]  # doctest: +SKIP
        ['memory:///docs/a.jsonl', 'memory:///docs/b.jsonl']
    """
    files: list[FileRef] = []
    for pattern in paths:
        fs, path = fsspec.core.url_to_fs(pattern, **(storage_options or {}))
        found: list[str] = []
        if any(c in GLOB_CHARS for c in path):
            for match in sorted(fs.glob(path)):
                found += _folder(fs, match, suffixes, folder_files) if fs.isdir(match) else [match]
        elif fs.isdir(path):
            found = _folder(fs, path, suffixes, folder_files)
        elif fs.exists(path):
            found = [path]
        else:
            raise FileNotFoundError(f"No such file or folder: {pattern!r}.")
        if not found:
            wanted = "/".join(suffixes)
            raise FileNotFoundError(f"{pattern!r} matches no files; expected at least one {wanted} file there.")
        files += [FileRef(fs, p) for p in found]
    return files


def _folder(fs: AbstractFileSystem, folder: str, suffixes: tuple[str, ...], hook: FolderFiles | None) -> list[str]:
    listed = hook(fs, folder) if hook is not None else None
    if listed is not None:
        return listed
    root = folder.rstrip("/")
    keep = []
    for path in sorted(fs.find(root)):
        parts = path[len(root) :].strip("/").split("/")
        if path.endswith(suffixes) and not any(p.startswith((".", "_")) for p in parts):
            keep.append(path)
    return keep
