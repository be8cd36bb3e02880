"""The tokenizer threads (``OrderedMapper``): a dropped stage skips the chunks it had read ahead, without a deadlock."""

from __future__ import annotations

import gc
import subprocess
import sys
import threading
import time

import pytest
from torchdata.nodes import IterableWrapper

from padpipe.pipes.threads import OrderedMapper


@pytest.mark.slow  # seconds alone: make test runs it, test-fast leaves it out
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
    assert len(calls) <= 4, calls  # not the chunks read ahead but not started (6 in all when they ran)
    assert not [t for t in threading.enumerate() if t.name.startswith("padpipe-slow")]


DROP_INSIDE_THE_POOLS_LOCKS = """
import concurrent.futures.thread as pool_module, gc, threading
from torchdata.nodes import IterableWrapper
from padpipe.pipes.threads import OrderedMapper

node = OrderedMapper(IterableWrapper(range(100)), lambda x: x, num_threads=2, stage="locks", settings={})
node.reset()
next(node)
pool = node._pool
holder = {"node": node}
holder["self"] = holder  # freed only by the collector, which may run inside any lock its thread holds
del node, holder
with pool._shutdown_lock, pool_module._global_shutdown_lock:  # where ThreadPoolExecutor.submit collects
    gc.collect()
print("collected")
"""


def test_a_mapper_collected_inside_its_pools_locks_does_not_deadlock() -> None:
    done = subprocess.run(
        [sys.executable, "-c", DROP_INSIDE_THE_POOLS_LOCKS], capture_output=True, text=True, timeout=60, check=False
    )
    assert (done.returncode, done.stdout) == (0, "collected\n"), done.stderr
