"""The graph walk every epoch starts with: set the epoch of each epoch-aware node in a built graph.

On the ground floor (it imports only ``torchdata``), so the loader, the runtime and the mixer can all
use it without importing each other.
"""

from __future__ import annotations

from typing import Any

from torchdata.nodes import BaseNode


def start_at_epoch(root: BaseNode, epoch: int) -> None:
    """Make the next ``reset(None)`` of every epoch-aware node in ``root``'s graph start ``epoch``.

    Epoch-aware nodes keep ``_epoch`` (the last epoch started, -1 before the first); this sets it
    to ``epoch - 1`` throughout the graph, so jumping to epoch 50 reads nothing of epochs 0-49.
    """
    seen: set[int] = set()
    stack: list[Any] = [root]
    while stack:
        node = stack.pop()
        if id(node) in seen or not isinstance(node, BaseNode):
            continue
        seen.add(id(node))
        if hasattr(node, "_epoch"):
            node._epoch = epoch - 1
        stack.extend(getattr(node, "source_nodes", {}).values())
        stack.extend(getattr(node, name) for name in ("source", "root", "_it") if hasattr(node, name))
