"""The one way adapters learn who called padpipe: walk up the stack to the padpipe method in progress.

The walk finds that method's frame by its ``self``, and reads only the locals of frames running a method of a
module the adapter names (:func:`self_of`): before Python 3.13 reading ``f_locals`` keeps every local alive, so
a user's ``del loader`` would not free the loader until the function returned.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from types import FrameType
from typing import Any

LIMIT = 64
"""Frames walked from the adapter up to the padpipe method it was called for."""


def caller_of(owner: Any, methods: Iterable[str]) -> FrameType | None:
    """The frame that called ``owner``'s method (one of ``methods``) in progress, or ``None``.

    Example:
        >>> class Box:
        ...     def get(self):
        ...         return caller_of(self, ("get",))
        >>> Box().get().f_code.co_name
        '<module>'
    """
    names = set(methods)
    frame: FrameType | None = sys._getframe(1)
    for _ in range(LIMIT):
        if frame is None:
            return None
        if frame.f_code.co_name in names and self_of(frame, ("padpipe.",)) is owner:
            return frame.f_back
        frame = frame.f_back
    return None


def takes_self(frame: FrameType) -> bool:
    """Whether ``frame`` runs a method: a function whose first argument is ``self``."""
    code = frame.f_code
    return code.co_argcount > 0 and code.co_varnames[0] == "self"


def self_of(frame: FrameType, modules: tuple[str, ...]) -> Any:
    """The ``self`` of the method ``frame`` runs when its module starts with one of ``modules``, else ``None``.

    Example:
        >>> class Box:
        ...     def me(self):
        ...         return self_of(sys._getframe(), (__name__,)), self_of(sys._getframe(), ("torch.",))
        >>> box = Box()
        >>> box.me() == (box, None)
        True
    """
    if not takes_self(frame) or not str(frame.f_globals.get("__name__", "")).startswith(modules):
        return None
    return frame.f_locals.get("self")
