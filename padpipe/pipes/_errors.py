"""Carry an exception from a worker thread to the consumer unchanged, traceback included.

torchdata's ``ParallelMapper`` re-raises worker errors with a rewritten message ("Caught X in
_apply_udf ..."); wrapping the function with :func:`capture_errors` and the mapper with
:class:`Reraise` keeps the original exception object, so messages stay exact.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from torchdata.nodes import BaseNode

from padpipe._state import SOURCE_KEY, check_state, make_state


@dataclass(frozen=True)
class CapturedError:
    """An exception raised by a mapped function, travelling as an item."""

    error: BaseException


class _Capturing:
    """Picklable wrapper returning :class:`CapturedError` instead of raising."""

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self.fn = fn

    def __call__(self, item: Any) -> Any:
        try:
            return self.fn(item)
        except Exception as exc:  # noqa: BLE001 - re-raised as is by Reraise
            return CapturedError(exc)


def capture_errors(fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """Wrap ``fn`` so an exception comes back as a :class:`CapturedError` item.

    Example:
        >>> capture_errors(int)("x").error.__class__.__name__
        'ValueError'
    """
    return _Capturing(fn)


class Reraise(BaseNode):
    """Pass items through; raise any :class:`CapturedError` as its original exception.

    Args:
        source: A node whose items may be :class:`CapturedError`.
    """

    VERSION = 1

    def __init__(self, source: BaseNode) -> None:
        super().__init__()
        self.source = source

    def reset(self, initial_state: dict | None = None) -> None:
        super().reset(initial_state)
        if initial_state is None:
            self.source.reset(None)
        else:
            check_state("tokenize", initial_state, version=self.VERSION, settings={})
            self.source.reset(initial_state[SOURCE_KEY])

    def next(self) -> Any:
        item = next(self.source)
        if isinstance(item, CapturedError):
            raise item.error
        return item

    def get_state(self) -> dict:
        return make_state(version=self.VERSION, settings={}, **{SOURCE_KEY: self.source.state_dict()})
