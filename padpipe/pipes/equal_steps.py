"""Equal steps on every rank: agree each step, across ranks, whether the epoch goes on.

Token-budget batches make a different number of batches on each rank, and DDP hangs at the end
of an epoch when one rank stops while the others wait in a collective. :class:`EqualSteps` (and
:func:`equal_steps` for a ``DataLoader``) all-reduce one tiny int tensor per step, so every rank
takes the same number of steps.
"""

from __future__ import annotations

import logging
from typing import Any, Iterable, Iterator

import torch
from torchdata.nodes import BaseNode

from padpipe._state import SOURCE_KEY, check_state, make_state
from padpipe.errors import one_of
from padpipe.stats import PipelineStats

logger = logging.getLogger(__name__)

POLICIES = ("stop_first", "repeat", "off")
REPEAT_KEY = "is_repeat"
DROPPED = "equal_steps.dropped_batches"
REPEATED = "equal_steps.repeated_batches"


class StepSync:
    """One all-reduce per step: does any rank have a fresh batch, has any run out, is any stuck.

    The tensor lives on the backend's device: the current CUDA device for NCCL, else the CPU.
    """

    def __init__(self, group: Any = None) -> None:
        import torch.distributed as dist

        self.group = group
        backend = str(dist.get_backend(group))
        self.device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")

    def agree(self, fresh: bool, stuck: bool) -> tuple[bool, bool, bool]:
        """``(any rank fresh, any rank out, any rank stuck)`` over the group."""
        import torch.distributed as dist

        flags = torch.tensor([fresh, not fresh, stuck], dtype=torch.int32, device=self.device)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=self.group)
        any_fresh, any_out, any_stuck = flags.tolist()
        return bool(any_fresh), bool(any_out), bool(any_stuck)


def detect_sync(group: Any = None) -> StepSync | None:
    """A :class:`StepSync` when ``torch.distributed`` runs with more than one rank in this (main) process."""
    import torch.distributed as dist
    from torch.utils.data import get_worker_info

    if not (dist.is_available() and dist.is_initialized()) or get_worker_info() is not None:
        return None  # a DataLoader worker never joins the trainer's collectives
    return StepSync(group) if dist.get_world_size(group) > 1 else None


def should_stop(policy: str, any_fresh: bool, any_out: bool, any_stuck: bool) -> bool:
    """``stop_first``: stop once any rank is out; ``repeat``: once all are, or one has nothing to repeat."""
    if policy == "stop_first":
        return any_out
    return not any_fresh or any_stuck


def _mark(item: Any, repeat: bool) -> Any:
    return {**item, REPEAT_KEY: torch.tensor(repeat)} if isinstance(item, dict) else item


class _DropLog:
    def __init__(self, stats: PipelineStats) -> None:
        self.stats, self.logged = stats, False

    def dropped(self, count: int, step: int) -> None:
        self.stats.record_skip(DROPPED, count)
        if count and not self.logged:
            self.logged = True
            logger.warning(
                "equal_steps: this rank dropped its last %d batch(es) so that every rank stops at step %d "
                "(counted in stats as %r; logged once).", count, step, DROPPED,
            )


