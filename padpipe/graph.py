"""The node protocols, each declared once, on the ground floor (it imports only ``torchdata``): epochs
(:class:`EpochAware`, and the walk that starts a graph at an epoch) and the loader's stack above the graphs.

:func:`~padpipe.runtime.assemble.assemble` stacks loss-token windows, equal steps and a trailing prefetch or
``to_cuda`` stage over the graphs, recorded as :class:`LayerRecord` s; the elastic planner
(:mod:`padpipe.runtime.elastic`) folds over the record, so a new layer is planned for by what its :class:`Layer`
declares, nowhere else.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

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


# -- the loader's stack above the graphs: one protocol for saving, splitting and rebuilding -------------------
@dataclass(frozen=True)
class Parts:
    """A layer's saved state taken apart: the ``source`` state below it, the batches it ``held`` that had not come
    out, and whether the epoch had ``ended`` on every rank below it (a rank that only ran out of its share has not)."""

    source: dict[str, Any]
    held: list[Any] = field(default_factory=list)
    ended: bool = False


class Layer(Protocol):
    """What each layer of the loader's stack above the graphs declares."""

    @classmethod
    def split(cls, state: dict[str, Any], settings: Mapping[str, Any]) -> Parts:
        """``state`` (checked against ``settings``) taken apart."""
        ...

    @classmethod
    def around(cls, source: dict[str, Any], settings: Mapping[str, Any]) -> dict[str, Any]:
        """A fresh state of this layer over ``source``, nothing held."""
        ...


@dataclass(frozen=True)
class LayerRecord:
    """One layer of a built stack: its class and the settings it was built with.

    Example:
        >>> from padpipe.runtime.equal_steps import EqualSteps
        >>> record = LayerRecord(EqualSteps, {"policy": "balance"})
        >>> record.split(record.around({"version": 1})).source
        {'version': 1}
    """

    layer: type[Layer]
    settings: Mapping[str, Any]

    def split(self, state: dict[str, Any]) -> Parts:
        return self.layer.split(state, self.settings)

    def around(self, source: dict[str, Any]) -> dict[str, Any]:
        return self.layer.around(source, self.settings)
