"""Background threads with exact consumer-side state: a read-ahead producer and an in-order mapper.

:class:`BackgroundProducer`'s thread puts ``(transfer(item), upstream state after it)`` in a bounded queue; a saved
state is the consumer's position, never how far the thread read ahead. :class:`OrderedMapper` maps items in a pool on
top of it, its state the same for any number of threads. ``torchdata.nodes``' ``Prefetcher``, ``PinMemory`` and
``ParallelMapper`` are not reused: their state depends on the thread count, ``PinMemory.__init__`` calls CUDA,
``ExceptionWrapper`` rebuilds an exception from its message, and their threads outlive a loader an error dropped.
"""

from __future__ import annotations

import functools
import queue
import threading
import weakref
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Generic, TypeVar

from torchdata.nodes import BaseNode

from padpipe.shutdown import register_thread
from padpipe.state import Child, StateSchema

T = TypeVar("T")

POLL_SECONDS = 0.1
"""How long the thread waits on a full queue (the consumer on an empty one) before checking whether to stop
(whether the thread died)."""


@dataclass(frozen=True)
class _End:
    """End of the epoch: carries the upstream state after ``StopIteration``."""

    state: dict[str, Any]


@dataclass(frozen=True)
class _Failure:
    """An exception raised in the thread, kept with its original traceback."""

    error: BaseException
    traceback: TracebackType | None


def _put(q: queue.Queue, message: Any, stop: threading.Event) -> bool:
    """Put ``message`` unless ``stop`` is set first; ``False`` means the thread should end."""
    while not stop.is_set():
        try:
            q.put(message, timeout=POLL_SECONDS)
            return True
        except queue.Full:
            continue
    return False


def _produce(source: BaseNode, transfer: Callable[[Any], Any], q: queue.Queue, stop: threading.Event) -> None:
    """The thread body. It holds no reference to the consumer, so the consumer can be collected."""
    try:
        while not stop.is_set():
            try:
                item = next(source)
            except StopIteration:
                _put(q, _End(source.state_dict()), stop)
                return
            state = source.state_dict()
            if not _put(q, (transfer(item), state), stop):
                return
    except Exception as error:  # forwarded to the consumer, re-raised there
        _put(q, _Failure(error, error.__traceback__), stop)


class BackgroundProducer(Generic[T]):
    """Reads ``source`` ahead in a daemon thread; ``next()`` returns items in order.

    :meth:`reset` (before the first :meth:`next`) stops the running thread once its current
    ``next(source)`` ends (the upstream is never used by two threads), resets ``source`` in the
    caller's thread and starts a new one. An error in the thread (upstream or ``transfer``) is
    re-raised by :meth:`next` with its original traceback, again on every call until the next reset.
    The thread also stops when this object is collected or :meth:`close` is called.

    Args:
        source: The upstream node; only this producer may call it.
        prefetch: Most items held ready in the queue.
        transfer: Applied to each item in the thread (e.g. a host-to-device copy); must not
            reference the owner of this producer, or the owner cannot be collected while the
            thread runs.
        name: The thread's name.

    Example:
        >>> from torchdata.nodes import IterableWrapper
        >>> producer = BackgroundProducer(IterableWrapper([1, 2, 3]), prefetch=2, transfer=lambda x: x * 10)
        >>> producer.reset(None)
        >>> producer.next(), producer.next()
        (10, 20)
        >>> producer.state()  # the upstream state after item 2, however far the thread has read
        {'_num_yielded': 2}
        >>> _ = producer.close()  # stops the thread; returns the items read ahead
    """

    def __init__(
        self,
        source: BaseNode,
        *,
        prefetch: int,
        transfer: Callable[[Any], T] | None = None,
        name: str = "padpipe-prefetch",
    ) -> None:
        self.source, self.prefetch, self.name = source, prefetch, name
        self.transfer = transfer or (lambda item: item)
        self._queue: queue.Queue | None = None
        self._thread: threading.Thread | None = None
        self._stop: threading.Event | None = None
        self._finalizer: weakref.finalize | None = None
        self._state: dict[str, Any] | None = None
        self._done: _End | _Failure | None = None

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        """Stop the thread, reset ``source`` (``None``: its next epoch) and start reading again."""
        self.close()
        self.source.reset(initial_state)
        self._state = self.source.state_dict()
        self._done = None
        self._queue = queue.Queue(maxsize=self.prefetch)
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=_produce, args=(self.source, self.transfer, self._queue, self._stop), name=self.name, daemon=True
        )
        self._finalizer = weakref.finalize(self, self._stop.set)
        register_thread(self._thread, self._stop)
        self._thread.start()

    def next(self) -> T:
        """The next item; ``StopIteration`` at the end of the epoch."""
        if self._queue is None:
            raise RuntimeError("BackgroundProducer.next() was called before reset().")
        if self._done is None:
            message = self._get()
            if not isinstance(message, (_End, _Failure)):
                item, self._state = message
                return item
            self._done = message
            if isinstance(message, _End):
                self._state = message.state
        if isinstance(self._done, _Failure):
            raise self._done.error.with_traceback(self._done.traceback)
        raise StopIteration

    def state(self) -> dict[str, Any]:
        """The upstream state right after the last item :meth:`next` returned (or after reset)."""
        if self._state is None:
            raise RuntimeError("BackgroundProducer.state() was called before reset().")
        return self._state

    def close(self) -> list[Any]:
        """Stop the thread and wait for it (it finishes its current ``next(source)`` first).

        Returns the items it had read ahead and the consumer never took (to release them).
        """
        if self._finalizer is not None:
            self._finalizer()  # sets the stop event; runs at most once
        if self._thread is not None:
            self._thread.join()
        left = []
        while self._queue is not None:
            try:
                message = self._queue.get_nowait()
            except queue.Empty:
                break
            if isinstance(message, tuple):
                left.append(message[0])
        self._thread, self._queue, self._finalizer = None, None, None
        return left

    def _get(self) -> Any:
        assert self._queue is not None and self._thread is not None
        while True:
            try:
                return self._queue.get(timeout=POLL_SECONDS)
            except queue.Empty:
                if self._thread.is_alive():
                    continue
            try:  # the thread may have put its last message just before ending
                return self._queue.get_nowait()
            except queue.Empty:
                raise RuntimeError(f"the prefetch thread {self.name!r} ended without a result or an error.") from None