class EqualSteps(BaseNode[Any]):
    """Make every distributed rank take the same number of steps per epoch.

    Each ``next()`` all-reduces whether this rank still has a batch. ``"stop_first"`` ends the
    epoch on every rank at the step where the first rank runs out; the batches the other ranks
    had left are read, dropped and counted as ``equal_steps.dropped_batches`` (logged once).
    ``"repeat"`` lets ranks that ran out re-yield their epoch's batches from the start (re-read
    from the epoch's start state) until the last rank finishes; every dict batch then carries
    ``"is_repeat"`` (a bool tensor; pop it before ``model(**batch)``, and zero the loss of
    repeats to keep each sample's weight). A rank with no batch at all in the epoch cannot
    repeat, so then every rank stops as with ``"stop_first"``. ``"off"`` and runs without
    ``torch.distributed`` (or with one rank, or inside a DataLoader worker) pass batches through.

    The state holds the upstream state and the flags, so resume is exact on every rank when all
    ranks save at the same step.

    Args:
        source: The pipeline's last node.
        policy: ``"stop_first"``, ``"repeat"`` or ``"off"``.
        stats: Counters to report into.
        group: The process group to agree in (default: the whole world).

    Example:
        >>> from torchdata.nodes import IterableWrapper
        >>> list(EqualSteps(IterableWrapper([{"x": 1}]), policy="repeat"))  # one process
        [{'x': 1, 'is_repeat': tensor(False)}]
    """

    VERSION = 1
    STOPPED_KEY = "stopped"
    FRESH_KEY = "fresh"
    STEPS_KEY = "steps"
    REPLAYING_KEY = "replaying"
    START_KEY = "start"

    def __init__(self, source: BaseNode, *, policy: str = "stop_first", stats: PipelineStats | None = None,
                 group: Any = None) -> None:
        super().__init__()
        one_of("policy", policy, POLICIES)
        self.source, self.policy, self.group = source, policy, group
        self.stats = stats or PipelineStats()
        self._log = _DropLog(self.stats)
        self._sync: StepSync | None = None
        self._detected = False

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        super().reset(initial_state)
        if not self._detected:
            self._sync = detect_sync(self.group) if self.policy != "off" else None
            self._detected = True
        if initial_state is None:
            self.source.reset(None)
            self._stopped, self._fresh, self._steps, self._replaying = False, 0, 0, False
            self._start = self.source.state_dict() if self.policy == "repeat" and self._sync else None
            return
        check_state("EqualSteps", initial_state, version=self.VERSION, settings={"policy": self.policy})
        self.source.reset(initial_state[SOURCE_KEY])
        self._stopped, self._fresh = initial_state[self.STOPPED_KEY], initial_state[self.FRESH_KEY]
        self._steps, self._replaying = initial_state[self.STEPS_KEY], initial_state[self.REPLAYING_KEY]
        self._start = initial_state[self.START_KEY]

    def next(self) -> Any:
        if self._stopped:
            raise StopIteration
        if self._sync is None:
            item = next(self.source)
            return _mark(item, False) if self.policy == "repeat" else item
        item = None
        if not self._replaying:
            try:
                item = next(self.source)
            except StopIteration:
                pass
        fresh = item is not None
        any_fresh, any_out, any_stuck = self._sync.agree(fresh, not fresh and self._fresh == 0)
        if should_stop(self.policy, any_fresh, any_out, any_stuck):
            self._stopped = True
            if fresh:
                self._log.dropped(1 + sum(1 for _ in self.source), self._steps)
            raise StopIteration
        self._steps += 1
        if fresh:
            self._fresh += 1
            return _mark(item, False) if self.policy == "repeat" else item
        return _mark(self._replay(), True)

    def get_state(self) -> dict[str, Any]:
        return make_state(
            version=self.VERSION,
            settings={"policy": self.policy},
            **{
                SOURCE_KEY: self.source.state_dict(),
                self.STOPPED_KEY: self._stopped,
                self.FRESH_KEY: self._fresh,
                self.STEPS_KEY: self._steps,
                self.REPLAYING_KEY: self._replaying,
                self.START_KEY: self._start,
            },
        )

    def _replay(self) -> Any:
        """The next batch of this epoch again, from its start state (wrapping around)."""
        if not self._replaying:
            self.source.reset(self._start)
            self._replaying = True
        try:
            item = next(self.source)
        except StopIteration:
            self.source.reset(self._start)
            item = next(self.source)
        self.stats.add(REPEATED, 1)
        return item


def equal_steps(iterable: Iterable[Any], policy: str = "stop_first", *, stats: PipelineStats | None = None,
                group: Any = None) -> Iterator[Any]:
    """One epoch of ``iterable`` with the same number of steps on every rank (all-reduce in this process).

    For ``DataLoader(pipe, batch_size=None, num_workers=N)``, whose workers cannot join the
    trainer's collectives. Policies as in :class:`EqualSteps`; with ``"repeat"`` a rank that ran
    out iterates ``iterable`` again (a ``DataLoader`` over a pipeline without persistent workers
    reads the same epoch again, as set with ``pipe.set_epoch``). Dropped batches are drained from
    the iterator, counted in ``stats`` and logged once. Without ``torch.distributed`` it yields
    ``iterable`` unchanged (dict batches marked ``"is_repeat"`` under ``"repeat"``).

    Args:
        iterable: One epoch of batches, e.g. a ``DataLoader``.
        policy: ``"stop_first"``, ``"repeat"`` or ``"off"``.
        stats: Where to count dropped and repeated batches (default: a private counter).
        group: The process group to agree in (default: the whole world).

    Example:
        >>> for batch in pp.equal_steps(DataLoader(pipe, batch_size=None, num_workers=4)):  # doctest: +SKIP
        ...     loss = model(**batch).loss
    """
    one_of("policy", policy, POLICIES)
    return _equal_steps(iterable, policy, stats or PipelineStats(), group)


def _equal_steps(iterable: Iterable[Any], policy: str, stats: PipelineStats, group: Any) -> Iterator[Any]:
    sync = detect_sync(group) if policy != "off" else None
    if sync is None:
        yield from (_mark(b, False) for b in iterable) if policy == "repeat" else iterable
        return
    log, it, fresh_count, steps, replay = _DropLog(stats), iter(iterable), 0, 0, None
    while True:
        item = next(it, None) if replay is None else None
        fresh = item is not None
        any_fresh, any_out, any_stuck = sync.agree(fresh, not fresh and fresh_count == 0)
        if should_stop(policy, any_fresh, any_out, any_stuck):
            if fresh:
                log.dropped(1 + sum(1 for _ in it), steps)
            return
        steps += 1
        if fresh:
            fresh_count += 1
            yield _mark(item, False) if policy == "repeat" else item
            continue
        item = next(replay, None) if replay is not None else None
        if item is None:  # start (or wrap) the repeat pass
            replay = iter(iterable)
            item = next(replay, None)
            if item is None:
                raise RuntimeError("equal_steps(policy='repeat'): iterating `iterable` again yielded nothing to repeat.")
        stats.add(REPEATED, 1)
        yield _mark(item, True)
