"""Run a pipeline in DataLoader worker processes, as one resumable node of the main process.

:class:`WorkerProcesses` drives a ``torchdata`` ``StatefulDataLoader`` over the pipeline (one share per rank x
worker), started each epoch with that epoch; its state is the epoch plus the ``StatefulDataLoader``'s own.
"""

from __future__ import annotations

import functools
import warnings
import weakref
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch.utils.data import IterableDataset
from torchdata.nodes import BaseNode

from padpipe.graph import EpochAware
from padpipe.runtime.iterable import EPOCH_KEY, NODE_KEY, STATS_KEY, PipelineIterator
from padpipe.runtime.loader_snapshot import LoaderSnapshot, worker_iterators, worker_stopper
from padpipe.runtime.tensor_bytes import BytesIterator
from padpipe.sharing.consumer import Consumer
from padpipe.sharing.ranks import ranks
from padpipe.stage import Recipe
from padpipe.state import Bool, Child, Int, ListOf, Optional, Spec, StateMismatchError, StateSchema
from padpipe.state_walk import show
from padpipe.stats import PipelineStats, StatsSnapshot


class EpochShares(IterableDataset):
    """The dataset each worker receives: the ``pipeline`` (without the main-process stages), the ``consumer`` rank
    to read as (the worker slot is filled in each worker), and the epoch the main process set."""

    def __init__(self, pipeline: Recipe, consumer: Consumer) -> None:
        self.pipeline = pipeline
        self.consumer = consumer
        self.epoch = 0
        self.plans: list[dict[str, Any]] | None = None  # per worker: where to start (an elastic resume's plan)

    def __iter__(self) -> Iterator[Any]:
        from torch.utils.data import get_worker_info

        it = PipelineIterator(self.pipeline, self.epoch, consumer=self.consumer, managed=True, report_stats=True)
        info = get_worker_info()
        if info is None:
            return it
        if self.plans is not None:
            it.load_state_dict(self.plans[info.id])
        return BytesIterator(it)  # batches and states reach the main process as bytes, not shared memory


