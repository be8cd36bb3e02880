"""The shape of a ``StatefulDataLoader`` state inside :class:`~padpipe.runtime.workers.WorkerProcesses`' state.

torchdata checks its own state with ``assert`` and plain indexing, so a state edited by hand (its
checksum recomputed) would fail there with an ``AssertionError`` or ``TypeError`` far from its cause.
:class:`LoaderSnapshot` checks the parts that torchdata 0.11 and elastic resume read first, so such
a state is refused as a :class:`~padpipe.state.StateMismatchError` naming the key.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from padpipe.state import Invalid, Spec

EXPECTED = "a StatefulDataLoader state"
# (path, type, what) of each part read: dicts, the step counter, the finished flag
PARTS: tuple[tuple[tuple[str, ...], type, str], ...] = (
    ((), Mapping, "a dict"),
    (("_steps_since_snapshot",), int, "an int >= 0"),
    (("_iterator_finished",), bool, "a bool"),
    (("_snapshot",), Mapping, "a dict"),
    (("_snapshot", "_main_snapshot"), Mapping, "a dict"),
    (("_snapshot", "_worker_snapshots"), Mapping, "a dict"),
)


@dataclass(frozen=True)
class LoaderSnapshot(Spec):
    """A ``StatefulDataLoader.state_dict()``: the keys torchdata and elastic resume read, of the right types.

    Example:
        >>> LoaderSnapshot().load({"_snapshot": {}})
        Traceback (most recent call last):
        ...
        padpipe.state.Invalid: a StatefulDataLoader state with '_steps_since_snapshot' an int >= 0
    """

    def load(self, value: Any) -> Any:
        for path, kind, what in PARTS:
            _part(value, path, kind, what)
        for name, worker in value["_snapshot"]["_worker_snapshots"].items():
            where = ("_snapshot", "_worker_snapshots", str(name))
            _part(worker, (), Mapping, "a dict", where)
            fetcher = worker.get("fetcher_state")
            if fetcher is not None:
                _part(fetcher, (), Mapping, "None or a dict", (*where, "fetcher_state"))
                iterator = fetcher.get("dataset_iter_state")
                if iterator is not None:
                    _part(iterator, (), Mapping, "None or a dict", (*where, "fetcher_state", "dataset_iter_state"))
        return value


def _part(value: Any, path: tuple[str, ...], kind: type, what: str, where: tuple[str, ...] = ()) -> None:
    """Raise :class:`Invalid` unless ``value[path...]`` exists and is a ``kind`` (an int: not a bool, not < 0)."""
    found: Any = value
    for key in path:
        found = found.get(key, _MISSING)
    bad_int = kind is int and (isinstance(found, bool) or (isinstance(found, int) and found < 0))
    ok = isinstance(found, kind) and not bad_int
    if not ok:
        full = "/".join((*where, *path))
        shown = "missing" if found is _MISSING else f"{found!r:.60}"
        raise Invalid(f"{EXPECTED} with {full!r} {what}" if full else EXPECTED, shown)


_MISSING = object()
