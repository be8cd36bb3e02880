"""Turn the ``paths`` a reader was given into a sorted list of files, local or on any fsspec store.

:func:`check_paths` validates the argument without I/O; :func:`expand_paths` lists (readers call it
on their first ``reset``, never in ``__init__``). Each :class:`FileRef` keeps the size and version
(modification time, ETag or generation) the listing reported, and where the version is only a
modification time a digest of its content (:mod:`padpipe.readers.content`); opening it checks them.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, BinaryIO

import fsspec.core
import pyarrow as pa
from fsspec import AbstractFileSystem
from fsspec.implementations.local import LocalFileSystem

from padpipe.readers.content import content_digest, strong_version

GLOB_CHARS = frozenset("*?[")
TO_MEASURE = ""
"""``listed_content`` of a file whose digest is still to be taken (see :meth:`FileRef.measured`)."""

SETTLED_NS = 2_000_000_000
"""How old a file's last change must be for its ``stat`` to vouch for its content (see :meth:`FileRef.signature`)."""

FolderFiles = Callable[[AbstractFileSystem, str], "list[str] | None"]


VERSION_KEYS = ("ETag", "etag", "generation", "mtime", "LastModified", "last_modified", "updated", "created")
"""fsspec ``info`` keys that tell one version of a file from another, first found wins."""


class ChangedFileError(OSError):
    """A listed file whose size or version (modification time, ETag) is not what it was when it was listed."""


