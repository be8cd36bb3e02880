"""Walks over a state's values, which anyone may have written: its CRC, its nesting depth, a short display.

Whatever a state holds (a list nested 100,000 deep, an int of 5,000 digits, a string of a gigabyte), each walk
takes time linear in its size, never recurses, never converts an int of more than :data:`INT_BITS` bits to
decimal, and copies or shows a bounded part of a long string.
"""

from __future__ import annotations

import builtins
import functools
import reprlib
import zlib
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

INT_BITS = 4096
"""Ints longer than this (about 1,233 digits) count in hex and show by their size."""
PIECE = 1 << 20
"""Characters of a string encoded at once for its CRC."""
PATH_KEYS = 12
"""Keys of a path :func:`deeper_than` names."""


def crc(value: Any, *, sealed: str) -> int:
    """The CRC-32 of ``value``; a dict inside it holding ``sealed`` counts by that value (``value`` counts whole).

    Example:
        >>> crc({"a": [1, "x"]}, sealed="checksum") == crc({"a": [1, "x"]}, sealed="checksum")
        True
    """
    start = 0
    stack: list[tuple[Any, Any]] = [(value, True)]  # (value, outermost) to walk, or (_KEY, key) to count; last first
    while stack:
        item, extra = stack.pop()
        if item is _KEY:
            start = _text(b"K", extra, start)
        elif isinstance(item, Mapping):
            if not extra and sealed in item:
                found = item[sealed]
                start = _text(b"C", found if isinstance(found, str) else show(found), start)
                continue
            start = zlib.crc32(b"D%d" % len(item), start)
            for key in reversed(sorted(item, key=key_text)):
                stack += [(item[key], False), (_KEY, key_text(key))]
        elif isinstance(item, (list, tuple)):
            start = zlib.crc32(b"L%d" % len(item), start)
            stack += [(inner, False) for inner in reversed(item)]
        else:
            start = _leaf(item, start)
    return start


_KEY = object()  # marks a dict key on crc's stack


def key_text(key: Any) -> str:
    """A dict key as counted and sorted: itself (keys are strings in states), any other shown short."""
    return key if isinstance(key, str) else show(key)


def _leaf(value: Any, start: int) -> int:
    if isinstance(value, torch.Tensor):
        shape = tuple(value.shape) or (1,)  # a 0-d tensor counts as shape (1,), as in states saved before
        start = zlib.crc32(f"T{_dtype_tag(value.dtype)}{shape}".encode(), start)
        if not value.numel():
            return start
        raw = value.detach().cpu().resolve_conj().resolve_neg().contiguous().reshape(-1).view(torch.uint8)
        return zlib.crc32(raw.numpy().data, start)
    if value is None or isinstance(value, bool):
        return zlib.crc32(repr(value).encode(), start)
    if isinstance(value, int):
        if value.bit_length() > INT_BITS:
            return zlib.crc32(b"X" + format(value, "x").encode(), start)
        return zlib.crc32(b"I%d" % value, start)
    if isinstance(value, float):
        return zlib.crc32(b"F" + repr(value).encode(), start)
    if isinstance(value, str):
        return _text(b"S", value, start)
    return zlib.crc32(b"?" + type(value).__name__.encode(), start)  # not plain: fails the type checks


def _text(prefix: bytes, text: str, start: int) -> int:
    """The CRC of ``prefix`` and ``text`` in UTF-8, encoded a piece at a time (the same as whole)."""
    start = zlib.crc32(prefix, start)
    for i in range(0, len(text), PIECE):
        start = zlib.crc32(text[i : i + PIECE].encode("utf-8", "surrogatepass"), start)
    return start


@functools.cache
def _dtype_tag(dtype: torch.dtype) -> str:
    """NumPy's name of ``dtype`` (``'<i8'``, as states were always hashed), else torch's (``'torch.bfloat16'``)."""
    try:
        return torch.empty(0, dtype=dtype).numpy().dtype.str
    except TypeError:  # no NumPy twin: bfloat16, float8, ...
        return str(dtype)


def deeper_than(value: Any, limit: int, *, sealed: str | None) -> str | None:
    """Where ``value`` nests lists and dicts past ``limit`` levels (its first keys, ``"a/0/b/..."``), or ``None``.

    A dict holding ``sealed`` is not entered (``None``: every dict is).

    Example:
        >>> deeper_than({"a": [[1]]}, 3, sealed="checksum"), deeper_than({"a": [[[1]]]}, 3, sealed="checksum")
        (None, 'a/0/0')
    """
    stack: list[tuple[Any, int, Any]] = [(value, 1, None)]  # (value, depth, its trail: (key, parent's trail))
    while stack:
        value, depth, trail = stack.pop()
        if isinstance(value, Mapping):
            if sealed is not None and sealed in value:
                continue
            items: Any = value.items()
        elif isinstance(value, (list, tuple)):
            items = enumerate(value)
        else:
            continue
        if depth > limit:
            keys = []
            while trail is not None:
                key, trail = trail
                keys.append(key_text(key) if not isinstance(key, int) else str(key))
            keys.reverse()
            return "/".join(keys[:PATH_KEYS]) + ("/..." if len(keys) > PATH_KEYS else "")
        stack.extend((child, depth + 1, (key, trail)) for key, child in items)
    return None


def show(value: Any, limit: int = 60) -> str:
    """A repr of ``value`` for messages, at most ``limit`` characters (tensors by dtype and shape, long ints by size).

    Example:
        >>> show("x" * 10**6, 12), show(10**5000), show([[[[[1]]]]])
        ("'xxxxxxxx...", 'an int of 16610 bits', '[[[[...]]]]')
    """
    text = _Brief(limit).repr(value)
    return text if len(text) <= limit else f"{text[: limit - 3]}..."


class _Brief(reprlib.Repr):
    """``reprlib``'s bounded repr (a few levels, a few items), where nothing is converted or copied whole."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.maxlevel, self.maxdict, self.maxlist, self.maxtuple = 4, 4, 6, 6
        self.maxstring = self.maxother = self.maxlong = limit + 1

    def repr1(self, x: Any, level: int) -> str:
        if isinstance(x, torch.Tensor):
            return f"a {str(x.dtype).removeprefix('torch.')} tensor of shape {list(x.shape)}"
        if isinstance(x, int) and not isinstance(x, bool) and x.bit_length() > INT_BITS:
            return f"an int of {x.bit_length()} bits"
        if isinstance(x, (bool, float, np.generic)) or x is None:
            return builtins.repr(x)
        if isinstance(x, (str, bytes, bytearray)):
            return builtins.repr(x[: self.maxstring])[: self.maxstring + 2]
        if type(x) in (int, list, tuple, dict):
            return super().repr1(x, level)
        return f"a {type(x).__name__}"
