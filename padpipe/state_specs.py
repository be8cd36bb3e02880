"""What one state value must be: a :class:`Spec` per key of a stage's state (see :class:`padpipe.state.StateSchema`).

Each spec's ``load`` takes a value from an untrusted state and returns the value to use, or raises
:class:`Invalid` with what the value must be; :func:`padpipe.state.load_value` turns that into a
``StateMismatchError`` naming the stage and the key.

Example:
    >>> Int(0, 6).load(3), ListOf(Bool(), length=2).load([True, False])
    (3, [True, False])
    >>> Int(0).load(-1)
    Traceback (most recent call last):
    ...
    padpipe.state_specs.Invalid: an int >= 0
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from padpipe.state_walk import show

INT64 = (-(2**63), 2**63 - 1)


class Invalid(Exception):
    """Raised by :meth:`Spec.load` with what the value must be (internal; becomes a StateMismatchError)."""

    def __init__(self, expected: str, found: str | None = None) -> None:
        super().__init__(expected)
        self.expected, self.found = expected, found


class Spec:
    """What one state value must be; :meth:`load` checks it and returns the value to use."""

    def load(self, value: Any) -> Any:
        """The value to use (an ``int``, a ``TokenChunk``, a numpy array, ...) or :class:`Invalid`."""
        raise NotImplementedError


@dataclass(frozen=True)
class Int(Spec):
    """An ``int`` (not a ``bool``) in ``[lo, hi]`` (either end open when ``None``)."""

    lo: int | None = None
    hi: int | None = None

    def load(self, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not _within(value, self.lo, self.hi):
            raise Invalid(f"an int{_range(self.lo, self.hi)}")
        if not _within(value, *INT64):  # an open range still takes no int that cannot be a position or count
            raise Invalid(f"an int{_range(self.lo, self.hi)} of at most 64 bits")
        return value


@dataclass(frozen=True)
class Bool(Spec):
    """``True`` or ``False``."""

    def load(self, value: Any) -> bool:
        if not isinstance(value, bool):
            raise Invalid("a bool")
        return value


@dataclass(frozen=True)
class Str(Spec):
    """A ``str`` (of at most ``max_length`` characters, when given)."""

    max_length: int | None = None

    def load(self, value: Any) -> str:
        if not isinstance(value, str):
            raise Invalid("a str")
        if self.max_length is not None and len(value) > self.max_length:
            raise Invalid(f"a str of at most {self.max_length} characters", f"a str of {len(value)} characters")
        return value


@dataclass(frozen=True)
class Optional(Spec):
    """``None`` or what ``spec`` takes."""

    spec: Spec

    def load(self, value: Any) -> Any:
        if value is None:
            return None
        try:
            return self.spec.load(value)
        except Invalid as exc:
            raise Invalid(f"None or {exc.expected}", exc.found) from None


@dataclass(frozen=True)
class ListOf(Spec):
    """A list (or tuple) of ``length`` items (any number when ``None``), each what ``item`` takes."""

    item: Spec
    length: int | None = None

    def load(self, value: Any) -> list[Any]:
        expected = f"a list of {'' if self.length is None else f'{self.length} '}items"
        if not isinstance(value, (list, tuple)) or (self.length is not None and len(value) != self.length):
            raise Invalid(expected)
        out = []
        for i, item in enumerate(value):
            try:
                out.append(self.item.load(item))
            except Invalid as exc:
                found = exc.found if exc.found is not None else show(item)
                raise Invalid(f"{expected}, each {exc.expected}", f"{found} at index {i}") from None
        return out


@dataclass(frozen=True)
class Array(Spec):
    """A 1-D tensor of ``dtype`` (returned as a numpy array), with its length and values in range."""

    dtype: torch.dtype
    lo: int | None = None
    hi: int | None = None
    max_length: int | None = None
    unique: bool = False

    def load(self, value: Any) -> np.ndarray:
        name = str(self.dtype).removeprefix("torch.")
        longest = "" if self.max_length is None else f" of at most {self.max_length} values"
        expected = f"a 1-D {name} tensor{longest}"
        if not isinstance(value, torch.Tensor) or value.dtype != self.dtype or value.dim() != 1:
            raise Invalid(expected)
        if self.max_length is not None and len(value) > self.max_length:
            raise Invalid(expected)
        array = value.detach().cpu().numpy().copy()
        if len(array) and (self.lo is not None or self.hi is not None):
            low, high = int(array.min()), int(array.max())
            if not (_within(low, self.lo, self.hi) and _within(high, self.lo, self.hi)):
                raise Invalid(f"{expected} with values{_range(self.lo, self.hi)}", f"values from {low} to {high}")
        if self.unique and len(np.unique(array)) != len(array):
            raise Invalid(f"{expected} of distinct values", "a tensor with repeated values")
        return array


@dataclass(frozen=True)
class Rng(Spec):
    """A numpy ``PCG64`` generator state (``Generator.bit_generator.state``); loads a ``Generator``."""

    def load(self, value: Any) -> np.random.Generator:
        expected = "a PCG64 generator state"
        if not isinstance(value, Mapping) or set(value) != {"bit_generator", "state", "has_uint32", "uinteger"}:
            raise Invalid(expected)
        inner = value["state"]
        ok = (
            value["bit_generator"] == "PCG64"
            and isinstance(inner, Mapping)
            and set(inner) == {"state", "inc"}
            and all(_is_int(inner[k], 0, 2**128 - 1) for k in ("state", "inc"))
            and _is_int(value["has_uint32"], 0, 1)
            and _is_int(value["uinteger"], 0, 2**32 - 1)
        )
        if not ok:
            raise Invalid(expected)
        rng = np.random.default_rng()
        try:
            rng.bit_generator.state = {**value, "state": dict(inner)}
        except (TypeError, ValueError):
            raise Invalid(expected) from None
        return rng


@dataclass(frozen=True)
class Child(Spec):
    """A nested stage state (a dict; the stage it belongs to checks it when it is reset)."""

    def load(self, value: Any) -> Any:
        if not isinstance(value, Mapping):
            raise Invalid("a state dict")
        return value


@dataclass(frozen=True)
class Plain(Spec):
    """Any plain data (a library's own state, such as ``datasets``'), checked by its owner."""

    def load(self, value: Any) -> Any:
        return value


def _is_int(value: Any, lo: int, hi: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and lo <= value <= hi


def _within(value: int, lo: int | None, hi: int | None) -> bool:
    return (lo is None or value >= lo) and (hi is None or value <= hi)


def _range(lo: int | None, hi: int | None) -> str:
    if lo is not None and hi is not None:
        return f" from {lo} to {hi}"
    if lo is not None:
        return f" >= {lo}"
    return "" if hi is None else f" <= {hi}"
