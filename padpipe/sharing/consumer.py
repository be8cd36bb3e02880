"""Who is reading: this process's rank among distributed ranks and its DataLoader worker slot."""

from __future__ import annotations

from dataclasses import dataclass

from padpipe.sharing.ranks import ranks as world_ranks


@dataclass(frozen=True)
class Consumer:
    """One reader of the data: ``rank`` of ``world_size`` ranks, ``worker`` of ``num_workers``.

    Every work unit goes to exactly one consumer; consumer ``index`` reads units
    ``index, index + count, ...`` of the epoch's unit order.

    Example:
        >>> Consumer(rank=1, world_size=2, worker=0, num_workers=2).index
        2
    """

    rank: int = 0
    world_size: int = 1
    worker: int = 0
    num_workers: int = 1

    def __post_init__(self) -> None:
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank must be in [0, world_size={self.world_size}), but is {self.rank} instead.")
        if self.num_workers < 1 or not 0 <= self.worker < self.num_workers:
            raise ValueError(f"worker must be in [0, num_workers={self.num_workers}), but is {self.worker} instead.")

    @property
    def index(self) -> int:
        """Position of this consumer among all ``count`` consumers (rank-major)."""
        return self.rank * self.num_workers + self.worker

    @property
    def count(self) -> int:
        """Number of consumers sharing the data."""
        return self.world_size * self.num_workers

    @staticmethod
    def detect(*, ranks: bool = True) -> Consumer:
        """The current process's consumer slot: its ranks (:func:`~padpipe.sharing.ranks.ranks`) and DataLoader worker.

        Args:
            ranks: Split between distributed ranks; ``False``: every rank reads everything (for
                frameworks that shard or dispatch batches themselves), workers still split.

        Example:
            >>> Consumer.detect(ranks=False).world_size
            1
        """
        rank, world = world_ranks() if ranks else (0, 1)
        return Consumer(rank=rank, world_size=world).with_worker()

    def with_worker(self) -> Consumer:
        """This consumer's rank with the worker slot of the current DataLoader worker (if any).

        Example:
            >>> Consumer(rank=1, world_size=2).with_worker().index  # in the main process
            1
        """
        from torch.utils.data import get_worker_info

        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        return Consumer(rank=self.rank, world_size=self.world_size, worker=worker, num_workers=workers)
