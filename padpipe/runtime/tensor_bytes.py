"""Send a worker's batches and states to the main process as bytes in the pipe, not as shared-memory tensors.

torch moves each tensor it sends between processes into a new shared-memory file, which costs more than reading
and tokenizing small batches (``benchmarks/workers.py``). :func:`as_bytes` replaces each plain CPU tensor by a
:class:`TensorBytes`, unpickled in the main process as an ordinary tensor; equal ones compare equal, so
``StatefulDataLoader`` resends only the parts of a state that changed.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from padpipe.state import CHECKSUM_KEY


class TensorBytes:
    """A CPU tensor as its dtype, shape and bytes; unpickled, a tensor again (with memory of its own).

    Example:
        >>> import pickle
        >>> sent = TensorBytes(torch.tensor([[1, 2], [3, 4]], dtype=torch.int32))
        >>> sent == TensorBytes(torch.tensor([[1, 2], [3, 4]], dtype=torch.int32)), sent.data[:8]
        (True, b'\\x01\\x00\\x00\\x00\\x02\\x00\\x00\\x00')
        >>> pickle.loads(pickle.dumps(sent))
        tensor([[1, 2],
                [3, 4]], dtype=torch.int32)
    """

    __slots__ = ("dtype", "shape", "data")

    def __init__(self, tensor: torch.Tensor) -> None:
        self.dtype = tensor.dtype
        self.shape = tuple(tensor.shape)
        flat = tensor.detach().resolve_conj().resolve_neg().reshape(-1).contiguous()
        self.data = flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return tensor_from_bytes, (self.dtype, self.shape, self.data)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TensorBytes):
            return NotImplemented
        return self.dtype == other.dtype and self.shape == other.shape and self.data == other.data

    __hash__ = None  # type: ignore[assignment]  # equal by value, mutable in principle: like a tensor, no hash

    def __repr__(self) -> str:
        return f"TensorBytes({self.dtype}, shape={list(self.shape)}, {len(self.data)} bytes)"


def tensor_from_bytes(dtype: torch.dtype, shape: tuple[int, ...], data: bytes) -> torch.Tensor:
    """The tensor a :class:`TensorBytes` holds: ``shape`` of ``dtype`` read from ``data``, in memory of its own.

    Example:
        >>> tensor_from_bytes(torch.int16, (2,), b"\\x01\\x00\\x02\\x00")
        tensor([1, 2], dtype=torch.int16)
    """
    out = torch.empty(shape, dtype=dtype, device="cpu")  # whatever default device the receiving process set
    if data:
        out.reshape(-1).view(torch.uint8).numpy()[:] = np.frombuffer(data, dtype=np.uint8)
    return out


def as_bytes(value: Any) -> Any:
    """``value`` with each plain CPU tensor in its dicts, lists and tuples replaced by a :class:`TensorBytes`.

    Other values are kept as they are (a tensor that needs gradients, lives on a device, is sparse, nested or
    quantized, or is a subclass travels as torch sends it), and so are containers of other types. A tensor
    found twice becomes one ``TensorBytes``, so it arrives as one tensor (a packed batch's ``cu_seq_lens_q``
    is its ``cu_seq_lens_k``); views of one storage arrive as tensors of their own.

    Example:
        >>> as_bytes({"input_ids": torch.tensor([5, 6]), "max_length": 2, "spans": [torch.tensor(1.0)]})
        {'input_ids': TensorBytes(torch.int64, shape=[2], 16 bytes), 'max_length': 2, 'spans': [TensorBytes(torch.float32, shape=[], 4 bytes)]}
    """  # noqa: E501
    return _Conversion(None)(value)


class _Conversion:
    """One :func:`as_bytes` call: the tensors converted so far (by ``id``), and with ``earlier`` (the sealed dicts
    of the state sent before, by ``id``, each with what was sent for it) the sealed dicts met again, sent as before.

    A sealed dict (holding :data:`~padpipe.state.CHECKSUM_KEY`) never changes, so the shuffle buffer's rows, the
    same objects in every state, are sent as before and torchdata resends nothing of them. ``sealed`` keeps each
    one met (and so its ``id``) for the next call.
    """

    def __init__(self, earlier: dict[int, tuple[dict, dict]] | None) -> None:
        self.tensors: dict[int, TensorBytes] = {}
        self.earlier = earlier
        self.sealed: dict[int, tuple[dict, dict]] = {}

    def __call__(self, value: Any) -> Any:
        kind = type(value)
        if kind is torch.Tensor:
            return self._tensor(value)
        if kind is dict:
            if self.earlier is not None and CHECKSUM_KEY in value:
                found = self.earlier.get(id(value)) or (value, {key: self(item) for key, item in value.items()})
                self.sealed[id(value)] = found
                return found[1]
            return {key: self(item) for key, item in value.items()}
        if kind is list:
            return [self(item) for item in value]
        if kind is tuple:
            return tuple(self(item) for item in value)
        return value

    def _tensor(self, value: torch.Tensor) -> Any:
        if id(value) not in self.tensors:
            if value.device.type != "cpu" or value.layout != torch.strided or value.requires_grad:
                return value
            if value.is_nested or value.is_quantized:
                return value
            self.tensors[id(value)] = TensorBytes(value)
        return self.tensors[id(value)]


class BytesIterator:
    """A worker's pipeline iterator whose batches and states come out through :func:`as_bytes` (a sealed dict of the
    state before sent again as the same object, see :class:`_Conversion`).

    Example:
        >>> it = BytesIterator(iter([{"ids": torch.tensor([1])}]))
        >>> next(it)
        {'ids': TensorBytes(torch.int64, shape=[1], 8 bytes)}
    """

    def __init__(self, iterator: Any) -> None:
        self._iterator = iterator
        self._sealed: dict[int, tuple[dict, dict]] = {}  # the sealed dicts of the last state sent

    def __iter__(self) -> BytesIterator:
        return self

    def __next__(self) -> Any:
        return as_bytes(next(self._iterator))

    def state_dict(self) -> Any:
        conversion = _Conversion(self._sealed)
        state = conversion(self._iterator.state_dict())
        self._sealed = conversion.sealed
        return state

    def load_state_dict(self, state: Any) -> None:
        self._iterator.load_state_dict(state)
