"""The fluent facade: an immutable recipe of stages, built into fresh ``torchdata.nodes`` per loader.

Each method checks its arguments at once and returns a new :class:`Pipeline` with one more stage;
nothing is read or tokenized until :meth:`Pipeline.loader` (or iteration) builds the node graph. The
stage methods live with their kind: records to token rows in :mod:`padpipe.token_stages`, token rows
to batches in :mod:`padpipe.batch_stages`; ``shuffle``, the device stages and ``add_stage`` here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.data import IterableDataset
from torchdata.nodes import BaseNode

from padpipe import _build
from padpipe._checks import shuffle_too_late
from padpipe.batch_stages import BatchStages
from padpipe.errors import check_seed, one_of, positive
from padpipe.pipes.device import cuda_device
from padpipe.runnable import RECORDS, TENSORS, TOKEN_BATCHES, TOKENS, Runnable
from padpipe.stage import Stage
from padpipe.token_cache.plan import CachePlan
from padpipe.token_stages import TokenStages


@dataclass(frozen=True, eq=False)
class Pipeline(TokenStages, BatchStages, Runnable, IterableDataset):
    """A reusable recipe: a source and the stages after it.

    Build one with a reader (:func:`padpipe.read_parquet`, :func:`padpipe.read_arrow`,
    :func:`padpipe.read_jsonl`, :func:`padpipe.from_hf`, :func:`padpipe.from_iterable`), chain
    stages, then call :meth:`loader`. Every ``loader()`` call builds fresh, independent state. A
    pipeline is also a ``torch.utils.data.IterableDataset``: under
    ``DataLoader(pipe, batch_size=None, num_workers=N)`` each worker reads its own share.

    Example:
        >>> import padpipe as pp
        >>> pipe = (pp.from_iterable([{"text": "hello world"}, {"text": "hi"}])
        ...           .tokenize(pp.examples.tokenizer(), fields="text")
        ...           .batch(batch_size=2).pad())
        >>> batch = next(iter(pipe.loader()))
        >>> batch["input_ids"].shape, batch["attention_mask"].sum(1).tolist()
        (torch.Size([2, 4]), [4, 4])
    """

    source: Stage
    stages: tuple[Stage, ...] = ()
    output: str = RECORDS
    seed: int | None = None
    sharding: str = "auto"
    cache: CachePlan | None = None  # the token cache of its tokenize or chat stage: one session per built graph
    _epoch: list[int] = field(default_factory=lambda: [0], repr=False, compare=False)
    _managed: list[bool] = field(default_factory=lambda: [False], repr=False, compare=False)

    # -- stages (the others: token_stages.py, batch_stages.py) ------------------------------------------
    def shuffle(self, buffer_size: int = 10_000, *, seed: int = 0) -> Pipeline:
        """Shuffle the order of input units per epoch, then rows through a ``buffer_size`` buffer.

        Deterministic for ``(seed, epoch)``; each new pass over a loader is the next epoch.

        Args:
            buffer_size: Rows held in the shuffle buffer (memory vs randomness).
            seed: Seed for unit order, the buffer, and (by default) bucket batch order.

        Example:
            >>> pp.from_iterable([{"text": "a"}]).shuffle(buffer_size=100, seed=1).seed
            1
        """
        if self.output != RECORDS:
            raise ValueError(shuffle_too_late(self))
        positive("buffer_size", buffer_size)
        check_seed(seed)
        stage = Stage("shuffle", _build.shuffle, {"buffer_size": buffer_size, "seed": seed})
        return self._add(stage, RECORDS, seed=seed)

    def prefetch(self, prefetch: int = 2) -> Pipeline:
        """Produce up to ``prefetch`` batches ahead in a background thread.

        Example:
            >>> pipe = pp.from_iterable([{"text": "a"}]).tokenize(pp.examples.tokenizer()).batch(1).pad()
            >>> pipe.prefetch(4).output
            'tensors'
        """
        self._expect("prefetch", TENSORS)
        positive("prefetch", prefetch)
        return self._add(Stage("prefetch", _build.prefetch, {"prefetch": prefetch, "device": None}), TENSORS)

    def to(self, device: str | torch.device) -> Pipeline:
        """Move batches to ``device``: ``"cpu"`` is a no-op, ``"cuda[:N]"`` is :meth:`to_cuda`.

        Example:
            >>> pipe = pp.from_iterable([{"text": "a"}]).tokenize(pp.examples.tokenizer()).batch(1).pad()
            >>> pipe.to("cpu") is pipe
            True
        """
        self._expect("to", TENSORS)
        device = torch.device(device)
        if device.type == "cpu":
            return self
        if device.type == "cuda":
            return self.to_cuda(device, prefetch=2)
        raise ValueError(f"`device` must be 'cpu' or a CUDA device, but is {str(device)!r} instead.")

    def to_cuda(self, device: str | torch.device | int | None = None, *, prefetch: int = 2) -> Pipeline:
        """Copy batches to a GPU ahead of use: pinned memory, ``non_blocking`` copies on a side stream.

        Tensors are safe to use on the consumer's current stream. Raises ``RuntimeError`` at once
        when no CUDA device is available. It must be the last stage: it runs in the main process, next
        to the model, also with ``.loader(num_workers=N)``. Right after ``.pack(block_mask=True)`` it
        builds the 4-D mask on the GPU instead of copying ``B * seq_len**2`` entries each step.

        Args:
            device: The CUDA device; default: ``cuda:LOCAL_RANK`` when ``LOCAL_RANK`` is set (torchrun),
                else the current device (both read when the loader starts, in the process that copies).
            prefetch: Batches copied ahead.

        Example:
            >>> pipe.to_cuda(prefetch=2)  # doctest: +SKIP
        """
        self._expect("to_cuda", TENSORS)
        positive("prefetch", prefetch)
        device = cuda_device(device)
        pipe, mask_dtype, last = self, None, self.stages[-1] if self.stages else None
        if last is not None and last.name == "pack" and last.options["block_mask"]:  # build the mask on the GPU
            mask_dtype = last.options["mask_dtype"] or torch.float32
            plain = dataclasses.replace(last, options={**last.options, "block_mask": False, "mask_dtype": None})
            pipe = dataclasses.replace(self, stages=self.stages[:-1] + (plain,))
        options = {"prefetch": prefetch, "device": device, "block_mask": mask_dtype}
        return pipe._add(Stage("to_cuda", _build.prefetch, options), TENSORS)

    def add_stage(self, name: str, builder: Callable[..., BaseNode], *, output: str, **options: Any) -> Pipeline:
        """Append a custom stage: ``builder(upstream_node, context, **options)`` returns its node.

        ``output`` names what it yields: ``"records"``, ``"tokens"``, ``"token batches"`` or ``"tensors"``.

        Example:
            >>> from torchdata.nodes import Batcher
            >>> pipe = pp.from_iterable([{"text": "a"}]).add_stage("pairs", lambda up, ctx: Batcher(up, 2, False),
            ...                                                     output="records")
            >>> pipe.stages[-1].name
            'pairs'
        """
        one_of("output", output, (RECORDS, TOKENS, TOKEN_BATCHES, TENSORS))
        return self._add(Stage(name, builder, options), output)
