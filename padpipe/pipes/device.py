"""Background prefetch of batches, and their copy to a GPU ahead of use.

With a CUDA device the prefetch thread pins each tensor, copies it ``non_blocking`` on a side stream and records an
event; the consumer's stream waits on it and ``record_stream`` marks every tensor as used there, so its memory is not
reused while that stream reads it. Every CUDA call goes through :mod:`padpipe.pipes.device_backend` (a logging fake
in the CPU tests). CUDA is set up at the first reset, only in the main process (never in a ``DataLoader`` worker).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch.utils.data import get_worker_info
from torchdata.nodes import BaseNode

from padpipe.errors import positive
from padpipe.graph import Parts
from padpipe.pipes import device_backend
from padpipe.pipes.batch_tensors import iter_tensors, map_tensors
from padpipe.pipes.device_backend import CudaBackend
from padpipe.pipes.packing import MASK_DTYPES
from padpipe.pipes.threads import BackgroundProducer
from padpipe.state import Child, StateSchema
from padpipe.stats import PipelineStats

NO_CUDA = (
    "to_cuda() needs a CUDA device, but torch.cuda.is_available() is False; "
    "use .to('cpu') or .prefetch() on a machine without a GPU."
)
IN_WORKER = (
    "to_cuda() must run in the main process, but it is running in a DataLoader worker: give the "
    "DataLoader the pipeline without .to_cuda() and use pipe.to_cuda().loader(num_workers=N), "
    "which keeps the copy to the GPU in the main process."
)


def copy_to_cuda(
    batch: Any,
    *,
    device: torch.device,
    stream: Any,
    backend: CudaBackend,
    block_mask: torch.dtype | None,
    stats: PipelineStats,
) -> tuple[Any, Any]:
    """Runs in the prefetch thread: pin and copy ``batch`` on ``stream``; return it with an event.

    Each distinct tensor is pinned (unless it already is) and copied once; with ``block_mask``
    the packed batch's ``attention_mask`` is then built on ``stream``; the event is recorded on
    ``stream`` after the last of this work. A module function (not a method) so the thread holds
    no reference to the node.
    """
    with stats.timer("to_cuda"), backend.on_stream(device, stream):
        moved = map_tensors(batch, lambda t: backend.copy(backend.pin(t), device))
        if block_mask is not None:
            moved["attention_mask"] = block_causal_mask(moved["seq_idx"], block_mask)
        event = backend.record_event(stream)
    return moved, event


def block_causal_mask(seq_idx: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``pack(block_mask=True)``'s ``[B, 1, L, L]`` mask from ``seq_idx``, on ``seq_idx``'s device.

    A query sees the keys of its own segment up to itself: ``True`` (bool) or ``0`` (float) there,
    ``False`` or the dtype's lowest value elsewhere, as :func:`padpipe.pipes.packing.block_causal_mask`.

    Example:
        >>> block_causal_mask(torch.tensor([[0, 0, 1]]), torch.bool)[0, 0].int().tolist()
        [[1, 0, 0], [1, 1, 0], [0, 0, 1]]
    """
    columns = seq_idx.new_ones(seq_idx.shape[1]).cumsum(0)
    allowed = (seq_idx[:, None, :, None] == seq_idx[:, None, None, :]) & (columns[:, None] >= columns[None, :])
    if dtype == torch.bool:
        return allowed
    return seq_idx.new_zeros(allowed.shape, dtype=dtype).masked_fill_(~allowed, torch.finfo(dtype).min)


def cuda_device(device: str | torch.device | int | None) -> torch.device:
    """The CUDA device batches go to; ``RuntimeError`` at once when CUDA is not available.

    ``None`` means ``cuda:LOCAL_RANK`` under torchrun, else the current device, resolved in the
    process that copies (no CUDA call here, so forked ``DataLoader`` workers stay safe).

    Example:
        >>> cuda_device(None)  # doctest: +SKIP
        device(type='cuda')
    """
    if not device_backend.current().is_available():
        raise RuntimeError(NO_CUDA)
    device = torch.device("cuda") if device is None else torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"`device` must be a CUDA device, but is {str(device)!r} instead.")
    return device


