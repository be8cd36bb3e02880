"""The tokenizer threads (``OrderedMapper``): a dropped stage stops working on the chunks it had read ahead."""

from __future__ import annotations

import gc
import threading
import time

from torchdata.nodes import IterableWrapper

from padpipe.pipes.threads import OrderedMapper


def test_a_dropped_mapper_works_only_on_the_chunks_already_started() -> None:
    calls: list[int] = []
    lock = threading.Lock()

    def slow(item: int) -> int:  # a chunk of a thousand conversations: a third of a second
        time.sleep(0.3)
        with lock:
            calls.append(item)
        return item

    node = OrderedMapper(IterableWrapper(range(100)), slow, num_threads=2, stage="slow", settings={})
    node.reset()
    assert next(node) == 0  # 0 and 1 done; 2 and 3 started; 4 more read ahead, waiting for a thread
    del node
    gc.collect()
    time.sleep(1.0)  # what was not started is cancelled; what was started ends
    assert len(calls) <= 4, calls  # not the chunks read ahead but not started (6 in all without the cancel)
    assert not [t for t in threading.enumerate() if t.name.startswith("padpipe-slow")]
