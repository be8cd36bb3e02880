"""Assemble a pipeline's loader: the stages in this process or in worker processes, equal steps, resume.

:meth:`padpipe.Pipeline.loader` calls :func:`assemble` and hands the :class:`Assembly` to
:class:`~padpipe.loader.PipelineLoader`; this module holds what it puts together so the facade stays
a list of stages (and the runtime never imports the face).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torchdata.nodes import BaseNode

from padpipe.errors import check_bool, positive
from padpipe.graph import LayerRecord
from padpipe.pipes.device import DevicePrefetcher
from padpipe.runtime.consumer_graph import ConsumerGraph
from padpipe.runtime.elastic import loader_state
from padpipe.runtime.equal_steps import EqualSteps
from padpipe.runtime.latch import FailureLatch
from padpipe.runtime.lockstep import check_policy
from padpipe.runtime.loss_tokens import LossTokens
from padpipe.runtime.workers import WorkerProcesses
from padpipe.sharing.consumer import Consumer
from padpipe.sharing.ranks import ranks
from padpipe.stage import DEVICE_STAGES, BuildContext, Recipe
from padpipe.stats import PipelineStats


@dataclass(frozen=True)
class Assembly:
    """What a :class:`~padpipe.loader.PipelineLoader` runs: the built graph and how it saves and re-shares.

    Attributes:
        root: The top node (equal steps, a trailing prefetch, worker processes or the consumer's graph).
        stats: The counters its stages report into.
        settings: What a loaded state must match.
        layout: This run's ``[rank, ranks, workers]``, read when a state is saved.
        reshare: Builds this run's state from every saved rank's (elastic resume), given those
            states, this layout, the loader fields carried over and the batches fetched ahead.
        device: The device of its batches (a ``to_cuda`` stage's) or ``None``.
        group: The process group whose ranks share the data and take equal steps (``None``: the world).
        layers: The stack it built above the graphs, top first (what the elastic planner folds over).
    """

    root: BaseNode
    stats: PipelineStats
    settings: dict[str, Any]
    layout: Callable[[], list[int]]
    reshare: Callable[..., dict[str, Any]]
    device: torch.device | None
    group: Any = None
    layers: tuple[LayerRecord, ...] = ()


def assemble(
    pipe: Recipe,
    *,
    num_workers: int,
    consumer: Consumer | None,
    equal_steps: str,
    options: dict[str, Any],
    accumulation_steps: int | None = None,
    causal: bool = True,
    group: Any = None,
) -> Assembly:
    """The :class:`Assembly` of ``pipe``'s loader (arguments as :meth:`Pipeline.loader`'s).

    Example:
        >>> pipe = pp.from_iterable([{"text": "a"}]).tokenize(pp.examples.tokenizer()).batch(1).pad()
        >>> type(assemble(pipe, num_workers=0, consumer=None, equal_steps="off", options={}).root).__name__
        'ConsumerGraph'
    """
    check_policy("equal_steps", equal_steps)
    positive("accumulation_steps", accumulation_steps, allow_none=True)
    check_bool("causal", causal)
    if accumulation_steps is None and not causal:
        raise ValueError(
            "`causal=False` says how `accumulation_steps` counts loss tokens, but `accumulation_steps` is None: "
            "set it too."
        )
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
        raise ValueError(f"`num_workers` must be an int >= 0, but is {num_workers!r} instead.")
    if num_workers == 0 and (
        options.get("pin_memory") or options.get("prefetch_factor") is not None or options.get("timeout")
    ):
        raise ValueError("`pin_memory`, `prefetch_factor` and `timeout` need `num_workers` > 0.")
    stats = PipelineStats()
    if group is not None and consumer is None and pipe.sharding == "auto":  # the group's ranks share the data
        rank, size = ranks(group)
        consumer = Consumer(rank=rank, world_size=size)
    graph_pipe, last = _split_last(pipe)
    device = last.options["device"] if last is not None and last.name == "to_cuda" else None
    if num_workers == 0:
        if consumer is None and pipe.sharding == "off":
            consumer = Consumer.detect(ranks=False)
        root: BaseNode = ConsumerGraph(graph_pipe, consumer, stats)
    else:
        root = WorkerProcesses(
            graph_pipe,
            num_workers=num_workers,
            consumer=consumer,
            ranks=pipe.sharding == "auto",
            options={k: v for k, v in options.items() if v is not None},
            stats=stats,
        )
    stack: list[LayerRecord] = []  # the layers above the graphs, bottom first
    if last is not None:  # a trailing prefetch / to_cuda runs in this process, on top of the graph or the workers
        context = BuildContext(
            stats=stats, consumer=consumer, seed=pipe.seed, pad_to_multiple_of=None, pad_to_length=None
        )
        root = FailureLatch(last.builder(root, context, **last.options))  # its failures stay failures too
        stack.append(LayerRecord(DevicePrefetcher, {}))
    if equal_steps != "off":
        root = EqualSteps(root, policy=equal_steps, stats=stats, group=group, device=device)
        stack.append(LayerRecord(EqualSteps, {"policy": equal_steps}))
    settings: dict[str, Any] = {
        "equal_steps": equal_steps
    }  # the layout (ranks, workers) is checked apart: it may change
    if accumulation_steps is not None:  # on top, so that every rank's windows hold the same (equal) steps
        stack.append(LayerRecord(LossTokens, {"steps": accumulation_steps, "causal": causal}))
        root = LossTokens(
            root,
            steps=accumulation_steps,
            causal=causal,
            across_ranks=pipe.sharding == "auto",
            lockstep=equal_steps != "off",
            group=group,
            device=device,
        )
        settings["accumulation_steps"] = accumulation_steps

    def layout() -> list[int]:
        rank, ranks = (
            (consumer.rank, consumer.world_size)
            if consumer is not None
            else (Consumer.ranks() if pipe.sharding == "auto" else (0, 1))
        )
        return [rank, ranks, num_workers]

    def reshare(
        states: list[dict[str, Any]],
        mine: list[int],
        carried: dict[str, Any],
        ahead: dict[int, list[Any]],
    ) -> dict[str, Any]:
        return loader_state(
            states, pipeline=graph_pipe, layers=layers, layout=mine, settings=settings, fields=carried, ahead=ahead
        )

    layers = tuple(reversed(stack))
    return Assembly(root, stats, settings, layout, reshare, device, group, layers)


def _split_last(pipe: Recipe) -> tuple[Recipe, Any]:
    """``pipe`` without a trailing ``prefetch``/``to_cuda`` stage, and that stage (or ``None``)."""
    last = pipe.stages[-1] if pipe.stages and pipe.stages[-1].name in DEVICE_STAGES else None
    return (dataclasses.replace(pipe, stages=pipe.stages[:-1]), last) if last is not None else (pipe, None)