@dataclass(frozen=True)
class FileRef:
    """One input file: the filesystem that holds it, its path there and what the listing saw of it.

    A filesystem made in another process (a DataLoader worker got the pipeline's listing) is re-made
    on first use: fsspec's async filesystems (s3, gcs, http) cannot be used across a ``fork``.

    Attributes:
        fs: The fsspec filesystem.
        path: The path in ``fs``'s own form (no protocol).
        listed_size: Size in bytes when the file was listed (``None``: not known).
        listed_version: Its modification time, ETag or generation then, as a string (``None``: not known).
        listed_content: A digest of its content then (:mod:`padpipe.readers.content`); ``None`` where
            the version changes with the content (an ETag) and no digest is needed.
    """

    fs: AbstractFileSystem
    path: str
    listed_size: int | None = None
    listed_version: str | None = None
    listed_content: str | None = None
    _pid: int = field(default_factory=os.getpid, repr=False, compare=False)

    @property
    def is_local(self) -> bool:
        """Whether the file is on the local disk (so it can be memory-mapped)."""
        return isinstance(self.fs, LocalFileSystem)

    @property
    def name(self) -> str:
        """The path for messages: plain for local files, a URL (``s3://...``) otherwise."""
        return self.path if self.is_local else self.fs.unstrip_protocol(self.path)

    def open(self, *, block_size: int | None = None, cache_type: str | None = None) -> BinaryIO:
        """Open the file for binary reading (seekable), streamed in ``block_size`` requests.

        Its size and version, looked up afresh, must be the listed ones: ``FileNotFoundError`` when
        it is gone, :class:`ChangedFileError` when it changed since it was listed.
        """
        fs = self._fs()
        options = {k: v for k, v in (("block_size", block_size), ("cache_type", cache_type)) if v is not None}
        if not self.is_local:
            fs.invalidate_cache(self.path)
        handle = fs.open(self.path, "rb", **options)
        try:
            size = getattr(handle, "size", None)
            details = getattr(handle, "details", None)
            version = file_version(details) if isinstance(details, dict) else None
            self._check(size if isinstance(size, int) else None, version)
        except BaseException:
            handle.close()
            raise
        return handle

    def open_native(self, *, mmap: bool = False, **options: Any) -> pa.NativeFile:
        """The file as a pyarrow input: memory-mapped or an ``OSFile`` when local, else :meth:`open`'s stream."""
        if self.is_local:
            stat = os.stat(self.path)
            self._check(stat.st_size, repr(stat.st_mtime))
            return pa.memory_map(self.path) if mmap else pa.OSFile(self.path)
        return pa.PythonFile(self.open(**options), mode="r")

    def size(self) -> int:
        """Size of the file in bytes (the listed size when known)."""
        return self.listed_size if self.listed_size is not None else int(self._fs().size(self.path))

    @property
    def identity(self) -> str:
        """``name``, size, version and content digest, tab-separated: what states and the token cache record."""
        content = f"\t{self.listed_content}" if self.listed_content else ""
        return f"{self.name}\t{self.listed_size}\t{self.listed_version}{content}"

    def content(self, size: int | None = None) -> str:
        """A digest of the file's content now (reads at most 1 MiB, or its first and last 64 KiB); ``size``: its
        size now, when just looked up."""
        fs = self._fs()
        if size is None:
            if not self.is_local:
                fs.invalidate_cache(self.path)
            size = os.stat(self.path).st_size if self.is_local else int(fs.size(self.path))
        if self.is_local:
            with open(self.path, "rb") as handle:

                def read(start: int, end: int) -> bytes:
                    handle.seek(start)
                    return handle.read(end - start)

                return content_digest(read, size)
        return content_digest(lambda start, end: fs.cat_file(self.path, start=start, end=end), size)

    def measured(self) -> FileRef:
        """This file with its content digest taken, where the listing marked it to be (I/O)."""
        if self.listed_content != TO_MEASURE:
            return self
        return dataclasses.replace(self, listed_content=self.content())

    def check_unchanged(self) -> None:
        """Raise :class:`ChangedFileError` unless the file has the size, version and content it was listed with
        (``FileNotFoundError`` when it is gone).

        One ``stat`` or request, plus the content digest's small read where the version is only a
        modification time (compared only locally: a store's ``info`` may give it otherwise than its
        listing did).
        """
        if self.is_local:
            stat = os.stat(self.path)
            size, version = stat.st_size, repr(stat.st_mtime)
        else:
            fs = self._fs()
            fs.invalidate_cache(self.path)
            info = fs.info(self.path)
            size, version = info.get("size"), file_version(info) if self.listed_content is None else None
        self._check(size if isinstance(size, int) else None, version)
        self.check_content(size if isinstance(size, int) else None)

    def signature(self) -> tuple[int, ...] | None:
        """A local file's device, inode, size, mtime and ctime (ns); ``None`` for a file on object storage.

        Any write changes it (restoring the mtime sets the ctime), so a file found unchanged need not
        be read again while it stays the same. ``None`` too while the ctime is under
        :data:`SETTLED_NS` old: a coarse clock may keep it over a second write (git's "racy" entry).
        """
        if not self.is_local:
            return None
        stat = os.stat(self.path)
        if time.time_ns() - stat.st_ctime_ns < SETTLED_NS:
            return None
        return (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)

    def check_content(self, size: int | None = None) -> None:
        """Raise :class:`ChangedFileError` when the content is not what it was when it was listed (``size``: see
        :meth:`content`)."""
        if not self.listed_content:
            return
        now = self.content(size)
        if now != self.listed_content:
            raise ChangedFileError(
                f"{self.name}: its content is not what it was when it was listed (digest {self.listed_content} "
                f"-> {now}, although size and version are the same); it was rewritten since"
            )

    def _fs(self) -> AbstractFileSystem:
        """``fs``, re-made (same class and options) when used in another process."""
        if self._pid != os.getpid():
            fs = type(self.fs)(*self.fs.storage_args, **self.fs.storage_options)  # fsspec drops its cache on fork
            object.__setattr__(self, "fs", fs)
            object.__setattr__(self, "_pid", os.getpid())
        return self.fs

    def _check(self, size: int | None, version: str | None) -> None:
        if size is not None and self.listed_size is not None and size != self.listed_size:
            raise ChangedFileError(
                f"{self.name}: is {size} bytes, but was {self.listed_size} bytes when it was listed; it changed since"
            )
        if version is not None and self.listed_version is not None and version != self.listed_version:
            raise ChangedFileError(
                f"{self.name}: has version {version} (modification time or ETag), but had {self.listed_version} "
                "when it was listed; it was replaced since"
            )


