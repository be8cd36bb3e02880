"""The top node of every consumer's graph, and the walk to a graph's readers.

:class:`ConsumerGraph` passes a normal run through unchanged. Given an elastic plan (the rest of
an epoch saved on another layout, :mod:`padpipe.runtime.elastic`), it yields the batches the plan
gives it first, then its share of the unread pieces, read through its own graph; a state taken
anywhere in that epoch holds both, so it resumes exactly, on this layout or on another one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torchdata.nodes import BaseNode

from padpipe.graph import start_at_epoch
from padpipe.pipes.mix import WeightedMixer
from padpipe.readers.source import UnitSource, WorkUnit
from padpipe.runtime.consumer import Consumer
from padpipe.runtime.latch import FailureLatch
from padpipe.state import Child, Int, ListOf, Optional, Plain, StateMismatchError, check_state, load_value, make_state
from padpipe.stats import PipelineStats

if TYPE_CHECKING:
    from padpipe.pipeline import Pipeline
    from padpipe.readers.source import UnitSource

ELASTIC_KEY = "elastic"
EPOCH, BATCHES, PIECES, FRESH = "epoch", "batches", "pieces", "fresh"


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
        reader.override_epoch(epoch, [WorkUnit(**p) for p in part])
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

    VERSION = 2

    def __init__(self, pipeline: Pipeline, consumer: Consumer | None, stats: PipelineStats) -> None:
        super().__init__()
        self.pipeline, self.consumer, self.stats = pipeline, consumer, stats
        self.source = pipeline.build(consumer=consumer, stats=stats)
        self._plan: dict[str, Any] | None = None  # the elastic epoch and pieces, while in that epoch
        self._batches: list[Any] = []

    @staticmethod
    def planned(
        epoch: int, batches: list[Any], pieces: list[list[dict[str, Any]]], fresh: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """The state of a consumer that yields ``batches``, then reads ``pieces`` (per reader) in ``epoch``."""
        return make_state(
            version=ConsumerGraph.VERSION,
            settings={},
            **{ELASTIC_KEY: {EPOCH: epoch, BATCHES: list(batches), PIECES: pieces, FRESH: fresh}},
        )

    @staticmethod
    def plan_of(state: dict[str, Any]) -> dict[str, Any] | None:
        """The elastic plan of a state (keys ``epoch``, ``batches``, ``pieces``, ``fresh``), checked; ``None``: none."""
        if not isinstance(state, dict) or ELASTIC_KEY not in state:
            return None
        elastic = check_state(
            "ConsumerGraph", state, version=ConsumerGraph.VERSION, settings={}, fields={ELASTIC_KEY: Plain()}
        )[ELASTIC_KEY]
        return _check_plan(elastic)

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        super().reset(initial_state)
        self._plan, self._batches = None, []
        plan = None if initial_state is None else self.plan_of(initial_state)
        if plan is None:
            self.source.reset(initial_state)
            return
        override_readers(self.source, plan[EPOCH], plan[PIECES])
        self._plan, self._batches = {EPOCH: plan[EPOCH], PIECES: plan[PIECES]}, list(plan[BATCHES])
        if plan[FRESH] is None:
            start_at_epoch(self.source, plan[EPOCH])
        self.source.reset(plan[FRESH])

    def next(self) -> Any:
        if self._batches:
            return self._batches.pop(0)
        return next(self.source)

    def get_state(self) -> dict[str, Any]:
        if self._plan is None:
            return self.source.state_dict()
        return self.planned(self._plan[EPOCH], self._batches, self._plan[PIECES], self.source.state_dict())


def _check_plan(elastic: Any) -> dict[str, Any]:
    """The elastic plan of a state, each field checked (``StateMismatchError`` naming the bad one)."""
    stage, keys = "ConsumerGraph", {EPOCH, BATCHES, PIECES, FRESH}
    if not isinstance(elastic, dict) or set(elastic) != keys:
        raise StateMismatchError(
            f"{stage} state is invalid: {ELASTIC_KEY!r} must be an elastic plan with keys {sorted(keys)}."
        )
    load_value(stage, EPOCH, elastic[EPOCH], Int(0))
    load_value(stage, BATCHES, elastic[BATCHES], ListOf(Plain()))
    load_value(stage, PIECES, elastic[PIECES], ListOf(ListOf(Plain())))
    load_value(stage, FRESH, elastic[FRESH], Optional(Child()))
    return dict(elastic)
