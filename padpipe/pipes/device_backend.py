"""The CUDA calls of the device stage, behind one small object a CPU fake can stand in for.

:class:`CudaBackend` is the real one (``torch.cuda``); a test installs a fake with :func:`use` and checks, without
a GPU, that the calls come in the right order and that none happens where none may (recipe build, loader
construction, worker processes).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Any

import torch


class CudaBackend:
    """``torch.cuda``, one method per call the device stage makes.

    Example:
        >>> backend = CudaBackend()
        >>> backend.is_available() in (True, False)
        True
    """

    def is_available(self) -> bool:
        return torch.cuda.is_available()

    def device_count(self) -> int:
        return torch.cuda.device_count()

    def current_device(self) -> int:
        return torch.cuda.current_device()

    def new_stream(self, device: torch.device) -> Any:
        return torch.cuda.Stream(device)

    def current_stream(self, device: torch.device) -> Any:
        return torch.cuda.current_stream(device)

    def on_stream(self, device: torch.device, stream: Any) -> AbstractContextManager[Any]:
        """Make ``device`` and ``stream`` current in this thread for the copies issued inside."""
        stack = contextlib.ExitStack()
        stack.enter_context(torch.cuda.device(device))
        stack.enter_context(torch.cuda.stream(stream))
        return stack

    def pin(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` in page-locked memory (a pinned or device tensor is returned as it is)."""
        return tensor.pin_memory() if tensor.device.type == "cpu" and not tensor.is_pinned() else tensor

    def copy(self, tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
        """An asynchronous copy on the current stream (``tensor`` is pinned)."""
        return tensor.to(device, non_blocking=True)

    def move(self, tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
        """A synchronous copy on the current stream (batches restored from a state, once)."""
        return tensor.to(device)

    def record_event(self, stream: Any) -> Any:
        event = torch.cuda.Event()
        event.record(stream)
        return event

    def wait_event(self, stream: Any, event: Any) -> None:
        stream.wait_event(event)

    def record_stream(self, tensor: torch.Tensor, stream: Any) -> None:
        tensor.record_stream(stream)


_current: list[CudaBackend] = [CudaBackend()]


def current() -> CudaBackend:
    """The backend the device stage uses now (:class:`CudaBackend` unless a test installed a fake)."""
    return _current[-1]


@contextlib.contextmanager
def use(backend: CudaBackend) -> Iterator[CudaBackend]:
    """Use ``backend`` for every device-stage call made inside the ``with`` block (tests).

    Example:
        >>> with use(CudaBackend()) as backend:
        ...     current() is backend
        True
    """
    _current.append(backend)
    try:
        yield backend
    finally:
        _current.remove(backend)


def resolve_device(device: torch.device, backend: CudaBackend | None = None) -> torch.device:
    """``device`` with its index: as given, else ``cuda:LOCAL_RANK`` under torchrun, else the current one.

    A process that sees a single GPU (one ``CUDA_VISIBLE_DEVICES`` entry per rank) uses it
    whatever ``LOCAL_RANK`` says. Call it in the process that copies (never before a fork).

    Raises:
        ValueError: ``LOCAL_RANK`` names a device this process does not see.

    Example:
        >>> resolve_device(torch.device("cuda", 1))
        device(type='cuda', index=1)
    """
    if device.index is not None:
        return device
    backend = backend or current()
    local = os.environ.get("LOCAL_RANK")
    if local is None:
        return torch.device("cuda", backend.current_device())
    count = backend.device_count()
    index = 0 if count == 1 else int(local)
    if index >= count:
        raise ValueError(
            f"to_cuda(): LOCAL_RANK is {local} but this process sees {count} CUDA device(s); "
            "pass the device, e.g. .to_cuda('cuda:0')."
        )
    return torch.device("cuda", index)