class _Dropped:
    """A flag set when an :class:`OrderedMapper` is garbage collected, by a finalizer that may run in any thread
    inside whatever lock it holds (the pool's own, in ``submit``): so setting it takes no lock and does nothing else.
    """

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = False

    def set(self) -> None:
        self.value = True


def _unless_dropped(fn: Callable[[Any], Any], dropped: _Dropped, item: Any) -> Any:
    """``fn(item)``, or ``None`` without any work once the stage that read ``item`` ahead was dropped."""
    return None if dropped.value else fn(item)


class OrderedMapper(BaseNode[Any]):
    """``fn`` applied to every upstream item in ``num_threads`` threads, items out in upstream order.

    With ``num_threads=1`` ``fn`` runs in the consumer's thread; otherwise a
    :class:`BackgroundProducer` hands each item to a pool, up to ``2 * num_threads`` in flight. The
    state is the upstream's after the last item returned, so resume is exact across thread counts.
    An exception of ``fn`` or the upstream is raised by :meth:`next` unchanged, and again on every
    later ``next()`` until the next reset.

    Args:
        source: The upstream node.
        fn: The function (thread-safe when ``num_threads > 1``).
        num_threads: Threads running ``fn``.
        stage: The stage's name, for state messages and thread names.
        settings: What a state of this stage must have been saved with (checked on resume).

    Example:
        >>> from torchdata.nodes import IterableWrapper
        >>> node = OrderedMapper(IterableWrapper(range(5)), lambda x: x * x, num_threads=3, stage="square",
        ...                      settings={})
        >>> list(node)
        [0, 1, 4, 9, 16]
    """

    def __init__(
        self, source: BaseNode, fn: Callable[[Any], Any], *, num_threads: int, stage: str, settings: Mapping[str, Any]
    ) -> None:
        super().__init__()
        self.source, self.fn, self.num_threads, self.stage = source, fn, num_threads, stage
        self.settings = dict(settings)
        self.STATE = StateSchema(stage, 2, source=Child())  # per node: its messages name the stage it runs
        self._producer: BackgroundProducer | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._error: BaseException | None = None

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        super().reset(initial_state)
        source_state = None if initial_state is None else self.STATE.check(initial_state, self.settings).source
        self._error = None
        if self.num_threads == 1:
            self.source.reset(source_state)
            return
        if self._producer is None:
            self._pool = ThreadPoolExecutor(self.num_threads, thread_name_prefix=f"padpipe-{self.stage}")
            dropped = _Dropped()  # once this node is dropped, the chunks it had read ahead are skipped, not worked on
            weakref.finalize(self, dropped.set)
            work = functools.partial(_unless_dropped, self.fn, dropped)
            transfer = functools.partial(self._pool.submit, work)  # holds no reference to this node
            self._producer = BackgroundProducer(
                self.source, prefetch=2 * self.num_threads, transfer=transfer, name=f"padpipe-{self.stage}-read"
            )
        for future in self._producer.close():
            future.cancel()  # read ahead for the old position: not needed
        self._producer.reset(source_state)

    def next(self) -> Any:
        if self._error is not None:
            raise self._error
        try:
            if self._producer is None:
                return self.fn(next(self.source))
            return self._producer.next().result()
        except StopIteration:
            raise
        except BaseException as error:  # an interrupt while waiting loses that item's result too
            self._error = error
            raise

    def get_state(self) -> dict[str, Any]:
        source = self.source.state_dict() if self._producer is None else self._producer.state()
        return self.STATE.make(self.settings, source=source)
