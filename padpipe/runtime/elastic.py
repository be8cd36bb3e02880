"""Elastic resume: the rest of an epoch saved on ``R x W`` consumers, re-shared over ``R' x W'`` (docs/elastic.md).

Each old consumer's graph is restored with its readers told to read nothing new
(:meth:`UnitSource.stop_on_load`), so its buffers drain into batches, dealt round-robin over the new consumers;
the pieces no consumer had read are shared again in equal stretches. Every new rank makes the same plan.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from padpipe.graph import LayerRecord
from padpipe.runtime.batch_cut import rows_of, split_batch
from padpipe.runtime.consumer_graph import ConsumerGraph, override_readers, readers
from padpipe.runtime.loader_state import LOADER_STATE
from padpipe.runtime.workers import WorkerProcesses
from padpipe.sharing.consumer import Consumer
from padpipe.stage import Recipe
from padpipe.state import Int, StateMismatchError, load_value
from padpipe.stats import PipelineStats

if TYPE_CHECKING:
    from padpipe.readers.source import WorkUnit


@dataclass(frozen=True)
class OldConsumer:
    """One consumer of the saved layout: ``index`` of ``count``, ``workers`` per rank, and what it had left: its
    graph's ``state`` (``None``: not started), its ``pieces`` per reader where it followed an elastic plan itself,
    and the ``batches`` it held."""

    index: int
    count: int
    workers: int
    state: dict[str, Any] | None
    pieces: list[list[dict[str, Any]]] | None = None
    batches: tuple[Any, ...] = ()

    def consumer(self) -> Consumer:
        """Its slot, to build its graph as it was."""
        return Consumer(
            rank=self.index // self.workers,
            world_size=self.count // self.workers,
            worker=self.index % self.workers,
            num_workers=self.workers,
        )


def old_consumer(index: int, count: int, workers: int, graph: dict[str, Any] | None) -> tuple[OldConsumer, int | None]:
    """The old consumer of a :class:`ConsumerGraph` state (``None``: not started), and the epoch it was in."""
    plan = None if graph is None else ConsumerGraph.plan_of(graph)
    if plan is None:
        return OldConsumer(index, count, workers, graph), None if graph is None else _epoch_of(graph)
    return OldConsumer(index, count, workers, plan.fresh, plan.pieces, tuple(plan.batches)), plan.epoch


def reshare(
    old: list[OldConsumer],
    *,
    pipeline: Recipe,
    epoch: int,
    rank: int,
    ranks: int,
    workers: int,
    held: Sequence[Any] = (),
) -> list[dict[str, Any]]:
    """The :class:`ConsumerGraph` states of this rank's consumers (one per worker, or one) for the rest of ``epoch``.

    ``old`` are the saved layout's consumers whose graphs may still hold rows (rank-major); ``held`` the batches
    the old ranks held above their graphs, dealt out first; ``workers`` this rank's worker processes (0: none).
    """
    slots = max(workers, 1)
    count = ranks * slots
    batches: list[Any] = list(held)
    probe = [reader for reader, _ in readers(pipeline.build(consumer=Consumer()))]
    rests: list[list[WorkUnit]] = [[] for _ in probe]
    for consumer in old:
        graph = pipeline.build(consumer=consumer.consumer(), stats=PipelineStats())
        mine = (
            override_readers(graph, epoch, consumer.pieces)
            if consumer.pieces is not None
            else [reader for reader, _ in readers(graph)]
        )
        states = [state for _, state in readers(graph, consumer.state)] if consumer.state is not None else None
        for k, reader in enumerate(mine):
            start = {"epoch": epoch, "unit": 0, "row": 0}  # not started: all of its share
            rests[k] += reader.rest_of_epoch(start if states is None else states[k])
        probe = mine  # listed: they measure and cut the pieces
        batches += consumer.batches
        if consumer.state is not None:
            batches += drain(graph, consumer.state)
    batches = even_out(batches, ranks)
    plans = []
    for worker in range(slots):
        index = rank * slots + worker
        dealt = [b for j, b in enumerate(batches) if j % ranks == rank and (j // ranks) % slots == worker]
        pieces = []
        for reader, rest in zip(probe, rests):
            pieces.append([dataclasses.asdict(piece) for piece in reader.plan.share(rest, index, count)])
        plans.append(ConsumerGraph.planned(epoch, dealt, pieces))
    return plans


def drain(graph: Any, state: dict[str, Any]) -> list[Any]:
    """The batches an old consumer's graph still holds: restored from ``state`` with its readers stopped."""
    for reader, _ in readers(graph):
        reader.stop_on_load()
    graph.reset(state)
    return list(graph)


