"""Elastic resume: the rest of an epoch saved on ``R x W`` consumers, re-shared over ``R' x W'``.

Each old consumer (rank x worker) had, when its state was saved, rows buffered in its stages
(shuffle, bucket, pack, mix buffers) and units it had not read yet. Every row that had not come
out in a batch is yielded exactly once by the new consumers, and none that had:

* the **buffered rows** come out of the old consumer's own graph, restored from its state with
  its readers told to read nothing new (:meth:`UnitSource.stop_on_load`): the buffers drain as
  at an epoch's end, through the same stages (so batches keep their budget). Old consumer ``c``
  is drained by new consumer ``c % C'``; a rank's batches read ahead by equal steps go to new
  rank ``r % R'``;
* the **unread pieces** of every old consumer (a unit cut at the saved row where rows can be cut)
  are laid end to end in the epoch's order and shared again over the new consumers
  (:mod:`padpipe._shares`), read through each new consumer's own graph.

The next epochs follow the normal seeded plan for ``C'`` consumers. :class:`ConsumerGraph` is the
top node of every consumer's graph: in a normal run it passes everything through; given an elastic
plan it runs the drains, then its share of the unread pieces. :func:`reshare` makes the plan.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torchdata.nodes import BaseNode

from padpipe._shard import Consumer
from padpipe._shares import share
from padpipe._state import (Child, Int, ListOf, Optional, Plain, StateMismatchError, check_state, load_value,
                            make_state)
from padpipe.stats import PipelineStats

if TYPE_CHECKING:
    from padpipe.pipeline import Pipeline
    from padpipe.pipes._source import UnitSource, WorkUnit

ELASTIC_KEY = "elastic"
EPOCH, DRAINS, PIECES, PART, FRESH = "epoch", "drains", "pieces", "part", "fresh"
CONSUMER, STATE = "consumer", "state"


@dataclass(frozen=True)
class OldConsumer:
    """One consumer of the saved layout: ``index`` of ``count``, ``workers`` per rank, its graph state."""

    index: int
    count: int
    workers: int
    state: dict[str, Any] | None  # None: it had not started its share

    def consumer(self) -> Consumer:
        """Its slot, to build its graph as it was."""
        return Consumer(rank=self.index // self.workers, world_size=self.count // self.workers,
                        worker=self.index % self.workers, num_workers=self.workers)


def readers(node: Any, state: Any = None) -> list[tuple[UnitSource, Any]]:
    """The graph's readers in a fixed order, each with its part of ``state`` (the graph's state) if given.

    Raises:
        StateMismatchError: For a reader that cannot be re-shared (``from_iterable``, a streaming
            ``IterableDataset``) or a mix that does not read every row once (``stop`` other than
            ``"all_exhausted"``).
    """
    from padpipe.pipes._errors import FailureLatch
    from padpipe.pipes._source import UnitSource
    from padpipe.pipes.mix import WeightedMixer

    if isinstance(node, FailureLatch):
        return readers(node.source, state)
    if isinstance(node, UnitSource):
        return [(node, state)]
    if isinstance(node, WeightedMixer):
        if node.stop != "all_exhausted":
            raise StateMismatchError(f"elastic resume needs a mix that reads every row once (stop='all_exhausted'), "
                                     f"but this one has stop={node.stop!r}.")
        parts = state["source"] if state is not None else {}
        return [r for name, child in node.source_nodes.items() for r in readers(child, parts.get(name))]
    child = getattr(node, "source", None)
    if not isinstance(child, BaseNode):
        raise StateMismatchError(
            f"elastic resume cannot re-share a {type(node).__name__}: it has no work units to hand to other "
            "consumers (pp.from_iterable and streaming IterableDatasets resume only on the layout they were saved on)."
        )
    return readers(child, state["source"] if state is not None else None)


def plan(pipeline: Pipeline, old: list[OldConsumer], epoch: int, new: list[Consumer],
         count: int) -> list[dict[str, Any]]:
    """The elastic plan (a :class:`ConsumerGraph` state) of each consumer in ``new`` (of ``count``)."""
    probe = [reader for reader, _ in readers(pipeline.build(consumer=new[0]))]
    rests: list[list[WorkUnit]] = [[] for _ in probe]
    for consumer in old:
        pairs = readers(pipeline.build(consumer=consumer.consumer()), consumer.state)
        probe = [reader for reader, _ in pairs]  # listed: they measure the pieces
        for k, (reader, state) in enumerate(pairs):
            start = {"epoch": epoch, "unit": 0, "row": 0}  # a consumer that had not started: all of its share
            rests[k] += reader.rest_of_epoch(start if consumer.state is None else state)
    plans = []
    for slot in new:
        index = slot.index
        pieces = []
        for reader, rest in zip(probe, rests):
            mine = share([reader.measure(u) for u in rest], index, count)
            pieces.append([dataclasses.asdict(reader.piece(rest[p.position], p.lo, p.hi)) for p in mine])
        drains = [{CONSUMER: [c.index, c.count, c.workers], STATE: c.state} for c in old
                  if c.index % count == index and c.state is not None]
        elastic = {EPOCH: epoch, DRAINS: drains, PIECES: pieces, PART: None, FRESH: None}
        plans.append(make_state(version=ConsumerGraph.VERSION, settings={}, **{ELASTIC_KEY: elastic}))
    return plans


class ConsumerGraph(BaseNode[Any]):
    """One consumer's graph; states pass through unchanged, except an elastic plan (see the module docs).

    Args:
        pipeline: The recipe.
        consumer: This consumer's slot.
        stats: Counters to report into.

    Example:
        >>> pipe = pp.from_iterable([{"text": "a"}]).tokenize(pp.examples.tokenizer()).batch(1).pad()
        >>> node = ConsumerGraph(pipe, Consumer(), PipelineStats()); node.reset()
        >>> [b["input_ids"].tolist() for b in node]
        [[[2, 81, 3]]]
    """

    VERSION = 1

    def __init__(self, pipeline: Pipeline, consumer: Consumer | None, stats: PipelineStats) -> None:
        super().__init__()
        self.pipeline, self.consumer, self.stats = pipeline, consumer, stats
        self.source = pipeline.build(consumer=consumer, stats=stats)
        self._elastic: dict[str, Any] | None = None
        self._part: BaseNode | None = None
        self._part_consumer: list[int] | None = None
        self._fresh = False

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        super().reset(initial_state)
        left, fresh = self._elastic, self._fresh
        self._part, self._elastic, self._fresh = None, None, False
        if initial_state is None or ELASTIC_KEY not in initial_state:
            if initial_state is None and left is not None and not fresh:  # left during the drains
                from padpipe._iterable import start_at_epoch

                start_at_epoch(self.source, left[EPOCH] + 1)
            self.source.reset(initial_state)
            return
        elastic = check_state("ConsumerGraph", initial_state, version=self.VERSION, settings={},
                              fields={ELASTIC_KEY: Plain()})[ELASTIC_KEY]
        self._elastic = _check_plan(elastic)
        self._override(elastic)
        if elastic[PART] is not None:
            self._drain(elastic[PART])
        elif elastic[FRESH] is not None:
            self.source.reset(elastic[FRESH])
            self._fresh = True
        else:
            self._next_part()

    def next(self) -> Any:
        while self._part is not None:
            try:
                return next(self._part)
            except StopIteration:
                self._next_part()
        return next(self.source)

    def get_state(self) -> dict[str, Any]:
        if self._elastic is None:
            return self.source.state_dict()
        part = None if self._part is None else {CONSUMER: self._part_consumer, STATE: self._part.state_dict()}
        fresh = self.source.state_dict() if self._fresh else None
        elastic = {**self._elastic, PART: part, FRESH: fresh}
        return make_state(version=self.VERSION, settings={}, **{ELASTIC_KEY: elastic})

    # -- helpers ------------------------------------------------------------------------------------
    def _override(self, elastic: dict[str, Any]) -> None:
        from padpipe.pipes._source import WorkUnit

        mine = readers(self.source)
        if len(mine) != len(elastic[PIECES]):
            raise StateMismatchError(f"ConsumerGraph state is invalid: the plan has pieces for "
                                     f"{len(elastic[PIECES])} readers, but this pipeline has {len(mine)}.")
        for (reader, _), pieces in zip(mine, elastic[PIECES]):
            reader.override_epoch(elastic[EPOCH], [WorkUnit(**p) for p in pieces])

    def _drain(self, part: dict[str, Any]) -> None:
        """Restore an old consumer's graph with its readers stopped: only its buffered rows come out."""
        index, count, workers = part[CONSUMER]
        old = OldConsumer(index, count, workers, part[STATE])
        graph = self.pipeline.build(consumer=old.consumer(), stats=self.stats)
        for reader, _ in readers(graph):
            reader.stop_on_load()
        graph.reset(part[STATE])
        self._part, self._part_consumer = graph, [index, count, workers]

    def _next_part(self) -> None:
        self._part = self._part_consumer = None
        assert self._elastic is not None
        if self._elastic[DRAINS]:
            self._drain(self._elastic[DRAINS].pop(0))
            return
        from padpipe._iterable import start_at_epoch

        start_at_epoch(self.source, self._elastic[EPOCH])
        self.source.reset(None)
        self._fresh = True


