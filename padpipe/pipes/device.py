"""Background prefetch of batches, and their copy to a GPU ahead of use.

Without a device the node reads its upstream ahead in a background thread. With a CUDA device the
same thread pins each tensor, copies it with ``non_blocking=True`` on a side stream and records an
event; the consumer makes its current stream wait on that event and marks every tensor as used on
that stream (``record_stream``), so the batch is safe to use there and its memory is not reused
while that stream still reads it.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Iterator

import torch
from torchdata.nodes import BaseNode

from padpipe._state import SOURCE_KEY, Child, check_state, make_state
from padpipe.errors import positive
from padpipe.pipes._threading import BackgroundProducer
from padpipe.stats import PipelineStats

NO_CUDA = (
    "to_cuda() needs a CUDA device, but torch.cuda.is_available() is False; "
    "use .to('cpu') or .prefetch() on a machine without a GPU."
)


def map_tensors(value: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """Apply ``fn`` to every tensor in nested dicts, lists and tuples; other values pass through.

    Example:
        >>> map_tensors({"a": torch.ones(2), "s": ["x"]}, lambda t: t * 2)
        {'a': tensor([2., 2.]), 's': ['x']}
    """
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, dict):
        return {k: map_tensors(v, fn) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(map_tensors(v, fn) for v in value)
    return value


def iter_tensors(value: Any) -> Iterator[torch.Tensor]:
    """Every tensor in nested dicts, lists and tuples."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from iter_tensors(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from iter_tensors(v)


def _to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    if tensor.device.type == "cpu" and not tensor.is_pinned():
        tensor = tensor.pin_memory()
    return tensor.to(device, non_blocking=True)


def copy_to_cuda(batch: Any, *, device: torch.device, stream: Any, stats: PipelineStats) -> tuple[Any, Any]:
    """Runs in the prefetch thread: pin and copy ``batch`` on ``stream``; return it with an event.

    A module function (not a method) so the thread holds no reference to the node.
    """
    with stats.timer("to_cuda"), torch.cuda.device(device), torch.cuda.stream(stream):
        moved = map_tensors(batch, functools.partial(_to_device, device=device))
        event = torch.cuda.Event()
        event.record(stream)
    return moved, event



def cuda_device(device: str | torch.device | int | None) -> torch.device:
    """The CUDA device batches go to; ``RuntimeError`` at once when CUDA is not available.

    ``None`` means the current device, resolved in the process that copies (no CUDA call here, so
    forked ``DataLoader`` workers stay safe).

    Example:
        >>> cuda_device(None)  # doctest: +SKIP
        device(type='cuda')
    """
    if not torch.cuda.is_available():
        raise RuntimeError(
            "to_cuda() needs a CUDA device, but torch.cuda.is_available() is False; "
            "use .to('cpu') or .prefetch() on a machine without a GPU."
        )
    device = torch.device("cuda") if device is None else torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"`device` must be a CUDA device, but is {str(device)!r} instead.")
    return device


class DevicePrefetcher(BaseNode[Any]):
    """Prefetch batches in a background thread and, with ``device``, copy them to that GPU.

    Items come out exactly as the upstream yields them, in order; tensors anywhere in nested
    dicts/lists are moved to ``device``, other values (lists of strings) pass through. The saved
    state is the upstream's state at the consumer's position, not the thread's read-ahead, so a
    resume continues with the batch after the last one returned. Errors raised upstream surface
    from ``next()`` with their original traceback.

    Args:
        source: The upstream node (batches of tensors).
        prefetch: Batches produced (and copied) ahead.
        device: ``None`` (or ``"cpu"``) to keep batches on the CPU, or a CUDA device.
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
    """

    VERSION = 2

    def __init__(
        self,
        source: BaseNode,
        *,
        prefetch: int = 2,
        device: str | int | torch.device | None = None,
        stats: PipelineStats | None = None,
    ) -> None:
        super().__init__()
        positive("prefetch", prefetch)
        self.source = source
        self.prefetch = prefetch
        self.device = _check_device(device)
        self.stats = stats or PipelineStats()
        self._producer: BackgroundProducer | None = None

    @classmethod
    def state_around(cls, source: dict[str, Any]) -> dict[str, Any]:
        """This stage's state over its upstream state ``source`` (an elastic plan builds it)."""
        return make_state(version=cls.VERSION, settings={}, **{SOURCE_KEY: source})

    @classmethod
    def source_of(cls, state: dict[str, Any]) -> dict[str, Any]:
        """The upstream state inside a saved state, checked."""
        check_state(cls.__name__, state, version=cls.VERSION, settings={}, fields={SOURCE_KEY: Child()})
        return state[SOURCE_KEY]

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        super().reset(initial_state)
        source_state = None
        if initial_state is not None:
            check_state(type(self).__name__, initial_state, version=self.VERSION, settings={}, fields={SOURCE_KEY: Child()})
            source_state = initial_state[SOURCE_KEY]
        if self._producer is None:
            self._producer = BackgroundProducer(self.source, prefetch=self.prefetch, transfer=self._transfer())
        self._producer.reset(source_state)

    def next(self) -> Any:
        assert self._producer is not None  # BaseNode resets before the first next()
        item = self._producer.next()
        if self.device is None:
            return item
        batch, event = item
        stream = torch.cuda.current_stream(self.device)
        stream.wait_event(event)
        for tensor in iter_tensors(batch):
            if tensor.is_cuda:
                tensor.record_stream(stream)
        return batch

    def get_state(self) -> dict[str, Any]:
        assert self._producer is not None  # BaseNode resets before the first get_state()
        return make_state(version=self.VERSION, settings={}, **{SOURCE_KEY: self._producer.state()})

    def _transfer(self) -> Callable[[Any], Any] | None:
        """The thread's transfer function; CUDA set-up happens here, on the first reset."""
        if self.device is None:
            return None
        if self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        stream = torch.cuda.Stream(self.device)
        return functools.partial(copy_to_cuda, device=self.device, stream=stream, stats=self.stats)


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
    if not torch.cuda.is_available():
        raise RuntimeError(NO_CUDA)
    return device
