"""The loader users iterate: ``torchdata.nodes.Loader`` plus the pipeline's stats."""

from __future__ import annotations

from typing import Any, TypeVar

from torchdata.nodes import BaseNode, Loader

from padpipe.stats import PipelineStats, StatsSnapshot

T = TypeVar("T")


class PipelineLoader(Loader[T]):
    """Iterable over a built pipeline, one pass per epoch, resumable mid-epoch.

    ``state_dict()`` at any step and ``load_state_dict()`` on a loader of the same pipeline (in
    this process or a new one) continue with exactly the batches that would have come next. A state
    saved after the last batch of an epoch resumes at the start of the next epoch.

    Args:
        root: The built node graph.
        stats: The counters its stages report into.

    Example:
        >>> loader = pipe.loader()  # doctest: +SKIP
        >>> for batch in loader: ...  # doctest: +SKIP
        >>> loader.stats().padding_efficiency  # doctest: +SKIP
        0.97
    """

    def __init__(self, root: BaseNode[T], stats: PipelineStats) -> None:
        super().__init__(root, restart_on_stop_iteration=True)
        self._stats = stats

    def stats(self) -> StatsSnapshot:
        """Rows, real and padded tokens, padding efficiency, skipped rows and time per stage so far."""
        return self._stats.snapshot()

    def state_dict(self) -> dict[str, Any]:
        """The position after the last batch this loader returned (see class docs)."""
        return super().state_dict()
