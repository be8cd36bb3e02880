"""Assemble a pipeline's loader from its :class:`LoaderOptions`: the stages in this process or in worker processes,
equal steps, loss-token windows, and how its state is saved and re-shared (for :class:`~padpipe.loader.PipelineLoader`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
from torchdata.nodes import BaseNode

from padpipe.errors import check_bool, non_negative, one_of, positive
from padpipe.graph import LayerRecord
from padpipe.pipes.device import DevicePrefetcher
from padpipe.runtime.consumer_graph import ConsumerGraph
from padpipe.runtime.elastic import loader_state
from padpipe.runtime.equal_steps import EqualSteps
from padpipe.runtime.latch import FailureLatch
from padpipe.runtime.lockstep import POLICIES
from padpipe.runtime.loss_tokens import LossTokens
from padpipe.runtime.workers import WorkerProcesses
from padpipe.sharing.consumer import Consumer
from padpipe.sharing.ranks import ranks
from padpipe.stage import DEVICE_STAGES, BuildContext, Recipe
from padpipe.stats import PipelineStats

DATALOADER_KEYS = ("pin_memory", "prefetch_factor", "multiprocessing_context", "timeout")
"""The options that go to the worker processes' ``StatefulDataLoader`` as they are."""


@dataclass(frozen=True)
class LoaderOptions:
    """How a loader runs its pipeline: :meth:`padpipe.Pipeline.loader`'s arguments (see it for each), checked here.

    Example:
        >>> LoaderOptions(num_workers=2, accumulation_steps=4).settings()
        {'equal_steps': 'balance', 'accumulation_steps': 4}
        >>> LoaderOptions(pin_memory=True)
        Traceback (most recent call last):
        ...
        ValueError: `pin_memory`, `prefetch_factor` and `timeout` need `num_workers` > 0.
    """

    num_workers: int = 0
    consumer: Consumer | None = None
    equal_steps: str = "balance"
    pin_memory: bool = False
    prefetch_factor: int | None = None
    multiprocessing_context: Any = None
    timeout: float = 0
    accumulation_steps: int | None = None
    causal: bool = True
    group: Any = None

    def __post_init__(self) -> None:
        one_of("equal_steps", self.equal_steps, POLICIES)
        positive("accumulation_steps", self.accumulation_steps, allow_none=True)
        check_bool("causal", self.causal)
        if self.accumulation_steps is None and not self.causal:
            raise ValueError(
                "`causal=False` says how `accumulation_steps` counts loss tokens, but `accumulation_steps` is None: "
                "set it too."
            )
        non_negative("num_workers", self.num_workers)
        if self.num_workers == 0 and (self.pin_memory or self.prefetch_factor is not None or self.timeout):
            raise ValueError("`pin_memory`, `prefetch_factor` and `timeout` need `num_workers` > 0.")

    def dataloader(self) -> dict[str, Any]:
        """The worker processes' further ``StatefulDataLoader`` keywords (those not ``None``)."""
        return {key: value for key in DATALOADER_KEYS if (value := getattr(self, key)) is not None}

    def settings(self) -> dict[str, Any]:
        """What a loaded state must match (the layout, ranks and workers, is checked apart: it may change)."""
        steps = self.accumulation_steps
        return {"equal_steps": self.equal_steps, **({} if steps is None else {"accumulation_steps": steps})}


@dataclass(frozen=True)
class Assembly:
    """What a :class:`~padpipe.loader.PipelineLoader` runs: its ``root`` node and ``stats``, the ``device`` of its
    batches (a ``to_cuda`` stage's), the recipe its ``graph`` s run (without a trailing ``prefetch``/``to_cuda``),
    the ``consumer`` it reads as (``None``: detected) and the ``layers`` built above the graphs, top first."""

    root: BaseNode
    stats: PipelineStats
    device: torch.device | None
    graph: Recipe
    options: LoaderOptions
    consumer: Consumer | None
    layers: tuple[LayerRecord, ...]

    def layout(self) -> list[int]:
        """This run's ``[rank, ranks, workers]``, read when a state is saved."""
        if self.consumer is not None:
            rank, size = self.consumer.rank, self.consumer.world_size
        else:
            rank, size = ranks() if self.graph.sharding == "auto" else (0, 1)
        return [rank, size, self.options.num_workers]

    def reshare(
        self, states: list[dict[str, Any]], layout: list[int], carried: dict[str, Any], ahead: dict[int, list[Any]]
    ) -> dict[str, Any]:
        """This run's state from every saved rank's (elastic resume), given the loader fields carried over and the
        batches each saved rank had fetched ahead."""
        settings = self.options.settings()
        return loader_state(
            states,
            pipeline=self.graph,
            layers=self.layers,
            layout=layout,
            settings=settings,
            fields=carried,
            ahead=ahead,
        )


def assemble(pipe: Recipe, options: LoaderOptions) -> Assembly:
    """The :class:`Assembly` of ``pipe``'s loader.

    Example:
        >>> pipe = pp.from_iterable([{"text": "a"}]).tokenize(pp.examples.tokenizer()).batch(1).pad()
        >>> type(assemble(pipe, LoaderOptions(equal_steps="off")).root).__name__
        'ConsumerGraph'
    """
    stats, consumer, policy, steps = PipelineStats(), options.consumer, options.equal_steps, options.accumulation_steps
    if options.group is not None and consumer is None and pipe.sharding == "auto":  # the group's ranks share the data
        rank, size = ranks(options.group)
        consumer = Consumer(rank=rank, world_size=size)
    last = pipe.stages[-1] if pipe.stages and pipe.stages[-1].name in DEVICE_STAGES else None
    graph = dataclasses.replace(pipe, stages=pipe.stages[:-1]) if last is not None else pipe
    device = last.options["device"] if last is not None and last.name == "to_cuda" else None
    if options.num_workers == 0:
        if consumer is None and pipe.sharding == "off":
            consumer = Consumer.detect(ranks=False)
        root: BaseNode = ConsumerGraph(graph, consumer, stats)
    else:
        root = WorkerProcesses(
            graph,
            num_workers=options.num_workers,
            consumer=consumer,
            ranks=pipe.sharding == "auto",
            options=options.dataloader(),
            stats=stats,
        )
    stack: list[LayerRecord] = []  # the layers above the graphs, bottom first
    if last is not None:  # a trailing prefetch / to_cuda runs in this process, on top of the graph or the workers
        context = BuildContext(stats, consumer, seed=pipe.seed, pad_to_multiple_of=None, pad_to_length=None)
        root = FailureLatch(last.builder(root, context, **last.options))  # its failures stay failures too
        stack.append(LayerRecord(DevicePrefetcher, {}))
    if policy != "off":
        root = EqualSteps(root, policy=policy, stats=stats, group=options.group, device=device)
        stack.append(LayerRecord(EqualSteps, {"policy": policy}))
    if steps is not None:  # on top, so that every rank's windows hold the same (equal) steps
        root = LossTokens(
            root,
            steps=steps,
            causal=options.causal,
            across_ranks=pipe.sharding == "auto",
            lockstep=policy != "off",
            group=options.group,
            device=device,
        )
        stack.append(LayerRecord(LossTokens, root.settings))
    return Assembly(root, stats, device, graph, options, consumer, tuple(reversed(stack)))
