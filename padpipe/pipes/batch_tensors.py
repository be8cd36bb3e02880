"""The tensors of a batch, whatever its container: walk them, map them, move batches kept in a state.

Containers are handled as ``torch.utils.data``'s pin-memory loop handles them: ``Mapping`` s keep their type
(``UserDict``, HF ``BatchEncoding``), namedtuples are rebuilt, lists and tuples keep their type, anything else passes
through. A tensor that appears twice (``cu_seq_lens_q is cu_seq_lens_k``) is mapped once, both places the result.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

from padpipe.pipes import device_backend


def map_tensors(value: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """Apply ``fn`` to every tensor in nested containers (once per distinct tensor); the rest passes through.

    Example:
        >>> bounds = torch.tensor([0, 2])
        >>> out = map_tensors({"q": bounds, "k": bounds, "s": ["x"]}, lambda t: t * 2)
        >>> out, out["q"] is out["k"]
        ({'q': tensor([0, 4]), 'k': tensor([0, 4]), 's': ['x']}, True)
    """
    return _map(value, fn, {})


def _map(value: Any, fn: Callable[[torch.Tensor], torch.Tensor], memo: dict[int, torch.Tensor]) -> Any:
    if isinstance(value, torch.Tensor):
        if id(value) not in memo:
            memo[id(value)] = fn(value)
        return memo[id(value)]
    if isinstance(value, Mapping):
        mapped = {k: _map(v, fn, memo) for k, v in value.items()}
        if type(value) is dict:
            return mapped
        try:  # keep the Mapping's own type (and its other attributes), as torch's pin_memory does
            clone = copy.copy(value)
            clone.update(mapped)  # type: ignore[attr-defined]
            return clone
        except (AttributeError, TypeError):
            return mapped
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a namedtuple
        return type(value)(*(_map(v, fn, memo) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(_map(v, fn, memo) for v in value)
    return value


def iter_tensors(value: Any) -> Iterator[torch.Tensor]:
    """Every distinct tensor in nested containers, once each.

    Example:
        >>> t = torch.ones(1)
        >>> len(list(iter_tensors({"a": t, "b": [t, torch.zeros(1)]})))
        2
    """
    seen: set[int] = set()
    todo = [value]
    while todo:
        item = todo.pop()
        if isinstance(item, torch.Tensor):
            if id(item) not in seen:
                seen.add(id(item))
                yield item
        elif isinstance(item, Mapping):
            todo.extend(reversed(list(item.values())))
        elif isinstance(item, (list, tuple)):
            todo.extend(reversed(item))


def to_cpu(batch: Any) -> Any:
    """``batch`` with every tensor on the CPU, to keep in a state (CPU tensors are not copied).

    Example:
        >>> to_cpu({"x": torch.ones(1)})
        {'x': tensor([1.])}
    """
    return map_tensors(batch, lambda t: t if t.device.type == "cpu" else t.detach().cpu())


def to_device(batch: Any, device: torch.device | None) -> Any:
    """A batch restored from a state (on the CPU) moved to the stage's ``device``; ``None``: unchanged.

    ``device`` without an index is resolved as the device stage resolves it
    (:func:`~padpipe.pipes.device_backend.resolve_device`).

    Example:
        >>> to_device({"x": torch.ones(1)}, None)
        {'x': tensor([1.])}
    """
    if device is None:
        return batch
    backend = device_backend.current()
    device = device_backend.resolve_device(device, backend)
    return map_tensors(batch, lambda t: backend.move(t, device))
