"""``iter(pipeline)``: one epoch of this process's share, resumable under ``StatefulDataLoader``."""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Iterator
from typing import Any

from torchdata.nodes import BaseNode

from padpipe.graph import start_at_epoch
from padpipe.runtime.consumer_graph import ConsumerGraph
from padpipe.sharing.consumer import Consumer
from padpipe.stage import Recipe
from padpipe.stats import PipelineStats

EPOCH_KEY = "epoch"
NODE_KEY = "node"
STATS_KEY = "stats"


class PipelineIterator(Iterator[Any]):
    """One epoch of a pipeline for this process (rank x DataLoader worker), ``Stateful`` for ``StatefulDataLoader``.

    A state saved after this consumer's last item of an epoch yields nothing more (as the uninterrupted run
    did); the next ``iter(pipe)`` reads the next epoch.

    Args:
        pipeline: The recipe to build.
        epoch: The epoch to read unless a state is loaded.
        consumer: The rank to read as (the worker slot is this process's); default: detected.
        managed: Whether the caller keeps step counts equal across ranks; if not, several ranks warn.
        report_stats: Put this consumer's counters into every ``state_dict()``, for the main process.
    """

    def __init__(
        self,
        pipeline: Recipe,
        epoch: int,
        *,
        consumer: Consumer | None = None,
        managed: bool = False,
        report_stats: bool = False,
    ) -> None:
        self._pipeline, self._epoch, self._consumer, self._managed = pipeline, epoch, consumer, managed
        self._stats, self._report_stats = PipelineStats(), report_stats
        self._node: BaseNode | None = None
        self._pending: dict[str, Any] | None = None
        self._yielded = 0

    def _start(self) -> BaseNode:
        if self._consumer is not None:
            consumer = self._consumer.with_worker()
        else:
            consumer = Consumer.detect(ranks=self._pipeline.sharding == "auto")
        if not self._managed:
            warn_unequal_steps(consumer)

        node = ConsumerGraph(self._pipeline, consumer, self._stats)
        if self._pending is not None:
            self._epoch = self._pending[EPOCH_KEY]
            node.reset(self._pending[NODE_KEY])
            self._pending = None
        else:
            start_at_epoch(node, self._epoch)
            node.reset(None)
        self._pipeline.set_epoch(self._epoch + 1)
        self._node = node
        return node

    def __next__(self) -> Any:
        node = self._node if self._node is not None else self._start()
        item = next(node)  # a state saved at the end of this consumer's share ends here too
        self._yielded += 1
        return item

    def state_dict(self) -> dict[str, Any]:
        """The position after the last item returned (epoch and node state; with ``report_stats``, the counters)."""
        node = self._node if self._node is not None else self._start()
        state = {EPOCH_KEY: self._epoch, NODE_KEY: node.state_dict()}
        if self._report_stats:  # how worker processes report their counters to the main process
            state[STATS_KEY] = dataclasses.asdict(self._stats.snapshot())
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from ``state`` at the first ``next()``; must come before any item is read."""
        if self._yielded:
            raise RuntimeError("load_state_dict() must be called before the iterator yields anything.")
        self._pending = dict(state)
        self._node = None


UNEQUAL_STEPS = (
    "padpipe: this pipeline is read through a plain DataLoader (or iter(pipe)) by {world} distributed ranks. "
    "Ranks get different numbers of batches (token budgets, packing, uneven tails), and DDP hangs at the end "
    "of an epoch when one rank stops while the others wait in a collective. Use `pipe.loader(num_workers=N)` "
    "(equal steps built in), or iterate `pp.equal_steps(dataloader)`."
)


def warn_unequal_steps(consumer: Consumer) -> None:
    """Warn once (rank 0, first worker) that a plain ``DataLoader`` over several ranks can hang DDP."""
    if consumer.world_size > 1 and consumer.rank == 0 and consumer.worker == 0:
        warnings.warn(UNEQUAL_STEPS.format(world=consumer.world_size), RuntimeWarning, stacklevel=3)