class WorkerProcesses(EpochAware, BaseNode[Any]):
    """Yield a pipeline's batches read by ``num_workers`` worker processes of this rank.

    Args:
        pipeline: The recipe each worker builds (its share of this rank's share).
        num_workers: Worker processes (at least 1).
        consumer: The rank to read as; default: detected on the first ``reset`` (split between ranks
            unless ``ranks`` is ``False``: ``Pipeline.shard("off")``).
        options: Further ``StatefulDataLoader`` keywords (:meth:`LoaderOptions.dataloader`).
        stats: The main process's counters, into which the workers' (sent with their states) are summed.

    Example:
        >>> pipe = pp.from_iterable([{"text": "a"}] * 4).tokenize(pp.examples.tokenizer()).batch(1).pad()
        >>> node = WorkerProcesses(pipe, num_workers=2); node.reset()
        >>> sum(1 for _ in node)
        4
    """

    STATE = StateSchema(
        "WorkerProcesses",
        2,
        epoch=Int(0),
        done=Bool(),  # every worker's share had come out
        dataloader=Optional(LoaderSnapshot()),  # the StatefulDataLoader's own state
        plans=Optional(ListOf(Child())),  # each worker's start (an elastic plan) while no loader state exists
    )

    def __init__(
        self,
        pipeline: Recipe,
        *,
        num_workers: int,
        consumer: Consumer | None = None,
        ranks: bool = True,
        options: dict[str, Any] | None = None,
        stats: PipelineStats | None = None,
    ) -> None:
        super().__init__()
        self.pipeline, self.num_workers, self.consumer, self.ranks = pipeline, num_workers, consumer, ranks
        self.options = dict(options or {})
        self.stats = stats or PipelineStats()
        self._ended = PipelineStats().snapshot()  # the workers' counters of earlier epochs
        self.stats.include(functools.partial(_workers_stats, weakref.ref(self)))  # no cycle: workers stop when dropped
        self._loader: Any = None
        self._it: Iterator[Any] | None = None
        self._stop_with_node: weakref.finalize | None = None
        self._epoch, self._done = -1, False
        self._plans: list[dict[str, Any]] | None = None

    DONE = {"done": True}  # what :meth:`worker_graphs` gives for a worker whose share had all come out

    @classmethod
    def planned_state(cls, num_workers: int, epoch: int, plans: list[dict[str, Any]]) -> dict[str, Any]:
        """The state of ``epoch`` with worker ``w`` starting from graph state ``plans[w]`` (an elastic plan)."""
        return cls.STATE.make(
            {"num_workers": num_workers},
            epoch=epoch,
            done=False,
            dataloader=None,
            plans=[{EPOCH_KEY: epoch, NODE_KEY: p} for p in plans],
        )

    @classmethod
    def worker_graphs(cls, state: dict[str, Any], num_workers: int) -> tuple[list[Any], int]:
        """Each worker's graph state in a saved state of ``num_workers`` workers (:attr:`DONE`; ``None``: not
        started), and the epoch."""
        try:
            loaded = cls.STATE.check(state, {"num_workers": num_workers}, specs=_plans(num_workers))
        except StateMismatchError as exc:
            raise StateMismatchError(
                f"PipelineLoader state is invalid: 'layout' says {num_workers} worker process(es) a rank, but its root "
                f"is no state of them ({exc})"
            ) from None
        epoch, loader = loaded.epoch, loaded.dataloader
        if loaded.done:
            return [cls.DONE] * num_workers, epoch
        if loader is None:
            plans = loaded.plans
            return ([None] * num_workers if plans is None else [_node_of(p, w) for w, p in enumerate(plans)]), epoch
        if loader.get("_steps_since_snapshot", 0):
            raise StateMismatchError(
                "elastic resume needs worker snapshots taken at every step (snapshot_every_n_steps=1)."
            )
        iterators = worker_iterators(loader)
        return [
            None if (it := iterators.get(f"worker_{w}")) is None else _node_of(it, w) for w in range(num_workers)
        ], epoch

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        super().reset(initial_state)
        self.close()
        if self._loader is None:
            self._loader = self._make_loader()
        if initial_state is None:
            self._epoch, self._done, self._plans = self._epoch + 1, False, None
            self._start(None)
            return
        loaded = self.STATE.check(initial_state, {"num_workers": self.num_workers}, specs=_plans(self.num_workers))
        self._epoch, self._done, loader_state = loaded.epoch, loaded.done, loaded.dataloader
        self._plans = loaded.plans if loader_state is None else None
        if not self._done:
            self._start(loader_state)

    def next(self) -> Any:
        if self._it is None:
            raise StopIteration
        try:
            return next(self._it)
        except StopIteration:
            self._done = True
            self.close()
            raise

    def get_state(self) -> dict[str, Any]:
        loader_state = None if self._it is None else self._loader.state_dict()
        plans = self._plans if loader_state is None else None
        return self.STATE.make(
            {"num_workers": self.num_workers}, epoch=self._epoch, done=self._done, dataloader=loader_state, plans=plans
        )

    def close(self) -> None:
        """Stop this epoch's worker processes (they restart on the next ``reset``), keeping their counters."""
        if self._it is not None:
            self._ended = self._ended.merge(*self._live())
        it, self._it = self._it, None
        if self._stop_with_node is not None:
            self._stop_with_node.detach()
            self._stop_with_node = None
        _shutdown(it)

    def _make_loader(self) -> Any:
        from torchdata.stateful_dataloader import StatefulDataLoader

        consumer = self.consumer
        if consumer is None:  # ranks are known here, where the trainer set up torch.distributed
            rank, world = ranks() if self.ranks else (0, 1)
            consumer = Consumer(rank=rank, world_size=world)
        self._dataset = EpochShares(self.pipeline, consumer)
        # the workers' base seed is drawn from this generator, never from torch's global one: starting an
        # epoch leaves the trainer's random state (dropout) as it was, so a resumed run draws the same masks
        self._generator = torch.Generator()
        with warnings.catch_warnings():  # torchdata 0.11 calls torch.set_vital, deprecated in torch 2.13
            warnings.filterwarnings("ignore", message="'set_vital' is deprecated")
            return StatefulDataLoader(
                self._dataset,
                batch_size=None,
                num_workers=self.num_workers,
                persistent_workers=False,
                generator=self._generator,
                **self.options,
            )

    def _live(self) -> list[StatsSnapshot]:
        """The counters the running workers last sent (with their states)."""
        if self._it is None:
            return []
        states = worker_iterators(self._loader.state_dict()).values()
        return [StatsSnapshot(**state[STATS_KEY]) for state in states if state and STATS_KEY in state]

    def _start(self, loader_state: dict[str, Any] | None) -> None:
        """Start workers for ``self._epoch`` (forked or spawned with the epoch in their dataset)."""
        self.stats.add("workers.epochs_started", 1)
        self._dataset.epoch, self._dataset.plans = self._epoch, self._plans
        self._generator.manual_seed(self._epoch)  # the same worker seeds for an epoch in every run
        self._loader.load_state_dict(loader_state or {})
        import_what_workers_import()
        self._it = iter(self._loader)
        worker_stopper(self._it)  # torchdata's way to stop them, checked now: in the finalizer an error is only printed
        # the workers stop when this node goes, even if the garbage collector frees it in a reference cycle:
        # torch's own ``__del__`` then runs after the queues it signals the workers through were closed, and
        # waits 5 s for each worker before killing it
        self._stop_with_node = weakref.finalize(self, _shutdown, self._it)


@functools.cache
def import_what_workers_import() -> None:
    """Import here, once, what every worker would import for itself: forked workers inherit it (workers start
    afresh each epoch, and pyarrow's first conversion imports pandas, about 300 modules, where installed).

    Example:
        >>> import_what_workers_import()
    """
    import pyarrow as pa

    pa.array([0])


def _plans(num_workers: int) -> dict[str, Spec]:
    """The spec of the workers' elastic starts, one per worker."""
    return {"plans": Optional(ListOf(Child(), length=num_workers))}


def _shutdown(it: Any) -> None:
    """Stop a ``StatefulDataLoader`` iterator's worker processes (nothing for ``None``)."""
    if it is not None:
        worker_stopper(it)()


def _node_of(iterator: Any, worker: int) -> Any:
    """The graph state in worker ``worker``'s iterator state (a ``StateMismatchError`` when there is none)."""
    if not isinstance(iterator, Mapping) or NODE_KEY not in iterator:
        raise StateMismatchError(
            f"WorkerProcesses state is invalid: worker {worker}'s state must be a dict with {NODE_KEY!r}, but is "
            f"{show(iterator)} instead."
        )
    return iterator[NODE_KEY]


def _workers_stats(node: weakref.ref[WorkerProcesses]) -> StatsSnapshot:
    """The counters of a node's workers: those of ended epochs and what the running ones last sent."""
    alive = node()
    return PipelineStats().snapshot() if alive is None else alive._ended.merge(*alive._live())
