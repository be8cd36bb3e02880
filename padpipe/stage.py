"""What a recipe is made of: its :class:`Stage` s, the :class:`BuildContext` their builders get, and
:class:`Recipe`, what the runtime and the checks read of a recipe (below them, so they import nothing above).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from torchdata.nodes import BaseNode

from padpipe.sharing.consumer import Consumer
from padpipe.stats import PipelineStats

DEVICE_STAGES = ("prefetch", "to_cuda")
"""The stages that end a recipe in the main process (a thread that prefetches, onto a device or not)."""


@dataclass(frozen=True)
class Stage:
    """One step of a recipe: ``builder(upstream, context, **options)`` makes its node."""

    name: str
    builder: Callable[..., BaseNode]
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class BuildContext:
    """What stages learn from the whole recipe when the graph is built."""

    stats: PipelineStats
    consumer: Consumer | None
    seed: int | None
    pad_to_multiple_of: int | None
    pad_to_length: int | None
    cache: Any = None  # the recipe's token cache session (padpipe.token_cache.session), for the stages it serves


class Recipe(Protocol):
    """A recipe as the runtime reads it: its stages, settings, a fresh graph and the epoch of ``iter(pipe)``.

    :class:`padpipe.Pipeline` is the one recipe, a frozen dataclass (``dataclasses.replace`` makes a changed copy).

    Example:
        >>> pipe = pp.from_iterable([{"text": "a"}]).tokenize(pp.examples.tokenizer())
        >>> recipe: Recipe = pipe; recipe.source.name, [s.name for s in recipe.stages], recipe.sharding
        ('from_iterable', ['tokenize'], 'auto')
    """

    __dataclass_fields__: ClassVar[dict[str, Any]]

    @property
    def source(self) -> Stage: ...  # the reader's stage

    @property
    def stages(self) -> tuple[Stage, ...]: ...  # the stages after it, in order

    @property
    def output(self) -> str: ...  # what it yields so far: records, tokens, token batches or tensors

    @property
    def seed(self) -> int | None: ...

    @property
    def sharding(self) -> str: ...  # "auto": shared by ranks and workers; "off": every process reads it all

    def build(self, *, consumer: Consumer | None = None, stats: PipelineStats | None = None) -> BaseNode:
        """A fresh node graph of the recipe, read as ``consumer``."""
        ...

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch the next ``iter(pipe)`` reads."""
        ...
