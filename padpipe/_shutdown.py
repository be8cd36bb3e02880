"""Stop every background thread of still-alive pipelines before the interpreter exits.

Daemon threads (padpipe's prefetch thread, torchdata's ``ParallelMapper`` workers) may be inside
native code (a Parquet read, a Rust tokenizer call) when Python shuts down; Arrow's C++ thread pool
then aborts the process ("terminate called without an active exception") even though every test
or training step passed. Built graphs are tracked weakly; at exit each is stopped and joined.
"""

from __future__ import annotations

import atexit
import weakref
from typing import Any

from torchdata.nodes import BaseNode

_GRAPHS: weakref.WeakSet[BaseNode] = weakref.WeakSet()
_CHILDREN = ("source", "root", "_it", "_producer")


def track(root: BaseNode) -> BaseNode:
    """Remember ``root`` so its threads are stopped at exit; returns it unchanged."""
    _GRAPHS.add(root)
    return root


def stop_threads(root: Any) -> None:
    """Stop and join the background threads found in ``root``'s graph (safe to call twice).

    Example:
        >>> stop_threads(pp.from_iterable([{"text": "a"}]).build())
    """
    seen: set[int] = set()
    stack = [root]
    while stack:
        obj = stack.pop()
        if obj is None or id(obj) in seen:
            continue
        seen.add(id(obj))
        if hasattr(obj, "close") and type(obj).__name__ == "BackgroundProducer":
            obj.close()
        elif hasattr(obj, "_shutdown") and callable(obj._shutdown):  # torchdata's mapper iterators
            obj._shutdown()
        stack.extend(getattr(obj, "source_nodes", {}).values())
        stack.extend(getattr(obj, name, None) for name in _CHILDREN)


@atexit.register
def _stop_all() -> None:
    for root in list(_GRAPHS):
        stop_threads(root)
