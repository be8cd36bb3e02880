"""``pytest.raises`` for an error raised in a torch DataLoader's worker process."""

from __future__ import annotations

import contextlib
import traceback
from collections.abc import Iterator
from typing import Any

import pytest


@contextlib.contextmanager
def raises_in_workers(expected: type[BaseException], match: str) -> Iterator[Any]:
    """``pytest.raises(expected, match=match)``, then the error's frames cleared: torch's DataLoader iterator they
    hold is freed at once and stops its workers. Left to the garbage collector (the frames make a reference cycle),
    it is freed after the queues it signals its workers through and waits 5 s for each before killing it."""
    with pytest.raises(expected, match=match) as raised:
        yield raised
    traceback.clear_frames(raised.tb)
