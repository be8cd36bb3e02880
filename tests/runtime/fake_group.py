"""Process groups simulated in one process, for equal steps' protocol: ranks as threads, or a group of one.

``ThreadGroup`` meets its threads at a barrier for every collective, so ranks really run in
lockstep as they do under ``torch.distributed``; ``run_ranks`` runs one function per rank with
``detect_sync`` replaced by such a group. The real collectives run under torchrun in
tests/test_distributed.py and tests/runtime/test_*_torchrun.py.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from padpipe.runtime import equal_steps as es


class ThreadGroup:
    """A fake :class:`~padpipe.runtime.lockstep.StepSync` of ``size`` threads (``rank`` is the calling thread's)."""

    def __init__(self, size: int) -> None:
        self.size, self.values = size, [None] * size
        self.barrier = threading.Barrier(size, timeout=10)
        self.local = threading.local()
        self.mail: dict[tuple[int, int, int], Any] = {}
        self.gathers = 0  # collectives run, counted once per group

    @property
    def rank(self) -> int:
        return self.local.value

    def gather(self, values: list[int]) -> list[list[int]]:
        self.values[self.rank] = list(values)
        self.barrier.wait()
        every = [list(v) for v in self.values]
        if self.rank == 0:
            self.gathers += 1
        self.barrier.wait()
        return every

    def exchange(self, moves: list[Any], outgoing: list[Any]) -> list[Any]:
        sending = iter(outgoing)
        for k, move in enumerate(moves):
            if move.src == self.rank:
                self.mail[(move.src, move.dst, k)] = next(sending)
        self.barrier.wait()
        received = [self.mail[(m.src, m.dst, k)] for k, m in enumerate(moves) if m.dst == self.rank]
        self.barrier.wait()
        if self.rank == 0:
            self.mail.clear()
        self.barrier.wait()
        return received

    def sum(self, value: int) -> int:
        return sum(v for (v,) in self.gather([value]))


class OneRank:
    """A group of one: equal steps holds batches read ahead in its state exactly as with several ranks."""

    rank, size = 0, 1

    def gather(self, values: list[int]) -> list[list[int]]:
        return [list(values)]

    def exchange(self, moves: list[Any], outgoing: list[Any]) -> list[Any]:
        return list(outgoing)

    def sum(self, value: int) -> int:
        return value


def run_ranks(monkeypatch, work: list[Callable[[], Any]]) -> list[Any]:
    """Run ``work[r]()`` as rank ``r`` of a :class:`ThreadGroup`; their results, by rank."""
    group = ThreadGroup(len(work))
    monkeypatch.setattr(es, "detect_sync", lambda g=None: group)
    results: list[Any] = [None] * len(work)
    errors: list[BaseException] = []

    def run(rank: int) -> None:
        group.local.value = rank
        try:
            results[rank] = work[rank]()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test thread
            errors.append(exc)
            group.barrier.abort()

    threads = [threading.Thread(target=run, args=(r,)) for r in range(len(work))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    if errors:
        raise errors[0]
    return results
