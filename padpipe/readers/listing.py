"""One listing per pipeline, shared by every loader built from it and by all its DataLoader workers.

Listing (globbing 10k files, reading their footers) is the costly start of a read from object storage, so the
readers of one pipeline share a :class:`SharedListing`: kept in memory, carried into workers by ``fork`` or
pickling, and otherwise agreed on through a JSON file in a folder private to the pipeline, listed by the first
worker under a file lock (docs/state.md, "Sharing the file listing"). Without ``fcntl`` (Windows), or when the
folder is not private, each worker lists for itself.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import tempfile
import threading
import uuid
import warnings
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

T = TypeVar("T")
PREFIX = "padpipe-"
_swept = False  # whether this process removed the folders of dead owners yet


class SharedListing:
    """A fill-once store of listings, keyed by what was listed (reader, paths, storage options).

    ``get`` takes the functions that turn a listing into JSON-able data and back, used only when
    worker processes share it through the private folder (see module docs).

    Example:
        >>> shared = SharedListing()
        >>> shared.get("read_parquet ['data/*.parquet']", lambda: ["a.parquet", "b.parquet"])
        ['a.parquet', 'b.parquet']
        >>> shared.get("read_parquet ['data/*.parquet']", lambda: 1 / 0)  # listed already
        ['a.parquet', 'b.parquet']
    """

    def __init__(self) -> None:
        self._token = uuid.uuid4().hex
        self._owner = os.getpid()
        self._values: dict[str, Any] = {}
        self._lock = threading.Lock()
        weakref.finalize(self, _remove_folder, self.folder, self._owner)

    @property
    def folder(self) -> str:
        """The private folder worker processes share listings through (made when first needed)."""
        uid = os.getuid() if hasattr(os, "getuid") else "user"
        return os.path.join(tempfile.gettempdir(), f"{PREFIX}{uid}-{self._owner}-{self._token}")

    def get(
        self,
        key: str,
        make: Callable[[], T],
        *,
        encode: Callable[[T], Any] = lambda value: value,
        decode: Callable[[Any], T] = lambda data: data,
    ) -> T:
        """The listing stored under ``key``; made by ``make()`` once per pipeline (see module docs).

        Args:
            key: What was listed.
            make: Lists (the I/O).
            encode: The listing as JSON-able data, for the other processes of this pipeline.
            decode: The inverse of ``encode``; raises ``ValueError``/``KeyError``/``TypeError`` on bad data.
        """
        with self._lock:
            if key not in self._values:
                self._values[key] = self._fetch(key, make, encode, decode)
            return self._values[key]

    def __repr__(self) -> str:
        return f"SharedListing({len(self._values)} listed)"

    def __getstate__(self) -> dict[str, Any]:
        return {"token": self._token, "owner": self._owner, "values": dict(self._values)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._token, self._owner, self._values = state["token"], state["owner"], dict(state["values"])
        self._lock = threading.Lock()

    # -- sharing between the processes of one pipeline ------------------------------------------
    def _fetch(self, key: str, make: Callable[[], T], encode: Callable[[T], Any], decode: Callable[[Any], T]) -> T:
        if fcntl is None:  # pragma: no cover - Windows
            return make()
        owner = os.getpid() == self._owner
        folder = _private_folder(self.folder, create=not owner)
        if folder is None:
            return make()
        path = os.path.join(folder, f"listing-{_name(key)}.json")
        if owner:  # read what the workers listed, else list; write nothing
            found = _read(path, decode)
            return make() if found is None else found
        with open(path + ".lock", "a+b") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the lock file is closed
            found = _read(path, decode)
            if found is not None:
                return found
            value = make()
            fd, tmp = tempfile.mkstemp(dir=folder, prefix=".listing-", suffix=".json")
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump({"key": key, "listing": encode(value)}, f)
            os.replace(tmp, path)  # whole or absent, never half-written
            return value


def _name(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:24]


def _read(path: str, decode: Callable[[Any], T]) -> T | None:
    """The listing in the JSON file ``path``, or ``None`` when there is none (or it is unreadable)."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    try:
        return decode(data["listing"])
    except (ValueError, KeyError, TypeError, IndexError):
        return None


def _private_folder(folder: str, *, create: bool) -> str | None:
    """``folder`` when it is (made now, if ``create``) a real folder of this user that no one else may use."""
    if create:
        _sweep(os.path.dirname(folder))
        try:
            os.mkdir(folder, 0o700)
        except FileExistsError:
            pass
        except OSError:
            return None
    try:
        info = os.lstat(folder)
    except OSError:
        return None
    problem = None
    if not stat.S_ISDIR(info.st_mode):
        problem = "it is not a folder"
    elif hasattr(os, "getuid") and info.st_uid != os.getuid():
        problem = f"it belongs to uid {info.st_uid}"
    elif info.st_mode & 0o077:
        problem = f"others have access (mode {stat.S_IMODE(info.st_mode):o})"
    if problem:
        warnings.warn(
            f"padpipe: not sharing file listings through {folder}: {problem}; each worker lists its files itself.",
            RuntimeWarning,
            stacklevel=4,
        )
        return None
    return folder


def _sweep(parent: str) -> None:
    """Remove the listing folders of this user's padpipe processes that are gone (once per process)."""
    global _swept
    if _swept or not hasattr(os, "getuid"):
        return
    _swept = True
    mine = f"{PREFIX}{os.getuid()}-"
    try:
        names = [n for n in os.listdir(parent) if n.startswith(mine)]
    except OSError:
        return
    for name in names:
        pid = name[len(mine) :].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            _remove_folder(os.path.join(parent, name), None)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, another user's
        return True
    return True


def _remove_folder(folder: str, owner: int | None) -> None:
    """Delete a listing folder (only in the process that owns it, unless ``owner`` is ``None``) if it is ours."""
    if owner is not None and os.getpid() != owner:
        return
    try:
        info = os.lstat(folder)
    except OSError:
        return
    if stat.S_ISDIR(info.st_mode) and (not hasattr(os, "getuid") or info.st_uid == os.getuid()):
        shutil.rmtree(folder, ignore_errors=True)
