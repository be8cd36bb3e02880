"""The token cache's files: one folder per (tokenizer + options) fingerprint and source unit, one file per segment.

Layout under the cache root (a local path or any fsspec URL)::

    padpipe-cache-v1/<fingerprint>/about.json                 what the fingerprint stands for
    padpipe-cache-v1/<fingerprint>/<unit key>/<lo>-<hi>[e]-<bytes>-<crc32>.arrow

A segment file is an Arrow IPC file of a unit's rows at positions (row numbers, or JSONL byte offsets) in
``[lo, hi)``; ``e`` marks the unit's last segment when its row count is not known up front. Its size and
CRC-32 are in its name, checked before a single id is used; it is published whole (renamed into place on
a local disk, one upload on object storage), and two processes writing the same rows write the same name.
"""

from __future__ import annotations

import json
import os
import re
import stat
import time
import uuid
import zlib
from dataclasses import dataclass
from typing import Any

import fsspec.core
import pyarrow as pa
import pyarrow.ipc as ipc
from fsspec.implementations.local import LocalFileSystem

FORMAT = "padpipe-cache-v1"
ABOUT = "about.json"
SEGMENT_NAME = re.compile(r"^(\d+)-(\d+)(e?)-(\d+)-([0-9a-f]{8})\.arrow$")
UNIT_FOLDER = re.compile(r"^[0-9a-f]{20}/[0-9a-f]{20}$")
"""The only unit folders the cache writes: ``<fingerprint>/<unit key>``, both 20 hex digits."""
TEMP_PREFIX = ".tmp-"
STALE_SECONDS = 600
"""A temporary file untouched this long was left by a writer that died (a write takes milliseconds)."""


class CacheError(OSError):
    """The token cache's location cannot be written or read (the message names the path)."""


@dataclass(frozen=True, order=True)
class Segment:
    """One published segment file: positions ``[lo, hi)`` of a unit, its size and checksum.

    Example:
        >>> Segment.parse("0-4096-1024-0000abcd.arrow")
        Segment(lo=0, hi=4096, end=False, nbytes=1024, crc=43981)
    """

    lo: int
    hi: int
    end: bool
    nbytes: int
    crc: int

    @property
    def name(self) -> str:
        """The file name."""
        return f"{self.lo}-{self.hi}{'e' if self.end else ''}-{self.nbytes}-{self.crc:08x}.arrow"

    @staticmethod
    def parse(name: str) -> Segment | None:
        """The segment a file name stands for, or ``None`` for other files (temporary ones)."""
        found = SEGMENT_NAME.match(name)
        if found is None:
            return None
        lo, hi, end, nbytes, crc = found.groups()
        return Segment(int(lo), int(hi), end == "e", int(nbytes), int(crc, 16))


