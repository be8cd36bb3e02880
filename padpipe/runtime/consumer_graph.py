"""The top node of every consumer's graph, and the walk to a graph's readers.

:class:`ConsumerGraph` passes a normal run through unchanged; given an elastic plan
(:mod:`padpipe.runtime.elastic`), it yields the plan's batches first, then its share of the unread pieces, and
its state holds both, so it resumes exactly on any layout.
"""

from __future__ import annotations

from typing import Any

from torchdata.nodes import BaseNode

from padpipe.graph import start_at_epoch
from padpipe.pipes.mix import WeightedMixer
from padpipe.readers.source import UnitSource, WorkUnit
from padpipe.runtime.held import SPEC, Held
from padpipe.runtime.latch import FailureLatch
from padpipe.sharing.consumer import Consumer
from padpipe.stage import Recipe
from padpipe.state import Child, Int, ListOf, Loaded, Optional, Plain, StateMismatchError, StateSchema
from padpipe.stats import PipelineStats

PLAN = StateSchema(
    "ConsumerGraph elastic plan",
    1,
    epoch=Int(0),  # the elastic epoch
    batches=SPEC,  # the plan's batches not yet given out
    pieces=ListOf(ListOf(Plain())),  # per reader, the pieces (WorkUnit fields) it reads after them
    fresh=Optional(Child()),  # the graph's state once it started reading the pieces
)
"""What a consumer of an elastic epoch does: yield ``batches``, then read ``pieces`` in ``epoch``."""


def readers(node: Any, state: Any = None) -> list[tuple[UnitSource, Any]]:
    """The graph's readers in a fixed order, each with its part of ``state`` (the graph's state) if given.

    Raises:
        StateMismatchError: For a reader that cannot be re-shared (``from_iterable``, a streaming
            ``IterableDataset``) or a mix that does not read every row once (``stop`` other than
            ``"all_exhausted"``).

    Example:
        >>> [type(r).__name__ for r, _ in readers(pp.read_parquet(pp.examples.SAMPLE_PARQUET).build())]
        ['ParquetReader']
    """

    if isinstance(node, FailureLatch):
        return readers(node.source, state)
    if isinstance(node, UnitSource):
        return [(node, state)]
    if isinstance(node, WeightedMixer):
        if node.stop != "all_exhausted":
            raise StateMismatchError(
                f"elastic resume needs a mix that reads every row once (stop='all_exhausted'), "
                f"but this one has stop={node.stop!r}."
            )
        parts = state["source"] if state is not None else {}
        return [r for name, child in node.source_nodes.items() for r in readers(child, parts.get(name))]
    child = getattr(node, "source", None)
    if not isinstance(child, BaseNode):
        raise StateMismatchError(
            f"elastic resume cannot re-share a {type(node).__name__}: it has no work units to hand to other "
            "consumers (pp.from_iterable and streaming IterableDatasets resume only on the layout they were saved on)."
        )
    return readers(child, state["source"] if state is not None else None)


def override_readers(graph: BaseNode, epoch: int, pieces: list[list[dict[str, Any]]]) -> list[UnitSource]:
    """Make each reader of ``graph`` read ``pieces[k]`` (plain ``WorkUnit`` fields) in ``epoch``; the readers."""
    mine = [reader for reader, _ in readers(graph)]
    if len(mine) != len(pieces):
        raise StateMismatchError(
            f"ConsumerGraph state is invalid: the plan has pieces for {len(pieces)} readers, "
            f"but this pipeline has {len(mine)}."
        )
    for reader, part in zip(mine, pieces):
        reader.plan.override(epoch, [WorkUnit(**p) for p in part])
    return mine


class ConsumerGraph(BaseNode[Any]):
    """One consumer's graph; states pass through unchanged, except an elastic plan (see the module docs).

    Args:
        pipeline: The recipe (without a trailing ``prefetch``/``to_cuda`` stage, which runs above it).
        consumer: This consumer's slot.
        stats: Counters to report into.

    Example:
        >>> pipe = pp.from_iterable([{"text": "a"}]).tokenize(pp.examples.tokenizer()).batch(1).pad()
        >>> node = ConsumerGraph(pipe, Consumer(), PipelineStats()); node.reset()
        >>> [b["input_ids"].tolist() for b in node]
        [[[2, 81, 3]]]
    """

    STATE = StateSchema("ConsumerGraph", 3, elastic=Child())  # only in an elastic epoch: else the graph's own state

    def __init__(self, pipeline: Recipe, consumer: Consumer | None, stats: PipelineStats) -> None:
        super().__init__()
        self.pipeline, self.consumer, self.stats = pipeline, consumer, stats
        self.source = pipeline.build(consumer=consumer, stats=stats)
        self._plan: Loaded | None = None  # the elastic epoch and pieces (a checked PLAN), while in that epoch
        self._batches = Held()  # the plan's batches not yet given out (on the CPU: the graph is below to_cuda)

    @staticmethod
    def planned(
        epoch: int, batches: list[Any], pieces: list[list[dict[str, Any]]], fresh: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """The state of a consumer that yields ``batches``, then reads ``pieces`` (per reader) in ``epoch``."""
        plan = PLAN.make({}, epoch=epoch, batches=list(batches), pieces=pieces, fresh=fresh)
        return ConsumerGraph.STATE.make({}, elastic=plan)

    @staticmethod
    def plan_of(state: dict[str, Any]) -> Loaded | None:
        """The elastic plan of a state, checked (:data:`PLAN`); ``None``: the state is the graph's own."""
        if not isinstance(state, dict) or "elastic" not in state:
            return None
        return PLAN.check(ConsumerGraph.STATE.check(state, {}).elastic, {})

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        super().reset(initial_state)
        self._plan = None
        self._batches.clear()
        plan = None if initial_state is None else self.plan_of(initial_state)
        if plan is None:
            self.source.reset(initial_state)
            return
        override_readers(self.source, plan.epoch, plan.pieces)
        self._plan = plan
        self._batches.restore(plan.batches)
        if plan.fresh is None:
            start_at_epoch(self.source, plan.epoch)
        self.source.reset(plan.fresh)

    def next(self) -> Any:
        if self._batches:
            return self._batches.pop(0)
        return next(self.source)

    def get_state(self) -> dict[str, Any]:
        if self._plan is None:
            return self.source.state_dict()
        return self.planned(self._plan.epoch, self._batches.saved(), self._plan.pieces, self.source.state_dict())
