"""The one way adapters learn who called padpipe: walk up the stack to the padpipe method in progress.

A framework's loop is seen in the frames above a padpipe method (``PipelineLoader.__iter__``,
``Pipeline.__iter__``); the walk starts at the adapter's own frame and looks for that method's
frame by its ``self``, so frames padpipe adds between the method and the adapter do not move what
the adapter sees. Only modules of ``padpipe/integrations/`` look at frames.
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
        if frame.f_code.co_name in names and frame.f_locals.get("self") is owner:
            return frame.f_back
        frame = frame.f_back
    return None