class Store:
    """A cache root on the local disk or an fsspec store; picklable, re-opened in each process.

    Args:
        root: A local path or an fsspec URL (``s3://bucket/cache``, ``memory://cache``).
        storage_options: Keyword arguments for the fsspec filesystem.
    """

    def __init__(self, root: str, storage_options: dict[str, Any] | None = None) -> None:
        self.root = root
        self.storage_options = dict(storage_options or {})
        self._fs: Any = None
        self._base = ""
        self._pid = -1

    def __getstate__(self) -> dict[str, Any]:
        return {"root": self.root, "storage_options": self.storage_options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["root"], state["storage_options"])  # type: ignore[misc]

    @property
    def is_local(self) -> bool:
        """Whether the root is on the local disk (files are memory-mapped and renamed into place)."""
        return isinstance(self._filesystem(), LocalFileSystem)

    def path(self, *parts: str) -> str:
        """The path (in the filesystem's own form) of ``parts`` under the cache format folder."""
        self._filesystem()
        return "/".join([self._base.rstrip("/"), FORMAT, *parts]) if self._base else "/".join([FORMAT, *parts])

    def url(self, *parts: str) -> str:
        """``path`` as the user would write it (local path or URL), for messages."""
        path = self.path(*parts)
        return path if self.is_local else self._filesystem().unstrip_protocol(path)

    def inside(self, folder: str, *, relative: bool = False) -> str:
        """``folder``'s path, checked to be one under the cache root (never ``..``, absolute or linked out).

        Raises :class:`CacheError` naming it otherwise. Returns ``folder`` itself with ``relative``.

        Example:
            >>> Store("/tmp/c").inside("../../etc")
            Traceback (most recent call last):
            ...
            padpipe.token_cache.store.CacheError: token cache: '../../etc' is not a folder of the cache at '/tmp/c/padpipe-cache-v1'; refusing to use it.
        """  # noqa: E501
        parts = folder.split("/")
        bad = not folder or folder.startswith(("/", "\\")) or any(p in ("", ".", "..") or "\\" in p for p in parts)
        path = self.path(folder)
        if not bad and self.is_local:
            root = os.path.realpath(self.path())
            bad = not os.path.realpath(path).startswith(root.rstrip(os.sep) + os.sep)
        if bad:
            raise CacheError(
                f"token cache: {folder!r} is not a folder of the cache at {self.url()!r}; refusing to use it."
            )
        return folder if relative else path

    # -- listing and reading ------------------------------------------------------------------------
    def segments(self, folder: str) -> list[Segment]:
        """The published segments in ``folder`` (empty when it does not exist yet)."""
        fs, path = self._filesystem(), self.inside(folder)
        try:
            if self.is_local:
                names = os.listdir(path)
            else:
                fs.invalidate_cache(path)
                names = [n.rstrip("/").rsplit("/", 1)[-1] for n in fs.ls(path, detail=False)]
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise CacheError(f"token cache: cannot list {self.url(folder)!r} ({type(exc).__name__}: {exc}).") from exc
        return sorted(s for s in map(Segment.parse, names) if s is not None)

    def read(self, folder: str, segment: Segment) -> pa.Table | None:
        """The segment's rows, or ``None`` when the file is gone or fails its size or checksum check."""
        path = self.path(self.inside(folder, relative=True), segment.name)
        try:
            if self.is_local:
                if not stat.S_ISREG(os.lstat(path).st_mode):
                    return None  # a link or other non-file: never followed, treated as a bad file
                data = pa.memory_map(path).read_buffer()
            else:
                data = pa.py_buffer(self._filesystem().cat_file(path))
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise CacheError(f"token cache: cannot read {self.url(folder, segment.name)!r} ({exc}).") from exc
        if data.size != segment.nbytes or zlib.crc32(memoryview(data)) != segment.crc:
            return None
        try:
            return ipc.open_file(data).read_all()
        except (pa.ArrowException, ValueError):
            return None

    # -- writing ------------------------------------------------------------------------------------
    def write(self, folder: str, segment: Segment, data: bytes | pa.Buffer) -> Segment:
        """Publish ``data`` as ``segment``'s file (size and checksum filled in); returns the published segment."""
        data = pa.py_buffer(data) if isinstance(data, bytes) else data
        published = Segment(segment.lo, segment.hi, segment.end, data.size, zlib.crc32(memoryview(data)))
        self.put(folder, published.name, data)
        return published

    def put(self, folder: str, name: str, data: bytes | pa.Buffer) -> None:
        """Write ``folder/name`` whole: a temporary file renamed into place, or one upload."""
        fs, target = self._filesystem(), self.path(self.inside(folder, relative=True), name)
        try:
            if self.is_local:
                os.makedirs(self.path(folder), exist_ok=True)
                temp = self.path(folder, f"{TEMP_PREFIX}{uuid.uuid4().hex}")
                try:
                    with open(temp, "wb") as handle:
                        handle.write(memoryview(data))
                    os.replace(temp, target)
                finally:
                    if os.path.exists(temp):
                        os.remove(temp)
            else:
                fs.pipe_file(target, bytes(memoryview(data)))
        except OSError as exc:
            raise CacheError(
                f"token cache: cannot write to {self.url(folder)!r} ({type(exc).__name__}: {exc})."
            ) from exc

    def remove(self, folder: str, segment: Segment) -> None:
        """Delete a segment file that failed its checks (best effort: another process may have replaced it)."""
        try:
            self._filesystem().rm_file(self.path(self.inside(folder, relative=True), segment.name))
        except OSError:
            pass

    def sweep(self, folder: str, *, older_than: float = STALE_SECONDS) -> int:
        """Delete the temporary files (``.tmp-*``) older than ``older_than`` seconds in ``folder`` and its unit
        folders, which writers killed mid-write left (local stores only); returns how many were deleted."""
        if not self.is_local:
            return 0
        base, removed = self.inside(folder), 0
        now = time.time()
        try:
            units = [entry.path for entry in os.scandir(base) if entry.is_dir(follow_symlinks=False)]
        except OSError:
            return 0
        for path in [base, *units]:
            try:
                entries = [e for e in os.scandir(path) if e.name.startswith(TEMP_PREFIX)]
            except OSError:
                continue
            for entry in entries:
                try:
                    if (
                        entry.is_file(follow_symlinks=False)
                        and now - entry.stat(follow_symlinks=False).st_mtime > older_than
                    ):
                        os.remove(entry.path)
                        removed += 1
                except OSError:  # another process swept it first
                    pass
        return removed

    def describe(self, folder: str, about: dict[str, Any]) -> None:
        """Write ``folder/about.json`` (what a fingerprint stands for) unless it is there: the root is writable."""
        if not self._filesystem().exists(self.path(folder, ABOUT)):
            self.put(folder, ABOUT, json.dumps(about, indent=1, sort_keys=True).encode())

    def _filesystem(self) -> Any:
        if self._fs is None or self._pid != os.getpid():
            self._fs, self._base = fsspec.core.url_to_fs(os.fspath(self.root), **self.storage_options)
            self._pid = os.getpid()
        return self._fs


def ipc_bytes(table: pa.Table | pa.RecordBatch) -> pa.Buffer:
    """``table`` as the bytes of an Arrow IPC file (what a segment file holds).

    Example:
        >>> ipc.open_file(ipc_bytes(pa.table({"a": [1]}))).read_all().num_rows
        1
    """
    sink = pa.BufferOutputStream()
    with ipc.new_file(sink, table.schema) as writer:
        writer.write(table)
    return sink.getvalue()
