"""A CPU stand-in for CUDA: tensors that act as if they lived on a GPU, and a backend that logs calls.

:class:`DeviceTensor` is a CPU tensor that says it is on ``cuda:0``; an op that mixes it with a
plain tensor raises as ATen does across devices, and ``.cpu()`` gives a plain tensor back.
:class:`FakeCuda` is a :class:`~padpipe.pipes.device_backend.CudaBackend` that logs every call
(with the stream it ran on), "copies" by wrapping as a :class:`DeviceTensor`, and raises when
called in another process (a DataLoader worker) or while ``forbidden`` is set.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from typing import Any

import torch

from padpipe.pipes.device_backend import CudaBackend

MIXED = "Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!"


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)


class DeviceTensor(torch.Tensor):
    """A CPU tensor standing for one on ``cuda:0`` (see the module docs)."""

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        attribute = getattr(getattr(func, "__self__", None), "__name__", None)  # a property's getter
        if attribute == "device":
            return torch.device("cuda", 0)
        if attribute == "is_cuda":
            return True
        if func is torch.Tensor.cpu:
            with torch._C.DisableTorchFunctionSubclass():
                return args[0].clone()
        if any(type(t) is torch.Tensor for t in _tensors([args, kwargs])):
            raise RuntimeError(MIXED)
        return super().__torch_function__(func, types, args, kwargs)


def on_device(tensor: torch.Tensor) -> DeviceTensor:
    """A copy of a plain tensor, "on the GPU"."""
    return tensor.detach().clone().as_subclass(DeviceTensor)


class FakeStream:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


class FakeCuda(CudaBackend):
    """Logs ``(call, ...)`` tuples in ``calls`` (holding the tensors, so ids are never reused).

    ``devices`` GPUs are visible, ``current`` is the current one.
    """

    def __init__(self, devices: int = 2, current: int = 0) -> None:
        self.devices, self.current = devices, current
        self.calls: list[tuple[Any, ...]] = []
        self.forbidden = False
        self._pid, self._lock, self._local = os.getpid(), threading.Lock(), threading.local()
        self._consumer: dict[torch.device, FakeStream] = {}
        self._events = 0

    def _log(self, *call: Any) -> None:
        if os.getpid() != self._pid:
            raise RuntimeError(f"CUDA call {call[0]}() in process {os.getpid()}, not the main process")
        if self.forbidden:
            raise RuntimeError(f"CUDA call {call[0]}() while CUDA calls are forbidden")
        with self._lock:
            self.calls.append(call)

    def names(self) -> list[str]:
        return [c[0] for c in self.calls]

    def is_available(self) -> bool:  # answers without a CUDA context: allowed at recipe time
        return True

    def device_count(self) -> int:
        self._log("device_count")
        return self.devices

    def current_device(self) -> int:
        self._log("current_device")
        return self.current

    def new_stream(self, device: torch.device) -> FakeStream:
        self._log("new_stream", device)
        return FakeStream(f"side:{device}")

    def current_stream(self, device: torch.device) -> FakeStream:
        self._log("current_stream", device)
        return self._consumer.setdefault(device, FakeStream(f"consumer:{device}"))

    @contextlib.contextmanager
    def on_stream(self, device: torch.device, stream: Any) -> Iterator[None]:
        self._log("on_stream", device, stream)
        self._local.stream = stream
        try:
            yield
        finally:
            self._local.stream = None

    def pin(self, tensor: torch.Tensor) -> torch.Tensor:
        self._log("pin", tensor)
        return tensor

    def copy(self, tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
        out = on_device(tensor)
        self._log("copy", tensor, out, device, getattr(self._local, "stream", None))
        return out

    def move(self, tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
        self._log("move", device)
        return tensor if isinstance(tensor, DeviceTensor) else on_device(tensor)

    def record_event(self, stream: Any) -> str:
        with self._lock:
            self._events += 1
            event = f"event{self._events}"
        self._log("event", event, stream)
        return event

    def wait_event(self, stream: Any, event: Any) -> None:
        self._log("wait", stream, event)

    def record_stream(self, tensor: torch.Tensor, stream: Any) -> None:
        self._log("record", tensor, stream)