def _check_plan(elastic: Any) -> dict[str, Any]:
    """The elastic plan of a state, each field checked (``StateMismatchError`` naming the bad one)."""
    stage = "ConsumerGraph"
    if not isinstance(elastic, dict) or set(elastic) != {EPOCH, DRAINS, PIECES, PART, FRESH}:
        raise StateMismatchError(f"{stage} state is invalid: {ELASTIC_KEY!r} must be an elastic plan "
                                 f"with keys {sorted([EPOCH, DRAINS, PIECES, PART, FRESH])}.")
    drain = ListOf(Int(0), length=3)
    load_value(stage, EPOCH, elastic[EPOCH], Int(0))
    load_value(stage, PIECES, elastic[PIECES], ListOf(ListOf(Plain())))
    load_value(stage, FRESH, elastic[FRESH], Optional(Child()))
    parts = load_value(stage, DRAINS, elastic[DRAINS], ListOf(Child()))
    parts += [] if elastic[PART] is None else [load_value(stage, PART, elastic[PART], Child())]
    for part in parts:
        if set(part) != {CONSUMER, STATE}:
            raise StateMismatchError(f"{stage} state is invalid: a drain must have keys {[CONSUMER, STATE]}.")
        load_value(stage, CONSUMER, part[CONSUMER], drain)
        load_value(stage, STATE, part[STATE], Child())
    return {**elastic, DRAINS: list(elastic[DRAINS])}


