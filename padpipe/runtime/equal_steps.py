"""Equal steps on every rank: agree each step, across ranks, how the epoch goes on.

Token-budget batches make a different number of batches on each rank, and DDP hangs at the end
of an epoch when one rank stops while the others wait in a collective. :class:`EqualSteps` (and
:func:`equal_steps` for a ``DataLoader``) all-reduce one tiny int tensor per step, so every rank
takes the same number of steps. With ``"stop_first"`` (the default) a rank about to run out while
others still have batches splits its last batch in two, as often as needed, so ranks end together
and (nearly) nothing is held back; ``"repeat"`` replays batches marked ``"is_repeat"`` instead.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torchdata.nodes import BaseNode

from padpipe.errors import one_of
from padpipe.pipes.batch_tensors import to_cpu, to_device
from padpipe.runtime.lockstep import StepSync, _Lockstep, _mark, detect_sync
from padpipe.state import Bool, Child, Int, ListOf, Optional, Plain, StateSchema
from padpipe.stats import PipelineStats

POLICIES = ("stop_first", "repeat", "off")
REPEAT_BUFFER = 8  # batches :func:`equal_steps` keeps per epoch to repeat on a rank that ran out


class EqualSteps(BaseNode[Any]):
    """Make every distributed rank take the same number of steps per epoch.

    Each ``next()`` all-reduces how many batches this rank holds read ahead. ``"stop_first"``
    ends the epoch on every rank at the same step: a rank down to its last batch while another
    still holds two splits that batch in two (rows ``[:B//2]`` and the rest, see
    :func:`split_batch`) and yields the first half, as often as needed, so ranks end together and
    nothing is held back unless a rank runs out of rows to split; what is left then is read, dropped and counted as
    ``equal_steps.dropped_batches`` / ``equal_steps.dropped_rows`` (logged once), splits as
    ``equal_steps.split_batches``. ``"repeat"`` lets ranks that ran out re-yield their epoch's
    batches from the start (re-read from the epoch's start state) until the last rank finishes;
    every dict batch then carries ``"is_repeat"`` (a bool tensor; pop it before
    ``model(**batch)``, and zero the loss of repeats to keep each sample's weight). A rank with
    no batch at all in the epoch cannot repeat, so then every rank stops as with
    ``"stop_first"``. ``"off"`` and runs without ``torch.distributed`` (or with one rank, or
    inside a DataLoader worker) pass batches through.

    The state holds the upstream state, the batches read ahead and the counts, so resume is
    exact on every rank when all ranks save at the same step. Batches read ahead are saved on
    the CPU (a checkpoint never holds GPU tensors) and go back to ``device`` on resume.

    Args:
        source: The pipeline's last node.
        policy: ``"stop_first"``, ``"repeat"`` or ``"off"``.
        stats: Counters to report into.
        group: The process group to agree in (default: the whole world).
        device: Where the batches come from upstream (a ``to_cuda`` stage's device), so batches
            restored from a state go there too; ``None``: the CPU.

    Example:
        >>> from torchdata.nodes import IterableWrapper
        >>> list(EqualSteps(IterableWrapper([{"x": 1}]), policy="repeat"))  # one process
        [{'x': 1, 'is_repeat': tensor(False)}]
    """

    STATE = StateSchema(
        "EqualSteps",
        3,
        source=Child(),
        held=ListOf(Plain()),  # batches read ahead, not returned yet
        exhausted=Bool(),
        stopped=Bool(),
        fresh=Int(0),
        steps=Int(0),
        replaying=Bool(),
        start=Optional(Child()),  # the epoch's start state ("repeat" replays from it)
        tail=Bool(),
    )

    def __init__(
        self,
        source: BaseNode,
        *,
        policy: str = "stop_first",
        stats: PipelineStats | None = None,
        group: Any = None,
        device: torch.device | None = None,
    ) -> None:
        super().__init__()
        one_of("policy", policy, POLICIES)
        self.source, self.policy, self.group, self.device = source, policy, group, device
        self.stats = stats or PipelineStats()
        self._sync: StepSync | None = None
        self._detected = False

    @classmethod
    def fresh_state(cls, policy: str, source: dict[str, Any]) -> dict[str, Any]:
        """The state of an epoch that goes on from ``source`` (its upstream state) with nothing held or counted."""
        return cls.STATE.make(
            {"policy": policy},
            source=source,
            held=[],
            exhausted=False,
            stopped=False,
            fresh=0,
            steps=0,
            replaying=False,
            tail=False,
            start=source if policy == "repeat" else None,
        )

    @classmethod
    def parts(cls, state: dict[str, Any]) -> tuple[dict[str, Any], list[Any], bool]:
        """A saved state's upstream state, the batches it held read ahead, and whether its epoch had ended."""
        return state["source"], list(state["held"]), bool(state["stopped"] or state["replaying"])

    @property
    def in_lockstep(self) -> bool:
        """Whether steps are agreed with other ranks (``torch.distributed`` with more than one rank)."""
        return self._sync is not None

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        super().reset(initial_state)
        if not self._detected:
            self._sync = detect_sync(self.group) if self.policy != "off" else None
            self._detected = True
        self._step = _Lockstep(self.policy, self._sync, self.stats)
        if initial_state is None:
            self.source.reset(None)
            self._replaying = False
            self._start = self.source.state_dict() if self.policy == "repeat" and self._sync else None
            return
        loaded = self.STATE.check(initial_state, {"policy": self.policy})
        self.source.reset(loaded.source)
        step = self._step
        step.held = [to_device(b, self.device) for b in loaded.held]
        step.exhausted, step.stopped, step.fresh, step.steps = (
            loaded.exhausted,
            loaded.stopped,
            loaded.fresh,
            loaded.steps,
        )
        step.tail, self._replaying, self._start = loaded.tail, loaded.replaying, loaded.start

    def next(self) -> Any:
        if self._sync is None:  # batches read ahead on another layout (an elastic resume) come first
            item = self._step.held.pop(0) if self._step.held else next(self.source)
            return _mark(item, False) if self.policy == "repeat" else item
        return self._step.step(self._pull, self._replay, lambda: iter(self.source))

    def get_state(self) -> dict[str, Any]:
        step = self._step
        return self.STATE.make(
            {"policy": self.policy},
            source=self.source.state_dict(),
            held=[to_cpu(b) for b in step.held],
            exhausted=step.exhausted,
            stopped=step.stopped,
            fresh=step.fresh,
            steps=step.steps,
            replaying=self._replaying,
            start=self._start,
            tail=step.tail,
        )

    def _pull(self) -> Any:
        return next(self.source, None)

    def _replay(self) -> Any:
        """The next batch of this epoch again, from its start state (wrapping around)."""
        if not self._replaying:
            self.source.reset(self._start)
            self._replaying = True
        try:
            return next(self.source)
        except StopIteration:
            self.source.reset(self._start)
            return next(self.source)


def equal_steps(
    iterable: Iterable[Any], policy: str = "stop_first", *, stats: PipelineStats | None = None, group: Any = None
) -> Iterator[Any]:
    """One epoch of ``iterable`` with the same number of steps on every rank (all-reduce in this process).

    For ``DataLoader(pipe, batch_size=None, num_workers=N)``, whose workers cannot join the
    trainer's collectives (``pipe.loader(num_workers=N)`` has this built in). Policies as in
    :class:`EqualSteps`, except that under ``"repeat"`` a rank that ran out repeats, in turn,
    the first ``REPEAT_BUFFER`` (8) batches of its epoch, kept in memory: the DataLoader is not
    iterated again, so persistent and non-persistent workers alike read every row once per epoch.
    Dropped batches are drained from the iterator, counted in ``stats`` and logged once. Without
    ``torch.distributed`` it yields ``iterable`` unchanged (dict batches marked ``"is_repeat"``
    under ``"repeat"``).

    Args:
        iterable: One epoch of batches, e.g. a ``DataLoader``.
        policy: ``"stop_first"``, ``"repeat"`` or ``"off"``.
        stats: Where to count dropped, split and repeated batches (default: a private counter).
        group: The process group to agree in (default: the whole world).

    Example:
        >>> for batch in pp.equal_steps(DataLoader(pipe, batch_size=None, num_workers=4)):  # doctest: +SKIP
        ...     loss = model(**batch).loss
    """
    one_of("policy", policy, POLICIES)
    return _equal_steps(iterable, policy, stats or PipelineStats(), group)


def _equal_steps(iterable: Iterable[Any], policy: str, stats: PipelineStats, group: Any) -> Iterator[Any]:
    if callable(note := getattr(getattr(iterable, "dataset", None), "note_equal_steps", None)):
        note()  # a DataLoader over a Pipeline: its workers then don't warn of uneven steps
    sync = detect_sync(group) if policy != "off" else None
    if sync is None:
        yield from (_mark(b, False) for b in iterable) if policy == "repeat" else iterable
        return
    it, lockstep = iter(iterable), _Lockstep(policy, sync, stats)
    first: list[Any] = []

    def pull() -> Any:
        item = next(it, None)
        if item is not None and policy == "repeat" and len(first) < REPEAT_BUFFER:
            first.append(item)
        return item

    def replay() -> Any:
        return first[(lockstep.steps - lockstep.fresh - 1) % len(first)]

    while True:
        try:
            yield lockstep.step(pull, replay, lambda: it)
        except StopIteration:
            return
