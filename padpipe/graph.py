"""The epoch protocol: :class:`EpochAware` nodes, and the graph walk that starts them at an epoch.

On the ground floor (it imports only ``torchdata``), so the loader, the runtime, the readers and the
stages can all use it without importing each other.
"""

from __future__ import annotations

from typing import Any

from torchdata.nodes import BaseNode


class EpochAware:
    """A node whose ``reset(None)`` starts its next epoch (readers, shuffles, bucketing seeded per epoch).

    It keeps ``_epoch``, the last epoch it started (-1 before the first); ``reset(None)`` adds one
    and a loaded state sets it. :meth:`start_epoch` is how the loader jumps to an epoch.

    Example:
        >>> class Counter(EpochAware):
        ...     _epoch = -1
        >>> node = Counter(); node.start_epoch(5); node._epoch  # its next reset(None) starts epoch 5
        4
    """

    _epoch: int

    def start_epoch(self, epoch: int) -> None:
        """Make the next ``reset(None)`` start ``epoch`` (reading nothing of the epochs before it)."""
        self._epoch = epoch - 1


def start_at_epoch(root: BaseNode, epoch: int) -> None:
    """Make the next ``reset(None)`` of every :class:`EpochAware` node in ``root``'s graph start ``epoch``.

    So jumping to epoch 50 reads nothing of epochs 0-49.

    Example:
        >>> pipe = pp.from_iterable([{"text": "a"}]).tokenize(pp.examples.tokenizer()).batch(1).pad()
        >>> loader = pipe.loader(); start_at_epoch(loader.root, 3)  # what loader.set_epoch(3) does
    """
    seen: set[int] = set()
    stack: list[Any] = [root]
    while stack:
        node = stack.pop()
        if id(node) in seen or not isinstance(node, BaseNode):
            continue
        seen.add(id(node))
        if isinstance(node, EpochAware):
            node.start_epoch(epoch)
        stack.extend(getattr(node, "source_nodes", {}).values())
        stack.extend(getattr(node, name) for name in ("source", "root", "_it") if hasattr(node, name))