LAYOUT_KEY = "layout"  # [rank, ranks, workers] of the loader that saved a state


def reshare(states: list[dict[str, Any]], *, pipeline: Pipeline, policy: str, layout: list[int],
            version: int, settings: dict[str, Any]) -> dict[str, Any]:
    """A ``PipelineLoader`` state for this loader (``layout``) that continues the epoch of ``states``.

    Args:
        states: Every rank's loader state of the old layout (checked already), in any order.
        pipeline: The recipe (the same as the old run's).
        policy: The loader's equal-steps policy.
        layout: ``[rank, ranks, workers]`` of this loader.
        version: The ``PipelineLoader`` state version.
        settings: The ``PipelineLoader`` settings.
    """
    from padpipe._workers import WorkerProcesses
    from padpipe.pipes.equal_steps import EqualSteps

    states = sorted(states, key=lambda s: s[LAYOUT_KEY][0])
    _, ranks, workers = states[0][LAYOUT_KEY]
    if [s[LAYOUT_KEY] for s in states] != [[r, ranks, workers] for r in range(ranks)]:
        found = [s[LAYOUT_KEY][0] for s in states]
        raise StateMismatchError(f"elastic resume needs the state of every rank of the saved run (ranks 0 to "
                                 f"{ranks - 1} of {ranks}, {workers} workers each), but got ranks {found}.")
    readers(pipeline.build(consumer=Consumer()))  # can this pipeline be re-shared at all? (a clear error if not)
    loader = {LAYOUT_KEY: layout, "finished": False}
    if all(s["root"] is None for s in states):  # saved before the first batch
        return make_state(version=version, settings=settings, root=None, **loader)
    old, held, epochs, ended = _old_consumers(states, policy, workers)
    if len(epochs) != 1:
        raise StateMismatchError(f"elastic resume needs every rank saved in the same epoch, but found epochs {sorted(epochs)}.")
    epoch = epochs.pop()
    rank, new_ranks, new_workers = layout
    slots = max(new_workers, 1)
    mine = [Consumer(rank=rank, world_size=new_ranks, worker=w, num_workers=slots) for w in range(slots)]
    plans = plan(pipeline, [] if ended else old, epoch, mine, new_ranks * slots)
    if new_workers == 0:
        source = plans[0]
    else:
        source = make_state(version=WorkerProcesses.VERSION, settings={"num_workers": new_workers}, epoch=epoch,
                            done=False, dataloader=None, plans=[{"epoch": epoch, "node": p} for p in plans])
    root = source
    if policy != "off":
        mine_held = [] if ended else [b for r, batches in sorted(held.items()) if r % new_ranks == rank for b in batches]
        root = make_state(version=EqualSteps.VERSION, settings={"policy": policy}, source=source, held=mine_held,
                          exhausted=False, stopped=False, fresh=0, steps=0, replaying=False,
                          start=source if policy == "repeat" else None)
    loader["finished"] = ended
    return make_state(version=version, settings=settings, root=root, **loader)


