"""Stop every background thread of padpipe before the interpreter exits.

A daemon thread that is inside native code (a Parquet read, a Rust tokenizer call) when Python
finalizes is ended with ``pthread_exit`` as soon as it returns to Python; unwinding through C++
frames then aborts the process (``FATAL: exception not rethrown``, ``terminate called without an
active exception``) even though every step of the program passed. So every
:class:`~padpipe.pipes._threading.BackgroundProducer` registers itself here when it starts a
thread, and at exit each one still alive is stopped and joined (it finishes its current
``next(source)`` first): also the threads of loaders that were abandoned after an error, which no
live pipeline references any more. The thread pools of ``tokenize`` are not daemons: Python joins
them at exit by itself.
"""

from __future__ import annotations

import atexit
import weakref
from typing import Any

_PRODUCERS: weakref.WeakSet[Any] = weakref.WeakSet()
_CHILDREN = ("source", "root", "_it", "_producer")


def register_producer(producer: Any) -> None:
    """Remember a producer that starts a thread, so the thread is stopped at exit (held weakly)."""
    _PRODUCERS.add(producer)


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
        if type(obj).__name__ in ("BackgroundProducer", "OrderedMapper"):
            obj.close()
        stack.extend(getattr(obj, "source_nodes", {}).values())
        stack.extend(getattr(obj, name, None) for name in _CHILDREN)


@atexit.register
def _stop_all() -> None:
    for producer in list(_PRODUCERS):
        producer.close()
