"""What a :class:`~padpipe.pipeline.Pipeline` does when it runs: build its graph, make its loader, iterate.

The recipe (:mod:`padpipe.pipeline`) holds the stages; this mixin holds the running side, so each
file reads at once. Methods here only read the recipe's fields.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any, Literal, Self, cast

from torchdata.nodes import BaseNode

from padpipe._checks import check_fields
from padpipe.drivers import check_iteration
from padpipe.errors import one_of
from padpipe.loader import PipelineLoader
from padpipe.runtime.assemble import LoaderOptions
from padpipe.runtime.iterable import PipelineIterator
from padpipe.runtime.latch import FailureLatch
from padpipe.sharing.consumer import Consumer
from padpipe.stage import BuildContext, Recipe, Stage
from padpipe.stats import PipelineStats
from padpipe.token_cache.plan import CachePlan
from padpipe.token_cache.session import CacheSession

# What a pipeline yields so far, in stage order.
RECORDS, TOKENS, TOKEN_BATCHES, TENSORS = "records", "tokens", "token batches", "tensors"


def arguments(names: dict[str, Any]) -> dict[str, Any]:
    """A method's arguments, from its ``locals()`` taken first thing (options named once, in its signature).

    Example:
        >>> arguments({"self": None, "batch_size": 8})
        {'batch_size': 8}
    """
    return {name: value for name, value in names.items() if name != "self"}


class Runnable:
    """The running side of :class:`~padpipe.pipeline.Pipeline` (a mixin: the fields are the recipe's)."""

    source: Stage
    stages: tuple[Stage, ...]
    output: str
    seed: int | None
    sharding: str
    cache: CachePlan | None
    _epoch: list[int]
    _managed: list[bool]

    def _recipe(self) -> Recipe:
        """This object as the recipe it is mixed into (a :class:`~padpipe.pipeline.Pipeline`)."""
        return cast(Recipe, self)

    def build(self, *, consumer: Consumer | None = None, stats: PipelineStats | None = None) -> BaseNode:
        """Build a fresh node graph (advanced: most users call :meth:`loader`)."""
        if consumer is None and self.sharding == "off":
            consumer = Consumer.detect(ranks=False)
        pad = next((s.options for s in self.stages if s.name == "pad"), {})
        sizes = {key: pad.get(key) for key in ("pad_to_multiple_of", "pad_to_length")}  # for the bucket stage
        stats = stats or PipelineStats()
        cache = None if self.cache is None else CacheSession(self.cache, stats)  # one per built graph
        context = BuildContext(stats=stats, consumer=consumer, seed=self.seed, cache=cache, **sizes)
        node = self.source.builder(None, context, **self.source.options)
        for stage in self.stages:
            node = stage.builder(node, context, **stage.options)
        return FailureLatch(node)  # after an error, the same error again until reset (never a silent skip)

    def loader(
        self,
        num_workers: int = 0,
        *,
        consumer: Consumer | None = None,
        equal_steps: Literal["balance", "repeat", "drop", "off"] = "balance",
        pin_memory: bool = False,
        prefetch_factor: int | None = None,
        multiprocessing_context: Any = None,
        timeout: float = 0,
        accumulation_steps: int | None = None,
        causal: bool = True,
        group: Any = None,
    ) -> PipelineLoader:
        """The loader to iterate: one pass per epoch, in this process or in ``num_workers`` processes.

        Supports ``state_dict()``/``load_state_dict()`` for exact mid-epoch resume (see
        :class:`~padpipe.loader.PipelineLoader`) and ``stats()``. Each ``iter(loader)`` is the next
        epoch. With ``num_workers > 0`` the stages run in that many DataLoader worker processes, started
        for each epoch by this process, their batches in a fixed round-robin order (a trailing
        ``to_cuda``/``prefetch`` stage runs here). Under ``torch.distributed`` every rank takes the same
        number of steps per epoch (DDP hangs when one stops early), at the cost of one tiny all-gather
        per step in this process.

        Args:
            num_workers: Worker processes; ``0`` runs the stages here (tokenizing in threads).
            consumer: This reader's rank slot (default: detected from ``torch.distributed``).
            equal_steps: ``"balance"``: batches are moved and the epoch's last ones split, so every
                rank ends at the same step with every row once (a batch marked ``"is_filler"``, to
                weigh by :func:`padpipe.loss_weight`, only where no real piece is left for a rank);
                ``"repeat"``: ranks that ran out replay their epoch's first batches, marked
                ``"is_repeat"``; ``"drop"``: all ranks stop when the first runs out (the rest counted
                as ``equal_steps.dropped_batches``); ``"off"``: unequal (docs/distributed.md).
            pin_memory: Pin worker batches in page-locked memory (``num_workers > 0``).
            prefetch_factor: Batches each worker prepares ahead (``num_workers > 0``; default 2).
            multiprocessing_context: ``"fork"``, ``"spawn"``, ``"forkserver"`` or a context.
            timeout: Seconds to wait for a worker's batch before raising (0: no limit).
            accumulation_steps: Batches per optimizer step: every batch gets ``num_items_in_batch``
                (a 0-d ``int64`` tensor), the label tokens of its step's window of that many batches
                summed over all ranks, as HF ``Trainer`` counts them: divide a summed loss by it
                (docs/training.md). ``None``: no count.
            causal: With ``accumulation_steps``, count ``labels[..., 1:]`` as for a causal-LM
                loss (the default); ``False``: every label (masked LM, classification).
            group: The data-parallel process group: its ranks share the data, take equal steps and
                sum loss tokens, and :meth:`PipelineLoader.checkpoint` gathers over it (``None``: the
                world); the tensor- and pipeline-parallel peers of one data-parallel rank read the same
                batches.

        Raises:
            ValueError: The pipeline ends after ``.tokenize()``, ``.batch()`` or ``.bucket()``
                (internal token chunks): add ``.pad()`` or ``.pack()``.
            DataError: A reader's ``columns`` or tokenize's ``fields`` is not in the data, where
                that is cheap to know.

        Example:
            >>> pipe = pp.from_iterable([{"text": "a"}]).tokenize(pp.examples.tokenizer()).batch(1).pad()
            >>> loader = pipe.loader(); n = sum(1 for _ in loader); loader.stats().rows
            1
        """
        self._check_runnable()
        return PipelineLoader(self._recipe(), LoaderOptions(**arguments(locals())))  # the arguments are its fields

    def shard(self, mode: Literal["auto", "off"] = "auto") -> Self:
        """Whether distributed ranks split the data (``"auto"``) or each reads all of it (``"off"``).

        ``"off"`` is for frameworks that shard or dispatch batches themselves (e.g. Accelerate's
        ``dispatch_batches``): every rank then reads the whole epoch, and DataLoader workers of one
        rank still split it between them, so no row is read twice by one rank.

        Example:
            >>> pp.from_iterable([{"text": "a"}]).shard("off").sharding
            'off'
        """
        one_of("mode", mode, ("auto", "off"))
        return cast(Self, dataclasses.replace(self._recipe(), sharding=mode, _epoch=[0], _managed=[False]))

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch the next ``iter(pipe)`` reads (``IterableDataset`` use, as in HF datasets).

        Each ``iter(pipe)`` then moves on by itself; loaders count their own epochs.

        Example:
            >>> pipe.set_epoch(3)  # doctest: +SKIP
        """
        self._epoch[0] = epoch

    def note_equal_steps(self) -> None:
        """Note that :func:`padpipe.equal_steps` keeps the ranks' steps equal over this pipeline.

        Called by ``pp.equal_steps(DataLoader(pipe, ...))``, before the workers start: their copies
        of the pipeline then don't warn that ranks may take unequal steps.

        Example:
            >>> pipe = pp.from_iterable([{"text": "a"}]).tokenize(pp.examples.tokenizer()).batch(1).pad()
            >>> pipe.note_equal_steps()
        """
        self._managed[0] = True

    def __iter__(self) -> Iterator[Any]:
        """Read one epoch as this process's share (rank x DataLoader worker).

        ``StatefulDataLoader`` saves and restores the iterator in every worker. Each ``iter(pipe)``
        reads the next epoch; non-persistent workers start from the main process's epoch, so call
        :meth:`set_epoch` each epoch (as with ``DistributedSampler``).
        """
        self._check_runnable()
        # fails under a DataLoader that batches again and wrappers that shard again (Accelerate), warns for a
        # bare Lightning resume
        check_iteration(self, batches=self.output == TENSORS)
        return PipelineIterator(self._recipe(), self._epoch[0], managed=self._managed[0])

    def _check_runnable(self) -> None:
        """Fail before reading when the pipeline ends in internal token chunks or names a missing column."""
        if self.output in (TOKENS, TOKEN_BATCHES):
            add = ".pad()" if self.output == TOKEN_BATCHES else ".batch(n).pad(), .bucket(...).pad() or .pack(seq_len)"
            raise ValueError(
                f"This pipeline ends in {self.output} (padpipe's internal TokenChunk objects): add {add} "
                "to get batches of tensors."
            )
        check_fields(self._recipe())
