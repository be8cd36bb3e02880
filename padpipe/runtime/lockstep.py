"""Equal steps' protocol: what every rank does each step, under each policy, from what the group gathers.

It talks to the other ranks only through a :class:`~padpipe.runtime.step_sync.StepSync` and plans with
:mod:`padpipe.runtime.rebalance`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import torch

from padpipe.pipes.batch_tensors import to_cpu, to_device
from padpipe.runtime.batch_cut import rows_of
from padpipe.runtime.held import SPEC, Held
from padpipe.runtime.rebalance import FILLER_KEY, Move, documents, donations, filler, split, splittable_rows, tail_plan
from padpipe.state import Bool, Int, StateSchema
from padpipe.stats import PipelineStats

logger = logging.getLogger("padpipe.runtime.equal_steps")

POLICIES = ("balance", "repeat", "drop", "off")
REPEAT_KEY = "is_repeat"
REPEAT_BUFFER = 8  # batches a rank keeps per epoch to replay under "repeat"
TAIL_DEPTH = 16  # batches each rank reads ahead under "balance" once a rank has read its share (held in memory)
DROPPED = "equal_steps.dropped_batches"
DROPPED_ROWS = "equal_steps.dropped_rows"
REPEATED = "equal_steps.repeated_batches"
SPLIT = "equal_steps.split_batches"
MOVED = "equal_steps.moved_batches"
FILLERS = "equal_steps.filler_batches"


def _mark(item: Any, repeat: bool) -> Any:
    return {**item, REPEAT_KEY: torch.tensor(repeat)} if isinstance(item, dict) else item


class Lockstep:
    """The per-step protocol both :class:`EqualSteps` and :func:`equal_steps` follow (see those for the policies).

    Under ``"balance"`` every rank reads up to two batches ahead, ``TAIL_DEPTH`` once a rank has read its whole
    share; a rank that ran out gets a batch another holds beyond the one it yields now, and once every rank has
    read its share the batches left are split and moved by :func:`~padpipe.runtime.rebalance.tail_plan`
    (docs/distributed.md, "Equal steps").

    Args:
        policy: ``"balance"``, ``"repeat"`` or ``"drop"``.
        sync: The group's :class:`StepSync`.
        stats: Where to count moves, splits, fillers, repeats and drops.
        device: Where batches received from another rank or restored from a state go (batches go to
            other ranks on the CPU); ``None``: left where they are.
    """

    STATE = StateSchema(
        "EqualSteps lockstep",
        1,
        held=SPEC,  # batches read ahead or received, not returned yet
        ring=SPEC,  # "repeat": the first batches returned this epoch, to replay
        exhausted=Bool(),  # this rank has read its whole share of the epoch
        tail=Bool(),  # a rank had read its share: every rank reads ahead to the tail
        balanced=Bool(),  # every rank had read its share, and holds the batches it returns until the end
        stopped=Bool(),  # the epoch ended on every rank
        fresh=Int(0),  # batches returned this epoch that were neither repeats nor fillers
        steps=Int(0),
    )

    def __init__(self, policy: str, sync: Any, stats: PipelineStats, *, device: torch.device | None = None) -> None:
        self.policy, self.sync, self.stats, self.device = policy, sync, stats, device
        self.held = Held(device=device)  # read ahead (or received), not yielded yet
        self.ring = Held(device=device)  # "repeat": the first batches yielded this epoch
        self.fresh = self.steps = 0
        self.exhausted = self.stopped = self.balanced = self.tail = False

    def state(self) -> dict[str, Any]:
        """This rank's protocol state: the batches it holds (on the CPU), its flags and its counts (a new one's: an
        epoch's start).

        Example:
            >>> Lockstep.STATE.check(Lockstep("balance", None, PipelineStats()).state(), {"policy": "balance"}).steps
            0
        """
        flags = {k: getattr(self, k) for k in ("exhausted", "tail", "balanced", "stopped", "fresh", "steps")}
        return self.STATE.make({"policy": self.policy}, held=self.held.saved(), ring=self.ring.saved(), **flags)

    def restore(self, state: Any) -> None:
        """Go on from a saved :meth:`state` (checked here)."""
        loaded = self.STATE.check(state, {"policy": self.policy})
        self.held.restore(loaded.held)
        self.ring.restore(loaded.ring)
        for key in ("exhausted", "tail", "balanced", "stopped", "fresh", "steps"):
            setattr(self, key, loaded[key])

    def step(self, pull: Callable[[], Any], drain: Callable[[], Iterator[Any]]) -> Any:
        """The next item of this rank's epoch; ``StopIteration`` when the group ends it."""
        if self.stopped:
            raise StopIteration
        if self.policy == "repeat":
            return self._repeat(pull)
        if self.policy == "drop":
            return self._drop_step(pull, drain)
        return self._balance(pull)

    def _balance(self, pull: Callable[[], Any]) -> Any:
        extra = 0
        while not self.balanced:
            self._fill(pull, (TAIL_DEPTH if self.tail else 2) + extra)
            table = self.sync.gather([len(self.held), int(self.exhausted)])
            counts = [count for count, _ in table]
            if all(done for _, done in table):
                if any(counts):
                    self._even_tail(counts)
                self.balanced = True
                break
            if not self.tail and any(done for _, done in table):
                self.tail = True  # a rank has read its share: every rank reads ahead to the tail, and all agree again
                continue
            moves = donations(counts)
            if moves is None:  # too few spare batches: the ranks still reading read further ahead, and all agree again
                short = counts.count(0) - sum(max(c - 1, 0) for c in counts)
                extra += -(-short // sum(1 for _, done in table if not done))
                continue
            received = self._exchange(moves, lambda move: self.held.pop())
            return self._yield(received[0] if received else self.held.pop(0))
        if not self.held:
            self.stopped = True
            raise StopIteration
        return self._yield(self.held.pop(0))

    def _even_tail(self, counts: list[int]) -> None:
        """Every rank has read its share: split and move the batches left until every rank holds the same number."""
        mine = _encode([(splittable_rows(b), documents(b)) for b in self.held])
        width = max(n for (n,) in self.sync.gather([len(mine)]))
        table = [_decode(row) for row in self.sync.gather(mine + [-1] * (width - len(mine)))]
        plan = tail_plan([[n for n, _ in row] for row in table], [[docs for _, docs in row] for row in table])
        for i in plan.splits[self.sync.rank]:
            self.held[i : i + 1] = list(split(self.held[i]))
            self.stats.add(SPLIT, 1)
        surplus = self.held[plan.steps :]
        del self.held[plan.steps :]
        self.held += self._exchange(plan.moves, lambda move: filler(self.held[0]) if move.filler else surplus.pop(0))
        self._drop(surplus)  # only where batches that are no dicts cannot be evened out

    def _repeat(self, pull: Callable[[], Any]) -> Any:
        self._fill(pull, 1)
        table = self.sync.gather([len(self.held), int(bool(self.ring))])
        counts = [count for count, _ in table]
        if not any(counts):
            self.stopped = True
            raise StopIteration
        stuck = [r for r, (count, ring) in enumerate(table) if not count and not ring]
        if stuck:  # a rank with no batch this epoch replays a copy of another rank's
            src = next(r for r, count in enumerate(counts) if count)
            self.ring += self._exchange([Move(src, r, filler=True) for r in stuck], lambda move: self.held[0])
        if self.held:
            item = self._yield(self.held.pop(0))
            if len(self.ring) < REPEAT_BUFFER:
                self.ring.append(item)
            return _mark(item, False)
        item = self.ring[(self.steps - self.fresh) % len(self.ring)]
        self.steps += 1
        self.stats.add(REPEATED, 1)
        return _mark(item, True)

    def _drop_step(self, pull: Callable[[], Any], drain: Callable[[], Iterator[Any]]) -> Any:
        self._fill(pull, 1)
        if min(count for (count,) in self.sync.gather([len(self.held)])) == 0:
            self.stopped = True
            self._drop([*self.held, *drain()])
            self.held.clear()
            raise StopIteration
        return self._yield(self.held.pop(0))

    def _fill(self, pull: Callable[[], Any], depth: int) -> None:
        while not self.exhausted and len(self.held) < depth:
            item = pull()
            if item is None:
                self.exhausted = True
            else:
                self.held.append(item)

    def _exchange(self, moves: list[Move], give: Callable[[Move], Any]) -> list[Any]:
        """Send this rank's batches of ``moves`` (``give(move)`` each, in order); the batches it received, in order."""
        me = self.sync.rank
        outgoing = [to_cpu(give(m)) for m in moves if m.src == me]
        received = [to_device(b, self.device) for b in self.sync.exchange(moves, outgoing)]
        if moved := sum(1 for m in moves if m.dst == me and not m.filler):
            self.stats.add(MOVED, moved)
        return received

    def _yield(self, item: Any) -> Any:
        self.steps += 1
        if isinstance(item, dict) and FILLER_KEY in item:
            self.stats.add(FILLERS, 1)
        else:
            self.fresh += 1
        return item

    def _drop(self, items: list[Any]) -> None:
        if not items:
            return
        first = DROPPED not in self.stats.snapshot().skipped  # logged once per loader, not per epoch
        self.stats.record_skip(DROPPED, len(items))
        self.stats.record_skip(DROPPED_ROWS, sum(rows_of(b) or 0 for b in items))
        if first:
            logger.warning(
                "equal_steps: this rank dropped its last %d batch(es) so that every rank stops at step %d "
                "(counted in stats as %r; logged once).",
                len(items),
                self.steps,
                DROPPED,
            )


Known = tuple[tuple[int, ...], ...]  # each row's document codes (rebalance.documents)


def _encode(batches: list[tuple[int, Known]]) -> list[int]:
    """Held batches as ints to gather: each ``rows, len(known)``, then each row's ``len(docs), *docs``."""
    out = []
    for rows, known in batches:
        out += [rows, len(known)]
        for docs in known:
            out += [len(docs), *docs]
    return out


def _decode(values: list[int]) -> list[tuple[int, Known]]:
    """:func:`_encode`'s batches back from a gathered row (``-1`` pads it)."""
    out, at = [], 0
    while at < len(values) and values[at] >= 0:
        rows, count = values[at], values[at + 1]
        at += 2
        known = []
        for _ in range(count):
            width = values[at]
            known.append(tuple(values[at + 1 : at + 1 + width]))
            at += 1 + width
        out.append((rows, tuple(known)))
    return out