def _old_consumers(states: list[dict[str, Any]], policy: str, workers: int
                   ) -> tuple[list[OldConsumer], dict[int, list], set[int], bool]:
    """The old consumers with their graph states, each rank's read-ahead batches, the epochs, and whether it ended."""
    slots, ranks = max(workers, 1), len(states)
    old, held, epochs = [], {}, set()
    ended = all(s["finished"] for s in states)
    for rank, state in enumerate(states):
        source = state["root"]
        if policy != "off":
            held[rank] = list(source["held"])
            ended = ended or source["stopped"] or source["replaying"]
            source = source["source"]
        graphs = [source] if workers == 0 else _worker_graphs(source, workers, epochs)
        for worker, graph in enumerate(graphs):
            if graph is DONE:
                continue
            if graph is not None and ELASTIC_KEY in graph:
                raise StateMismatchError("this state was saved during an elastic resume's first epoch: resume it on "
                                         "the layout it was saved on until that epoch ends.")
            old.append(OldConsumer(rank * slots + worker, ranks * slots, slots, graph))
            if graph is not None:
                epochs.add(_epoch_of(graph))
    return old, held, epochs, ended


DONE = {"done": True}  # a worker whose share had all come out


def _worker_graphs(state: dict[str, Any], workers: int, epochs: set[int]) -> list[Any]:
    """Each worker's graph state from a ``WorkerProcesses`` state (``DONE``; ``None``: not started)."""
    epochs.add(state["epoch"])
    loader = state["dataloader"]
    if state.get("plans") is not None:
        raise StateMismatchError("this state was saved during an elastic resume's first epoch: resume it on "
                                 "the layout it was saved on until that epoch ends.")
    if state["done"]:
        return [DONE] * workers
    if loader is None:
        return [None] * workers
    snapshot = loader["_snapshot"]
    if loader.get("_steps_since_snapshot", 0):
        raise StateMismatchError("elastic resume needs worker snapshots taken at every step (snapshot_every_n_steps=1).")
    out = []
    for w in range(workers):
        worker = snapshot["_worker_snapshots"].get(f"worker_{w}") or {}
        iterator = (worker.get("fetcher_state") or {}).get("dataset_iter_state")
        out.append(None if iterator is None else iterator["node"])
    return out


def _epoch_of(graph: dict[str, Any]) -> int:
    """The epoch of a graph state (its first reader's)."""
    node = graph
    while isinstance(node, dict) and "unit" not in node:
        inner = node.get("source")
        node = next(iter(inner.values())) if isinstance(inner, dict) and "version" not in inner else inner
    if not isinstance(node, dict):
        raise StateMismatchError("elastic resume found no reader position in a saved state.")
    return int(node["epoch"])