class DevicePrefetcher(BaseNode[Any]):
    """Prefetch batches in a background thread and, with ``device``, copy them to that GPU.

    Items come out as the upstream yields them, in order, their tensors moved to ``device`` wherever
    they are nested (:func:`~padpipe.pipes.batch_tensors.map_tensors`). The state is the upstream's
    at the consumer's position, not the thread's read-ahead; upstream errors surface from
    ``next()`` with their original traceback.

    Args:
        source: The upstream node (batches of tensors).
        prefetch: Batches produced (and copied) ahead.
        device: ``None`` (or ``"cpu"``) to keep batches on the CPU, or a CUDA device; ``"cuda"``
            without an index is ``cuda:LOCAL_RANK`` under torchrun, else the current device.
        block_mask: With a device: build the packed batches' 4-D ``attention_mask`` in this dtype
            on the GPU from ``seq_idx`` (what ``.to_cuda()`` does right after
            ``.pack(block_mask=True)``).
        stats: Counters to report into (``seconds["to_cuda"]``: time spent issuing copies).

    Example:
        >>> from torchdata.nodes import IterableWrapper
        >>> node = DevicePrefetcher(IterableWrapper([{"x": torch.tensor([1]), "s": ["a"]}]), prefetch=2)
        >>> [batch for batch in node]
        [{'x': tensor([1]), 's': ['a']}]
        >>> pipe = pp.from_iterable([{"text": "a b"}]).tokenize(pp.examples.tokenizer()).batch(1).pad()  # doctest: +SKIP
        >>> batch = next(iter(pipe.to_cuda(prefetch=2).loader()))  # doctest: +SKIP
        >>> batch["input_ids"].device  # doctest: +SKIP
        device(type='cuda', index=0)
    """  # noqa: E501

    STATE = StateSchema("DevicePrefetcher", 2, source=Child())

    def __init__(
        self,
        source: BaseNode,
        *,
        prefetch: int = 2,
        device: str | int | torch.device | None = None,
        block_mask: torch.dtype | None = None,
        stats: PipelineStats | None = None,
    ) -> None:
        super().__init__()
        positive("prefetch", prefetch)
        self.source, self.prefetch = source, prefetch
        self.device = _check_device(device)
        if block_mask is not None and (self.device is None or block_mask not in MASK_DTYPES):
            raise ValueError(
                f"`block_mask` must be None or, with a CUDA device, one of {MASK_DTYPES}, but is "
                f"{block_mask} with device {self.device} instead."
            )
        self.block_mask = block_mask
        self.stats = stats or PipelineStats()
        self._producer: BackgroundProducer | None = None
        self._backend = device_backend.current()  # every CUDA call goes through it (a fake in tests)

    @classmethod
    def around(cls, source: dict[str, Any], settings: Mapping[str, Any]) -> dict[str, Any]:
        """This stage's state over its upstream state ``source`` (an elastic plan builds it)."""
        return cls.STATE.make({}, source=source)

    @classmethod
    def split(cls, state: dict[str, Any], settings: Mapping[str, Any]) -> Parts:
        """The upstream state inside a saved state, checked (the batches in its queue are not in its state: the
        upstream state is the position before them)."""
        return Parts(cls.STATE.check(state, {}).source)

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        super().reset(initial_state)
        source_state = None if initial_state is None else self.STATE.check(initial_state, {}).source
        if self._producer is None:
            self._producer = BackgroundProducer(self.source, prefetch=self.prefetch, transfer=self._transfer())
        self._producer.reset(source_state)

    def next(self) -> Any:
        assert self._producer is not None  # BaseNode resets before the first next()
        item = self._producer.next()
        if self.device is None:
            return item
        batch, event = item
        stream = self._backend.current_stream(self.device)
        self._backend.wait_event(stream, event)  # this stream's later work waits for the copies
        for tensor in iter_tensors(batch):
            self._backend.record_stream(tensor, stream)  # memory not reused while this stream reads it
        return batch

    def get_state(self) -> dict[str, Any]:
        assert self._producer is not None  # BaseNode resets before the first get_state()
        return self.STATE.make({}, source=self._producer.state())

    def _transfer(self) -> Callable[[Any], Any] | None:
        """The thread's transfer function; CUDA set-up happens here, on the first reset."""
        if self.device is None:
            return None
        if get_worker_info() is not None:
            raise RuntimeError(IN_WORKER)
        self.device = device_backend.resolve_device(self.device, self._backend)
        stream = self._backend.new_stream(self.device)
        return functools.partial(
            copy_to_cuda,
            device=self.device,
            stream=stream,
            backend=self._backend,
            block_mask=self.block_mask,
            stats=self.stats,
        )


def _check_device(device: str | int | torch.device | None) -> torch.device | None:
    if device is None:
        return None
    if isinstance(device, bool) or not isinstance(device, (str, int, torch.device)):
        raise TypeError(f"`device` must be None, a str, an int or a torch.device, but is {device!r} instead.")
    try:
        device = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    except RuntimeError as error:
        raise ValueError(f"`device` must name a device such as 'cuda:0', but is {device!r} instead.") from error
    if device.type == "cpu":
        return None
    if device.type != "cuda":
        raise ValueError(f"`device` must be None, 'cpu' or a CUDA device, but is {str(device)!r} instead.")
    if not device_backend.current().is_available():
        raise RuntimeError(NO_CUDA)
    return device
