"""Equal steps on every rank: agree each step, across ranks, how the epoch goes on (docs/distributed.md).

Token-budget and packed batches make a different number of batches on each rank, and DDP hangs at the end of an
epoch when one rank stops while the others wait in a collective. :class:`EqualSteps` (and :func:`equal_steps` for
a ``DataLoader``) gather a few ints from every rank each step, so every rank takes the same number of steps.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch
from torchdata.nodes import BaseNode

from padpipe.errors import one_of
from padpipe.graph import Parts
from padpipe.runtime.lockstep import POLICIES, Lockstep, _mark
from padpipe.runtime.step_sync import StepSync, detect_sync
from padpipe.state import Child, StateSchema
from padpipe.stats import PipelineStats


class EqualSteps(BaseNode[Any]):
    """Make every distributed rank take the same number of steps per epoch.

    Each ``next()`` follows :class:`~padpipe.runtime.lockstep.Lockstep` under ``policy``:

    - ``"balance"`` (the default): every row once; batches are moved and split between ranks, and a rank left
      with no real piece gets a *filler* marked ``"is_filler"`` (``loss * padpipe.loss_weight(batch)``).
    - ``"repeat"``: ranks that ran out replay their first ``REPEAT_BUFFER`` batches, marked ``"is_repeat"``.
    - ``"drop"``: every rank stops when the first runs out; the rest is read, dropped and counted.

    ``"off"`` and runs without ``torch.distributed`` (or with one rank, or inside a DataLoader worker) pass
    batches through. Resume is exact when all ranks save at the same step (docs/distributed.md, "Equal steps").

    Args:
        source: The pipeline's last node.
        policy: ``"balance"``, ``"repeat"``, ``"drop"`` or ``"off"``.
        stats: Counters to report into.
        group: The process group to agree in (default: the whole world).
        device: Where the batches come from upstream (a ``to_cuda`` stage's device), so batches
            restored from a state or received from another rank go there too; ``None``: the CPU.

    Example:
        >>> from torchdata.nodes import IterableWrapper
        >>> list(EqualSteps(IterableWrapper([{"x": 1}]), policy="repeat"))  # one process
        [{'x': 1, 'is_repeat': tensor(False)}]
    """

    STATE = StateSchema("EqualSteps", 5, source=Child(), lockstep=Child())  # lockstep: Lockstep.STATE

    def __init__(
        self,
        source: BaseNode,
        *,
        policy: str = "balance",
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
    def around(cls, source: dict[str, Any], settings: Mapping[str, Any]) -> dict[str, Any]:
        """The state of an epoch that goes on from ``source`` (its upstream state) with nothing held or counted."""
        policy = settings["policy"]
        return cls.STATE.make(
            {"policy": policy}, source=source, lockstep=Lockstep(policy, None, PipelineStats()).state()
        )

    @classmethod
    def split(cls, state: dict[str, Any], settings: Mapping[str, Any]) -> Parts:
        """A saved state's upstream state, the batches it held to return (not those kept only to replay: they came
        out already), and whether the epoch had ended on every rank (checked first)."""
        loaded = cls.STATE.check(state, {"policy": settings["policy"]})
        step = Lockstep.STATE.check(loaded.lockstep, {"policy": settings["policy"]})
        return Parts(loaded.source, list(step.held), step.stopped)

    @property
    def in_lockstep(self) -> bool:
        """Whether steps are agreed with other ranks (``torch.distributed`` with more than one rank)."""
        return self._sync is not None

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        super().reset(initial_state)
        if not self._detected:
            self._sync = detect_sync(self.group) if self.policy != "off" else None
            self._detected = True
        self._step = Lockstep(self.policy, self._sync, self.stats, device=self.device)
        if initial_state is None:
            self.source.reset(None)
            return
        loaded = self.STATE.check(initial_state, {"policy": self.policy})
        self.source.reset(loaded.source)
        self._step.restore(loaded.lockstep)

    def next(self) -> Any:
        if self._sync is None:  # batches read ahead on another layout (an elastic resume) come first
            item = self._step.held.pop(0) if self._step.held else next(self.source)
            return _mark(item, False) if self.policy == "repeat" else item
        return self._step.step(lambda: next(self.source, None), lambda: iter(self.source))

    def get_state(self) -> dict[str, Any]:
        return self.STATE.make({"policy": self.policy}, source=self.source.state_dict(), lockstep=self._step.state())


def equal_steps(
    iterable: Iterable[Any], policy: str = "balance", *, stats: PipelineStats | None = None, group: Any = None
) -> Iterator[Any]:
    """One epoch of ``iterable`` with the same number of steps on every rank (agreed in this process).

    For ``DataLoader(pipe, batch_size=None, num_workers=N)``, whose workers cannot join the
    trainer's collectives (``pipe.loader(num_workers=N)`` has this built in). Policies as in
    :class:`EqualSteps`; the DataLoader is iterated once (``"repeat"`` replays from memory).

    Args:
        iterable: One epoch of batches, e.g. a ``DataLoader``.
        policy: ``"balance"``, ``"repeat"``, ``"drop"`` or ``"off"``.
        stats: Where to count moved, split, filler, repeated and dropped batches (default: a private counter).
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
    it, lockstep = iter(iterable), Lockstep(policy, sync, stats)
    while True:
        try:
            yield lockstep.step(lambda: next(it, None), lambda: it)
        except StopIteration:
            return
