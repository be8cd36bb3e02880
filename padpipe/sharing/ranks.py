"""Who the ranks are, in one place: this process's rank in a process group, and every rank's value gathered.

Every part of padpipe that asks for ranks or gathers states asks here, with the process group it
works in: the data-parallel group where a trainer has one (tensor-, context- and pipeline-parallel
peers of one data-parallel rank read the same data), the whole world by default.
"""

from __future__ import annotations

import os
from typing import Any


def ranks(group: Any = None) -> tuple[int, int]:
    """``(rank, size)`` of this process in ``group`` (``None``: the world).

    From ``torch.distributed`` when it is initialized; for the world before that, from the
    ``RANK``/``WORLD_SIZE`` environment variables a launcher sets; else ``(0, 1)``.

    Example:
        >>> ranks()
        (0, 1)
    """
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(group), dist.get_world_size(group)
    if group is not None:
        raise ValueError("a process group was given, but torch.distributed is not initialized.")
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def all_ranks(mine: Any, group: Any = None) -> list[Any]:
    """Every rank's ``mine`` in ``group``, in rank order (a collective: every rank of the group calls it).

    Example:
        >>> all_ranks({"n": 1})
        [{'n': 1}]
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(group) == 1:
        return [mine]
    every: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(every, mine, group=group)
    return every