def even_out(batches: list[Any], ranks: int) -> list[Any]:
    """``batches`` with the largest split in two (rows ``[:B//2]``, ``[B//2:]``) until their count divides by ``ranks``.

    Example:
        >>> import torch
        >>> [len(b["x"]) for b in even_out([{"x": torch.arange(4)}, {"x": torch.arange(2)}], 3)]
        [2, 2, 2]
    """
    batches = list(batches)
    while len(batches) % ranks:
        largest = sorted(range(len(batches)), key=lambda i: -(rows_of(batches[i]) or 0))
        cut = next(((i, halves) for i in largest if (halves := split_batch(batches[i])) is not None), None)
        if cut is None:
            return batches  # nothing left to split: equal steps evens out the last ones
        batches[cut[0] : cut[0] + 1] = list(cut[1])
    return batches


def _epoch_of(graph: dict[str, Any]) -> int:
    """The epoch of a graph state (its first reader's)."""
    node: Any = graph
    while isinstance(node, dict) and "unit" not in node:
        inner = node.get("source")
        node = next(iter(inner.values())) if isinstance(inner, dict) and "version" not in inner else inner
    if not isinstance(node, dict):
        raise StateMismatchError("elastic resume found no reader position in a saved state.")
    return load_value("reader", "epoch", node.get("epoch"), Int(0))


def loader_state(
    states: list[dict[str, Any]],
    *,
    pipeline: Recipe,
    layers: tuple[LayerRecord, ...],
    layout: list[int],
    settings: dict[str, Any],
    fields: dict[str, Any],
    ahead: dict[int, list[Any]] | None = None,
) -> dict[str, Any]:
    """A ``PipelineLoader`` state for this loader (``layout``) that continues the epoch of every rank's ``states``.

    Each saved state (checked already, sorted by rank) is split through ``layers``, the stack above the graphs
    (top first: the batches each layer held come out first), and the new state is built back around the new
    graphs, every layer fresh. ``fields`` are the loader's own to carry over; ``ahead`` the batches each old rank
    had fetched and not trained, which come first among that rank's held batches.
    """

    readers(pipeline.build(consumer=Consumer()))  # can this pipeline be re-shared at all? (a clear error if not)
    _, _, workers = states[0]["layout"]
    if all(s["root"] is None for s in states):  # saved before the first batch
        return LOADER_STATE.make(settings, root=None, finished=False, layout=layout, **fields)
    slots, old, carried = max(workers, 1), [], []
    finished = all(s["finished"] for s in states)  # the loop had ended: the next epoch
    drained = False  # the epoch ended on every rank below the batches held above (equal steps had stopped)
    epochs: set[int] = set()
    for rank, state in enumerate(states):
        source, held = state["root"], list((ahead or {}).get(rank, []))
        for layer in layers:
            parts = layer.split(source)
            source, held, drained = parts.source, held + parts.held, drained or parts.ended
        carried += held
        graphs, epoch = ([source], None) if workers == 0 else WorkerProcesses.worker_graphs(source, workers)
        epochs |= set() if epoch is None else {epoch}
        for worker, graph in enumerate(graphs):
            if graph is WorkerProcesses.DONE:
                continue
            consumer, at = old_consumer(rank * slots + worker, len(states) * slots, slots, graph)
            old.append(consumer)
            epochs |= set() if at is None else {at}
    if len(epochs) != 1:
        raise StateMismatchError(
            f"elastic resume needs every rank saved in the same epoch, but found epochs {sorted(epochs)}."
        )
    epoch = epochs.pop()
    rank, ranks, new_workers = layout
    if finished:
        old, carried = [], []
    elif drained:  # nothing is left unread or buffered below: only the batches held above go on
        carried += [b for c in old for b in c.batches]
        old = []
    plans = reshare(old, pipeline=pipeline, epoch=epoch, rank=rank, ranks=ranks, workers=new_workers, held=carried)
    root = plans[0] if new_workers == 0 else WorkerProcesses.planned_state(new_workers, epoch, plans)
    for layer in reversed(layers):
        root = layer.around(root)
    return LOADER_STATE.make(settings, root=root, finished=finished, layout=layout, **fields)
