"""What a recipe is made of: its :class:`Stage` s, and the :class:`BuildContext` their builders get.

Below the stages and the runtime, so both can read a recipe without importing the builders
(``padpipe._build``), which only the facade uses.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

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
    cache: Any = None  # the token cache session (padpipe.token_cache.session) when tokenize has a cache
