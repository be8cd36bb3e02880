"""Equal steps on every rank: agree each step, across ranks, how the epoch goes on.

Token-budget batches make a different number of batches on each rank, and DDP hangs at the end
of an epoch when one rank stops while the others wait in a collective. :class:`EqualSteps` (and
:func:`equal_steps` for a ``DataLoader``) all-reduce one tiny int tensor per step, so every rank
takes the same number of steps. With ``"stop_first"`` (the default) a rank about to run out while
others still have batches splits its last batch in two, as often as needed, so ranks end together
and (nearly) nothing is held back; ``"repeat"`` replays batches marked ``"is_repeat"`` instead.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torchdata.nodes import BaseNode

from padpipe.errors import one_of
from padpipe.pipes.batch_tensors import to_cpu, to_device
from padpipe.runtime.batch_merge import merge_batches
from padpipe.state import SOURCE_KEY, Bool, Child, Int, ListOf, Optional, Plain, check_state, make_state
from padpipe.stats import PipelineStats

logger = logging.getLogger(__name__)

POLICIES = ("stop_first", "repeat", "off")
REPEAT_KEY = "is_repeat"
DROPPED = "equal_steps.dropped_batches"
DROPPED_ROWS = "equal_steps.dropped_rows"
REPEATED = "equal_steps.repeated_batches"
SPLIT = "equal_steps.split_batches"
MERGED = "equal_steps.merged_batches"
REPEAT_BUFFER = 8  # batches :func:`equal_steps` keeps per epoch to repeat on a rank that ran out


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


def split_batch(batch: Any) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """Cut a dict batch of ``B >= 2`` rows into two (rows ``[:B//2]`` and ``[B//2:]``), or ``None``.

    Tensors and lists whose first dimension is ``B`` are cut; 0-d tensors and plain scalars are
    kept in both halves. A packed batch's flash-attention kwargs (``cu_seq_lens_q/k``,
    ``max_length_q/k``, ``seq_idx``) are recomputed for each half (segments never cross rows). A
    batch with anything else is not cut.

    Example:
        >>> halves = split_batch({"input_ids": torch.ones(3, 2), "text": ["a", "b", "c"], "k": 1})
        >>> [h["text"] for h in halves], halves[1]["input_ids"].shape
        ([['a'], ['b', 'c']], torch.Size([2, 2]))
    """
    if not isinstance(batch, dict):
        return None
    rows = rows_of(batch)
    if rows is None or rows < 2:
        return None
    cut, first, second = rows // 2, {}, {}
    for key, value in batch.items():
        if key in PACKED_KEYS:
            continue
        if isinstance(value, torch.Tensor) and value.dim() > 0 or isinstance(value, (list, tuple)):
            if len(value) != rows:
                return None
            first[key], second[key] = value[:cut], value[cut:]
        elif isinstance(value, (torch.Tensor, int, float, str, bool)) or value is None:
            first[key] = second[key] = value
        else:
            return None
    if "cu_seq_lens_q" in batch and not _split_packed(batch, cut, first, second):
        return None
    return first, second


PACKED_KEYS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")


def _split_packed(batch: dict[str, Any], cut: int, first: dict[str, Any], second: dict[str, Any]) -> bool:
    """Give each half its own segment boundaries and longest segment; ``False`` if the batch is not packed."""
    bounds, ids = batch["cu_seq_lens_q"], batch.get("input_ids")
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or not isinstance(bounds, torch.Tensor):
        return False
    edge, host = cut * ids.shape[1], bounds.tolist()  # read on the host: the bounds may be on a GPU
    at = bisect.bisect_left(host, edge)
    if at >= len(host) or host[at] != edge:
        return False
    for half, part, lengths in ((first, bounds[: at + 1], host[: at + 1]), (second, bounds[at:] - edge, host[at:])):
        half["cu_seq_lens_q"] = half["cu_seq_lens_k"] = part.to(bounds.dtype)
        half["max_length_q"] = half["max_length_k"] = max(b - a for a, b in zip(lengths, lengths[1:]))
    if isinstance(second.get("seq_idx"), torch.Tensor):
        second["seq_idx"] = second["seq_idx"] - at
    return True


def rows_of(batch: Any) -> int | None:
    """Rows of a dict batch (the first dimension of its first tensor), else ``None``."""
    if not isinstance(batch, dict):
        return None
    return next((len(v) for v in batch.values() if isinstance(v, torch.Tensor) and v.dim() > 0), None)


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

    VERSION = 3
    HELD_KEY = "held"
    EXHAUSTED_KEY = "exhausted"
    STOPPED_KEY = "stopped"
    FRESH_KEY = "fresh"
    STEPS_KEY = "steps"
    REPLAYING_KEY = "replaying"
    START_KEY = "start"
    TAIL_KEY = "tail"

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
        return make_state(
            version=cls.VERSION,
            settings={"policy": policy},
            **{
                SOURCE_KEY: source,
                cls.HELD_KEY: [],
                cls.EXHAUSTED_KEY: False,
                cls.STOPPED_KEY: False,
                cls.FRESH_KEY: 0,
                cls.STEPS_KEY: 0,
                cls.REPLAYING_KEY: False,
                cls.TAIL_KEY: False,
                cls.START_KEY: source if policy == "repeat" else None,
            },
        )

    @classmethod
    def parts(cls, state: dict[str, Any]) -> tuple[dict[str, Any], list[Any], bool]:
        """A saved state's upstream state, the batches it held read ahead, and whether its epoch had ended."""
        ended = bool(state[cls.STOPPED_KEY] or state[cls.REPLAYING_KEY])
        return state[SOURCE_KEY], list(state[cls.HELD_KEY]), ended

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
        fields = {
            SOURCE_KEY: Child(),
            self.HELD_KEY: ListOf(Plain()),
            self.EXHAUSTED_KEY: Bool(),
            self.STOPPED_KEY: Bool(),
            self.FRESH_KEY: Int(0),
            self.STEPS_KEY: Int(0),
            self.REPLAYING_KEY: Bool(),
            self.START_KEY: Optional(Child()),
            self.TAIL_KEY: Bool(),
        }
        check_state("EqualSteps", initial_state, version=self.VERSION, settings={"policy": self.policy}, fields=fields)
        self.source.reset(initial_state[SOURCE_KEY])
        step = self._step
        step.held = [to_device(b, self.device) for b in initial_state[self.HELD_KEY]]
        step.exhausted, step.stopped = initial_state[self.EXHAUSTED_KEY], initial_state[self.STOPPED_KEY]
        step.fresh, step.steps = initial_state[self.FRESH_KEY], initial_state[self.STEPS_KEY]
        step.tail = initial_state[self.TAIL_KEY]
        self._replaying, self._start = initial_state[self.REPLAYING_KEY], initial_state[self.START_KEY]

    def next(self) -> Any:
        if self._sync is None:  # batches read ahead on another layout (an elastic resume) come first
            item = self._step.held.pop(0) if self._step.held else next(self.source)
            return _mark(item, False) if self.policy == "repeat" else item
        return self._step.step(self._pull, self._replay, lambda: iter(self.source))

    def get_state(self) -> dict[str, Any]:
        step = self._step
        return make_state(
            version=self.VERSION,
            settings={"policy": self.policy},
            **{
                SOURCE_KEY: self.source.state_dict(),
                self.HELD_KEY: [to_cpu(b) for b in step.held],
                self.EXHAUSTED_KEY: step.exhausted,
                self.STOPPED_KEY: step.stopped,
                self.FRESH_KEY: step.fresh,
                self.STEPS_KEY: step.steps,
                self.REPLAYING_KEY: self._replaying,
                self.START_KEY: self._start,
                self.TAIL_KEY: step.tail,
            },
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
    _mark_managed(iterable)
    sync = detect_sync(group) if policy != "off" else None
    if sync is None:
        yield from (_mark(b, False) for b in iterable) if policy == "repeat" else iterable
        return
    it, lockstep, first = iter(iterable), _Lockstep(policy, sync, stats), []

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


def _mark_managed(iterable: Iterable[Any]) -> None:
    """Tell a DataLoader's pipeline that steps are kept equal here (no hang warning in its workers)."""
    from padpipe.pipeline import Pipeline

    dataset = getattr(iterable, "dataset", None)
    if isinstance(dataset, Pipeline):
        dataset._managed[0] = True