def file_version(info: dict[str, Any]) -> str | None:
    """The version an fsspec ``info`` dict gives a file (mtime, ETag, generation), as a string, or ``None``.

    Example:
        >>> file_version({"size": 3, "mtime": 1700000000.5}), file_version({"ETag": '"abc"'})
        ('1700000000.5', '"abc"')
    """
    for key in VERSION_KEYS:
        value = info.get(key)
        if value is not None:
            return repr(value) if isinstance(value, float) else str(value)
    return None


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
        paths: Files, folders (searched recursively) or globs, local or fsspec URLs.
        suffixes: File name endings a folder search keeps (``(".parquet",)``); files named
            directly or matched by a glob are kept whatever their name.
        storage_options: Keyword arguments for the fsspec filesystem (credentials, endpoint).
        folder_files: Optional hook ``(fs, folder) -> paths or None`` that lists a folder in a
            format-specific way (a ``save_to_disk`` folder's ``state.json``).

    Returns:
        One :class:`FileRef` per file. A folder search skips names starting with ``.`` or ``_``
        (``_SUCCESS``, ``.cache``).

    Raises:
        FileNotFoundError: A pattern names nothing, or a folder or glob holds no matching file.

    Example:
        >>> [f.name for f in expand_paths(["memory://docs/*.jsonl"], suffixes=(".jsonl",))]  # doctest: +SKIP
        ['memory:///docs/a.jsonl', 'memory:///docs/b.jsonl']
    """
    files: list[FileRef] = []
    for pattern in paths:
        fs, path = fsspec.core.url_to_fs(pattern, **(storage_options or {}))
        found: list[FileRef] = []
        if any(c in GLOB_CHARS for c in path):
            matches = fs.glob(path, detail=True)
            for match in sorted(matches):
                info = matches[match]
                is_dir = info.get("type") == "directory"
                found += _folder(fs, match, suffixes, folder_files) if is_dir else [_ref(fs, match, info)]
        else:
            try:
                info = fs.info(path)
            except FileNotFoundError:
                raise FileNotFoundError(f"No such file or folder: {pattern!r}.") from None
            is_dir = info.get("type") == "directory"
            found = _folder(fs, path, suffixes, folder_files) if is_dir else [_ref(fs, path, info)]
        if not found:
            wanted = "/".join(suffixes)
            raise FileNotFoundError(f"{pattern!r} matches no files; expected at least one {wanted} file there.")
        files += found
    return files


def _ref(fs: AbstractFileSystem, path: str, info: dict[str, Any] | None) -> FileRef:
    if info is not None and info.get("islink"):  # a folder search or glob gives a link's own mtime: use its target's
        info = fs.info(path)
    size = None if info is None else info.get("size")
    version = None if info is None else file_version(info)
    content = None if strong_version(info) else TO_MEASURE
    return FileRef(fs, path, size if isinstance(size, int) else None, version, content)


def _folder(fs: AbstractFileSystem, folder: str, suffixes: tuple[str, ...], hook: FolderFiles | None) -> list[FileRef]:
    root = folder.rstrip("/")
    listed = hook(fs, folder) if hook is not None else None
    infos = fs.find(root, detail=True)  # one listing gives every size
    if listed is not None:
        return [_ref(fs, path, infos.get(path)) for path in listed]
    keep = []
    for path in sorted(infos):
        parts = path[len(root) :].strip("/").split("/")
        if path.endswith(suffixes) and not any(p.startswith((".", "_")) for p in parts):
            keep.append(_ref(fs, path, infos[path]))
    return keep
