"""One listing per pipeline, shared by every loader built from it and by all its DataLoader workers.

Listing is the costly start of a read from object storage: globbing a bucket of 10k files, then
reading 10k Parquet footers. A reader lists on its first ``reset`` (never in ``__init__``), and
the readers built from one pipeline share a :class:`SharedListing`, made without I/O by
``pp.read_parquet`` & co. and kept in the pipeline's source stage. It

* keeps the listing in memory, so later loaders of the pipeline in this process (each epoch's
  ``iter(pipe)``, a second ``loader()``) reuse it;
* travels with the pipeline: filled before ``DataLoader`` starts its workers (say by a first
  ``loader()`` in the main process), workers get it with the pipeline (copied by ``fork``,
  pickled by ``spawn``) and list nothing;
* otherwise lets the worker processes agree through a file in a private temp folder
  (``$TMPDIR/padpipe-<uid>/``, mode 0700): the first worker lists under a file lock and writes
  the result; the others wait for the lock and read it, and so does the main process when it
  needs the listing later. N workers list once, not N times.

The scope is the pipeline object, not the process: a new ``pp.read_parquet(...)`` call lists
again, so files added to a bucket are seen by the next pipeline built. Ranks build their own
pipelines, so each rank lists once (its workers sharing that listing). The files are removed
when the pipeline's owner process drops it or exits; without ``fcntl`` (Windows) each worker
lists for itself.
"""

from __future__ import annotations

import glob
import hashlib
import os
import pickle
import tempfile
import threading
import uuid
import weakref
from typing import Any, Callable, TypeVar

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

T = TypeVar("T")


class SharedListing:
    """A fill-once store of listings, keyed by what was listed (reader, paths, storage options).

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
        weakref.finalize(self, _remove_files, self._token, self._owner)

    def get(self, key: str, make: Callable[[], T]) -> T:
        """The listing stored under ``key``; made by ``make()`` once per pipeline (see module docs)."""
        with self._lock:
            if key not in self._values:
                if os.getpid() == self._owner:  # read what workers listed, else list; write nothing
                    self._values[key] = _load(self._path(key), default=make)
                elif fcntl is not None:
                    self._values[key] = self._from_siblings(key, make)
                else:  # pragma: no cover - Windows
                    self._values[key] = make()
            return self._values[key]

    def __repr__(self) -> str:
        return f"SharedListing({len(self._values)} listed)"

    def __getstate__(self) -> dict[str, Any]:
        return {"token": self._token, "owner": self._owner, "values": dict(self._values)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._token, self._owner, self._values = state["token"], state["owner"], dict(state["values"])
        self._lock = threading.Lock()

    def _path(self, key: str) -> str:
        return os.path.join(_folder(), f"listing-{self._token}-{hashlib.sha256(key.encode()).hexdigest()[:24]}")

    def _from_siblings(self, key: str, make: Callable[[], T]) -> T:
        """The listing another process of this pipeline wrote, else made here (under a file lock) and written."""
        path = self._path(key)
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        with open(path + ".lock", "a+b") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the lock file is closed
            value = _load(path, default=None)
            if value is None:
                value = make()
                fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".listing-")
                with os.fdopen(fd, "wb") as f:
                    pickle.dump(value, f, protocol=pickle.HIGHEST_PROTOCOL)
                os.replace(tmp, path + ".pkl")  # whole or absent, never half-written
            return value


def _load(path: str, *, default: Callable[[], T] | None) -> T:
    """The listing pickled at ``path``, else ``default()`` (``None`` when no default)."""
    try:
        with open(path + ".pkl", "rb") as f:
            return pickle.load(f)
    except (OSError, EOFError, pickle.UnpicklingError):
        return default() if default is not None else None  # type: ignore[return-value]


def _folder() -> str:
    uid = os.getuid() if hasattr(os, "getuid") else "user"
    return os.path.join(tempfile.gettempdir(), f"padpipe-{uid}")


def _remove_files(token: str, owner: int) -> None:
    """Delete the workers' listing files of one pipeline (only in the process that made it)."""
    if os.getpid() != owner:
        return
    for path in glob.glob(os.path.join(_folder(), f"listing-{token}-*")):
        try:
            os.remove(path)
        except OSError:
            pass
