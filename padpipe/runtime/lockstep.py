"""The per-step agreement of equal steps: one all-reduce of a few ints, and the protocol built on it.

:class:`StepSync` all-reduces on CPU tensors (a gloo group where the world is NCCL);
``_Lockstep`` is the protocol :class:`~padpipe.runtime.equal_steps.EqualSteps` and
:func:`~padpipe.runtime.equal_steps.equal_steps` follow each step (see its docs).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import torch

from padpipe.runtime.batch_cut import merge_batches, rows_of, split_batch
from padpipe.stats import PipelineStats

logger = logging.getLogger("padpipe.runtime.equal_steps")

REPEAT_KEY = "is_repeat"
DROPPED = "equal_steps.dropped_batches"
DROPPED_ROWS = "equal_steps.dropped_rows"
REPEATED = "equal_steps.repeated_batches"
SPLIT = "equal_steps.split_batches"
MERGED = "equal_steps.merged_batches"


class StepSync:
    """One all-reduce (max) per step of a few ints: what every rank holds and can still do.

    It all-reduces a CPU tensor, so the host never waits for the GPU's queue (a CUDA tensor and
    ``.tolist()`` would stall it every step, undoing the prefetch): in ``group`` when that takes
    CPU tensors (gloo, or a ``"cpu:gloo,cuda:nccl"`` world), else, for the default NCCL world, in
    a gloo group over the same ranks, created once (every rank builds its loaders in the same
    order). A group passed in that takes only CUDA tensors (NCCL) is used as it is, on the
    current CUDA device.
    """

    def __init__(self, group: Any = None) -> None:
        import torch.distributed as dist

        self.group, self.device = group, torch.device("cpu")
        backend = str(dist.get_backend(group))
        if backend in ("gloo", "mpi") or "cpu:" in backend:
            return
        if group is None:
            self.group = _gloo_world()
        else:
            self.device = torch.device("cuda", torch.cuda.current_device())

    def agree(self, values: list[int]) -> list[int]:
        """The element-wise maximum of ``values`` over the group."""
        import torch.distributed as dist

        flags = torch.tensor(values, dtype=torch.int64, device=self.device)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=self.group)
        return flags.tolist()


_GLOO: list[Any] = []  # [the default group, its gloo twin]: made once per world


def _gloo_world() -> Any:
    import torch.distributed as dist

    world = dist.group.WORLD
    if not _GLOO or _GLOO[0] is not world:
        _GLOO[:] = [world, dist.new_group(backend="gloo")]
    return _GLOO[1]


def detect_sync(group: Any = None) -> StepSync | None:
    """A :class:`StepSync` when ``torch.distributed`` runs with more than one rank in this (main) process."""
    import torch.distributed as dist
    from torch.utils.data import get_worker_info

    if not (dist.is_available() and dist.is_initialized()) or get_worker_info() is not None:
        return None  # a DataLoader worker never joins the trainer's collectives
    return StepSync(group) if dist.get_world_size(group) > 1 else None


def _mark(item: Any, repeat: bool) -> Any:
    return {**item, REPEAT_KEY: torch.tensor(repeat)} if isinstance(item, dict) else item


TAIL_DEPTH = 16  # batches each rank reads ahead once a rank has read its whole epoch (held in memory, maybe on a GPU)
NO_LIMIT = 2**40  # the steps a rank that can still read could make


class _Lockstep:
    """The per-step protocol both :class:`EqualSteps` and :func:`equal_steps` follow.

    Each step every rank holds a few batches read ahead (one under ``"repeat"``) and the group
    agrees, in one all-reduce, on the most and fewest held, whether a rank is stuck, whether every
    or any rank has read its whole epoch, and the fewest steps a rank that has could still make
    (its rows: a batch splits down to single rows). Nobody holds any: the epoch ends. Someone holds
    none: ``"stop_first"`` ends the epoch (what is left is dropped and counted), ``"repeat"`` lets
    the ranks that ran out replay. Otherwise every rank yields one.

    Under ``"stop_first"``, once a rank has read its whole epoch every rank reads up to
    ``TAIL_DEPTH`` batches ahead, so the tail is known exactly: when every rank has read all of
    its epoch, ranks holding fewer batches than the most split their largest ones until all hold
    the same number, and all end together with nothing dropped. Where a rank has fewer rows left
    than another has batches, the others join neighbouring batches of the same shape (packed
    rows, padded rows of one width) down to that many; only batches that cannot be joined are
    dropped. Before that, a rank down to its last batch while another holds two splits it in two.
    """

    def __init__(self, policy: str, sync: Any, stats: PipelineStats) -> None:
        self.policy, self.sync, self.stats = policy, sync, stats
        self.held: list[Any] = []
        self.fresh = self.steps = 0
        self.exhausted = self.stopped = self.tail = False
        self._logged = False

    def step(self, pull: Callable[[], Any], replay: Callable[[], Any], drain: Callable[[], Iterator[Any]]) -> Any:
        """The next item of this rank's epoch; ``StopIteration`` when the group ends it."""
        if self.stopped:
            raise StopIteration
        while True:
            depth = 1 if self.policy != "stop_first" else TAIL_DEPTH if self.tail else 2
            while not self.exhausted and len(self.held) < depth:
                item = pull()
                if item is None:
                    self.exhausted = True
                else:
                    self.held.append(item)
            held = len(self.held)
            capacity = sum(rows_of(b) or 1 for b in self.held) if self.exhausted else NO_LIMIT
            most, low, stuck, reading, done, low_capacity = self.sync.agree(
                [
                    held,
                    -held,
                    int(held == 0 and self.fresh == 0),
                    int(not self.exhausted),
                    int(self.exhausted),
                    -capacity,
                ]
            )
            if self.policy == "stop_first" and done and reading and not self.tail:
                self.tail = True  # a rank has read its epoch: every rank reads ahead to the tail, and all agree again
                continue
            break
        least = -low
        if most == 0 or (least == 0 and (self.policy == "stop_first" or stuck)):
            self.stopped = True
            self._drop([*self.held, *drain()])
            raise StopIteration
        self.steps += 1
        if held == 0:  # "repeat", and another rank still has batches
            self.stats.add(REPEATED, 1)
            return _mark(replay(), True)
        self.fresh += 1
        if self.policy == "stop_first":
            if not reading:  # every rank has read its epoch: the steps left are known
                target = min(most, -low_capacity)  # as many as the most held, if every rank has the rows
                self._split_to(target)
                self._merge_to(target)
            elif self.exhausted and held == 1 and most >= 2:
                self._split_to(2)
        item = self.held.pop(0)
        return _mark(item, False) if self.policy == "repeat" else item

    def _split_to(self, target: int) -> None:
        """Split the largest held batches in two (in place, rows in order) until ``target`` are held."""
        while len(self.held) < target:
            for i in sorted(range(len(self.held)), key=lambda i: -(rows_of(self.held[i]) or 0)):
                halves = split_batch(self.held[i])
                if halves is not None:
                    self.held[i : i + 1] = list(halves)
                    self.stats.add(SPLIT, 1)
                    break
            else:
                return

    def _merge_to(self, target: int) -> None:
        """Join the two smallest neighbouring held batches until at most ``target`` are held (a rank with few rows
        left)."""
        while len(self.held) > max(target, 1):
            sizes = [rows_of(b) or 0 for b in self.held]
            pairs = sorted(range(len(self.held) - 1), key=lambda i: sizes[i] + sizes[i + 1])
            for i in pairs:
                joined = merge_batches(self.held[i], self.held[i + 1])
                if joined is not None:
                    self.held[i : i + 2] = [joined]
                    self.stats.add(MERGED, 1)
                    break
            else:
                return

    def _drop(self, items: list[Any]) -> None:
        if not items:
            return
        self.stats.record_skip(DROPPED, len(items))
        self.stats.record_skip(DROPPED_ROWS, sum(rows_of(b) or 0 for b in items))
        if not self._logged:
            self._logged = True
            logger.warning(
                "equal_steps: this rank dropped its last %d batch(es) so that every rank stops at step %d "
                "(counted in stats as %r; logged once).",
                len(items),
                self.steps,
                DROPPED,
            )
