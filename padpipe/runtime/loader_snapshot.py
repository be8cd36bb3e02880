"""The shape of a ``StatefulDataLoader`` state inside :class:`~padpipe.runtime.workers.WorkerProcesses`' state.

torchdata checks its own state with ``assert`` and plain indexing, so a state edited by hand would fail there far
from its cause; :class:`LoaderSnapshot` checks the parts torchdata and elastic resume read first, so such a state
is refused as a :class:`~padpipe.state.StateMismatchError` naming the key. :data:`PARTS` and :data:`SHUTDOWN` are
the torchdata private names relied on (tests/integrations/test_contacts.py pins them).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from padpipe.runtime.iterable import EPOCH_KEY, NODE_KEY, STATS_KEY
from padpipe.state import Invalid, Spec
from padpipe.state_walk import key_text, show

EXPECTED = "a StatefulDataLoader state"
# (path, type, what) of each part read: dicts, the step counter, the finished flag
PARTS: tuple[tuple[tuple[str, ...], type, str], ...] = (
    ((), Mapping, "a dict"),
    (("_steps_since_snapshot",), int, "an int >= 0"),
    (("_iterator_finished",), bool, "a bool"),
    (("_snapshot",), Mapping, "a dict"),
    (("_snapshot", "_main_snapshot"), Mapping, "a dict"),
    (("_snapshot", "_worker_snapshots"), Mapping, "a dict"),
    (("_snapshot", "_main_snapshot", "_num_workers"), int, "an int >= 0"),
    (("_snapshot", "_main_snapshot", "_sampler_iter_yielded"), int, "an int >= 0"),
)
# (key, type, what) of each part of a worker's iterator state (a PipelineIterator's)
ITERATOR_PARTS: tuple[tuple[str, type, str], ...] = ((EPOCH_KEY, int, "an int >= 0"), (NODE_KEY, Mapping, "a dict"))
SHUTDOWN = (
    "torchdata.stateful_dataloader.stateful_dataloader",
    "_StatefulMultiProcessingDataLoaderIter",
    "_shutdown_workers",
)
"""(module, class, method): what stops a ``StatefulDataLoader`` iterator's worker processes (torch's, inherited)."""
STATS_NUMBERS = ("rows", "batches", "real_tokens", "padded_tokens", "wall_seconds")
STATS_TABLES = ("skipped", "seconds", "counters")
STATS = f"a dict of {', '.join(STATS_NUMBERS)} (numbers >= 0) and {', '.join(STATS_TABLES)} (names to numbers >= 0)"


def worker_stopper(iterator: Any) -> Callable[[], None]:
    """The method of :data:`SHUTDOWN` on a ``StatefulDataLoader`` iterator with workers; ``RuntimeError`` naming it
    when the installed torchdata has none (the workers would otherwise be left to torch's ``__del__``).

    Example:
        >>> worker_stopper(iter([]))
        Traceback (most recent call last):
        ...
        RuntimeError: padpipe's WorkerProcesses stops its DataLoader workers with torchdata's ...
    """
    module, cls, name = SHUTDOWN
    stop = getattr(iterator, name, None)
    if not callable(stop):
        raise RuntimeError(
            f"padpipe's WorkerProcesses stops its DataLoader workers with torchdata's {module}.{cls}.{name}(), but the "
            f"installed torchdata's iterator ({type(iterator).__name__}) has no such method: install torchdata 0.11 "
            "(pip install 'torchdata==0.11.*') or a padpipe release for yours."
        )
    return stop


def worker_iterators(state: Mapping[str, Any]) -> dict[str, Any]:
    """Each worker's iterator state in a ``StatefulDataLoader`` state (``None`` where it has none), by worker name.

    Example:
        >>> worker_iterators({"_snapshot": {"_worker_snapshots": {"worker_0": {"fetcher_state": None}}}})
        {'worker_0': None}
    """
    workers = state.get("_snapshot", {}).get("_worker_snapshots", {})
    return {name: (worker.get("fetcher_state") or {}).get("dataset_iter_state") for name, worker in workers.items()}


@dataclass(frozen=True)
class LoaderSnapshot(Spec):
    """A ``StatefulDataLoader.state_dict()``: the keys torchdata and elastic resume read, of the right types.

    Example:
        >>> LoaderSnapshot().load({"_snapshot": {}})
        Traceback (most recent call last):
        ...
        padpipe.state_specs.Invalid: a StatefulDataLoader state with '_steps_since_snapshot' an int >= 0
    """

    def load(self, value: Any) -> Any:
        for path, kind, what in PARTS:
            _part(value, path, kind, what)
        for name, worker in value["_snapshot"]["_worker_snapshots"].items():
            where = ("_snapshot", "_worker_snapshots", key_text(name)[:60])
            _part(worker, (), Mapping, "a dict", where)
            fetcher = worker.get("fetcher_state")
            if fetcher is not None:
                _part(fetcher, (), Mapping, "None or a dict", (*where, "fetcher_state"))
                iterator = fetcher.get("dataset_iter_state")
                if iterator is not None:
                    _iterator(iterator, (*where, "fetcher_state", "dataset_iter_state"))
        return value


def _iterator(value: Any, where: tuple[str, ...]) -> None:
    """Raise :class:`Invalid` unless ``value`` is a worker's iterator state: its epoch, graph state and counters."""
    _part(value, (), Mapping, "None or a dict", where)
    for key, kind, what in ITERATOR_PARTS:
        _part(value, (key,), kind, what, where)
    stats = value.get(STATS_KEY)
    if stats is not None and not _is_stats(stats):
        raise Invalid(f"{EXPECTED} with {'/'.join((*where, STATS_KEY))!r} {STATS}", show(stats))


def _is_stats(value: Any) -> bool:
    """Whether ``value`` is a worker's counters as it sends them (``dataclasses.asdict`` of a ``StatsSnapshot``)."""
    if not isinstance(value, Mapping) or set(value) != {*STATS_NUMBERS, *STATS_TABLES}:
        return False
    tables = [value[k] for k in STATS_TABLES]
    if not all(isinstance(t, Mapping) and all(isinstance(k, str) for k in t) for t in tables):
        return False
    return all(_is_count(value[k]) for k in STATS_NUMBERS) and all(_is_count(v) for t in tables for v in t.values())


def _is_count(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < 2**63


def _part(value: Any, path: tuple[str, ...], kind: type, what: str, where: tuple[str, ...] = ()) -> None:
    """Raise :class:`Invalid` unless ``value[path...]`` exists and is a ``kind`` (an int: not a bool, not < 0)."""
    found: Any = value
    for key in path:
        found = found.get(key, _MISSING)
    bad_int = kind is int and (isinstance(found, bool) or (isinstance(found, int) and not 0 <= found < 2**63))
    ok = isinstance(found, kind) and not bad_int
    if not ok:
        full = "/".join((*where, *path))
        shown = "missing" if found is _MISSING else show(found)
        raise Invalid(f"{EXPECTED} with {full!r} {what}" if full else EXPECTED, shown)


_MISSING = object()
