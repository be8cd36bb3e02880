"""Stop every background thread of padpipe before the interpreter exits.

A daemon thread inside native code when Python finalizes (a Parquet read, a Rust tokenizer call) is ended with
``pthread_exit`` as soon as it asks for the GIL; unwinding through C++ frames then aborts the process
(``terminate called without an active exception``) after every step of the program passed. So every thread a
:class:`~padpipe.pipes.threads.BackgroundProducer` starts is registered here with its stop event, and at exit
each one still running (an abandoned loader's too) is told to stop and joined.
"""

from __future__ import annotations

import atexit
import threading
import time

EXIT_WAIT_SECONDS = 60.0
"""How long exit waits, in all, for the threads to finish what they are doing."""

_THREADS: dict[threading.Thread, threading.Event] = {}
_LOCK = threading.Lock()


def register_thread(thread: threading.Thread, stop: threading.Event) -> None:
    """Remember a background thread and its stop event, so it is stopped and joined at exit."""
    with _LOCK:
        for done in [t for t in _THREADS if not t.is_alive() and t.ident is not None]:
            del _THREADS[done]
        _THREADS[thread] = stop


@atexit.register
def _stop_all() -> None:
    with _LOCK:
        threads = list(_THREADS.items())
    for _, stop in threads:
        stop.set()
    deadline = time.monotonic() + EXIT_WAIT_SECONDS
    for thread, _ in threads:
        if thread.is_alive() and thread is not threading.current_thread():
            thread.join(max(0.0, deadline - time.monotonic()))
