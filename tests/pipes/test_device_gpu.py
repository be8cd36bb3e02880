"""Races the device stage must not lose, on a real GPU (skipped without one).

Each test makes one side of the hand-over late with ``torch.cuda._sleep`` (a kernel that spins
on the GPU), so the batch comes out wrong when the matching safeguard is missing: a copy still
running on the side stream when the consumer reads (the consumer's ``wait_event``), or memory
reused by the next copy while the consumer's stream has yet to read it (``record_stream``).
The same order of calls is checked on the CPU by tests/pipes/test_device_fake.py.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from padpipe.pipes import device_backend
from padpipe.pipes.device import DevicePrefetcher
from padpipe.pipes.device_backend import CudaBackend
from tests.pipes.nodes import ListNode

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
SLEEP_CYCLES = 10**9  # about half a second of GPU clock


class LateCopies(CudaBackend):
    """Every batch's copies queue behind a sleep on the side stream."""

    @contextlib.contextmanager
    def on_stream(self, device: torch.device, stream: Any) -> Iterator[None]:
        with super().on_stream(device, stream):
            torch.cuda._sleep(SLEEP_CYCLES)
            yield


def same_shape_batches(n: int) -> ListNode:
    return ListNode([{"x": torch.full((4, 1024), i)} for i in range(n)])


@pytest.mark.timeout(120)
def test_to_cuda_batch_is_complete_when_returned_though_its_copy_is_late() -> None:
    with device_backend.use(LateCopies()):
        node = DevicePrefetcher(same_shape_batches(4), prefetch=2, device="cuda")
        node.reset(None)
        seen = [(next(node)["x"] * 1).unique().tolist() for _ in range(4)]  # read on the consumer's stream
    assert seen == [[0], [1], [2], [3]]


@pytest.mark.timeout(120)
def test_to_cuda_batch_memory_is_not_reused_while_the_consumer_stream_reads_it() -> None:
    node = DevicePrefetcher(same_shape_batches(12), prefetch=2, device="cuda")
    node.reset(None)
    kept = []
    for _ in range(3):
        batch = next(node)
        torch.cuda._sleep(SLEEP_CYCLES)  # the consumer's stream is busy: the read below runs later
        kept.append(batch["x"] * 1)
        del batch  # freed on the host now; the GPU reads it only after the sleep
        for _ in range(3):
            next(node)  # the thread copies same-size batches meanwhile
        time.sleep(0.05)
    torch.cuda.synchronize()
    assert [k.unique().tolist() for k in kept] == [[0], [4], [8]]
