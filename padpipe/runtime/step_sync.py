"""What equal steps needs of a process group: gather a few ints from every rank, move batches between ranks."""

from __future__ import annotations

from typing import Any

import torch

from padpipe.runtime.rebalance import Move


class StepSync:
    """Gather a few ints from every rank of ``group``, and move batches between ranks.

    It works on CPU tensors, so the host never waits for the GPU's queue: in ``group`` when that takes CPU
    tensors, else in a gloo group over the same ranks, created once (every rank builds its loaders in the same
    order). A group passed in that takes only CUDA tensors is used as it is, on the current CUDA device.

    Attributes:
        rank: This process's rank in the group.
        size: The group's ranks.
    """

    def __init__(self, group: Any = None) -> None:
        import torch.distributed as dist

        self.group, self.device = group, torch.device("cpu")
        self.rank, self.size = dist.get_rank(group), dist.get_world_size(group)
        backend = str(dist.get_backend(group))
        if backend in ("gloo", "mpi") or "cpu:" in backend:
            return
        if group is None:
            self.group = _gloo_world()
        else:
            self.device = torch.device("cuda", torch.cuda.current_device())

    def gather(self, values: list[int]) -> list[list[int]]:
        """Every rank's ``values`` (the same length on every rank), by rank."""
        import torch.distributed as dist

        mine = torch.tensor(values, dtype=torch.int64, device=self.device)
        every = [torch.empty_like(mine) for _ in range(self.size)]
        dist.all_gather(every, mine, group=self.group)
        return [t.tolist() for t in every]

    def exchange(self, moves: list[Move], outgoing: list[Any]) -> list[Any]:
        """Send ``outgoing`` (this rank's batches of ``moves``, in order); the batches ``moves`` bring here, in order.

        Every rank walks the same ``moves`` in the same order, sending or receiving where it is
        a party, so no two ranks wait on each other in a circle.
        """
        import torch.distributed as dist

        sending, received = iter(outgoing), []
        for move in moves:
            if move.src == move.dst == self.rank:  # a filler this rank makes for itself
                received.append(next(sending))
            elif move.src == self.rank:
                peer = self._global(move.dst)
                dist.send_object_list([next(sending)], dst=peer, group=self.group, device=self.device)
            elif move.dst == self.rank:
                box: list[Any] = [None]
                dist.recv_object_list(box, src=self._global(move.src), group=self.group, device=self.device)
                received.append(box[0])
        return received

    def sum(self, value: int) -> int:
        """``value`` summed over the group."""
        import torch.distributed as dist

        total = torch.tensor([value], dtype=torch.int64, device=self.device)
        dist.all_reduce(total, op=dist.ReduceOp.SUM, group=self.group)
        return int(total.item())

    def _global(self, rank: int) -> int:
        import torch.distributed as dist

        return rank if self.group is None else dist.get_global_rank(self.group, rank)


_GLOO: list[Any] = []  # [the default group, its gloo twin]: made once per world


def _gloo_world() -> Any:
    import torch.distributed as dist

    world = dist.group.WORLD
    if not _GLOO or _GLOO[0] is not world:
        _GLOO[:] = [world, dist.new_group(backend="gloo")]
    return _GLOO[1]


def detect_sync(group: Any = None) -> StepSync | None:
    """A :class:`StepSync` when ``torch.distributed`` runs with more than one rank in this (main) process."""
    import torch.distributed as dist
    from torch.utils.data import get_worker_info

    if not (dist.is_available() and dist.is_initialized()) or get_worker_info() is not None:
        return None  # a DataLoader worker never joins the trainer's collectives
    return StepSync(group) if dist.get_world_size(group) > 1 else None
