"""Held batches, in one place: batches a layer has in hand and has not given out (or its trainer has not trained).

Every layer that holds batches across a ``next()`` keeps them in a :class:`Held`, saved with :meth:`Held.saved`
(on the CPU), declared with :data:`SPEC` and put back on the layer's device by :meth:`Held.restore`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import Any

import torch

from padpipe.batch_spec import HeldBatch
from padpipe.errors import non_negative
from padpipe.pipes.batch_tensors import to_cpu, to_device
from padpipe.state import ListOf

SPEC = ListOf(HeldBatch())
"""How a state declares held batches (each checked as a batch)."""


class Held(list[Any]):
    """Batches in hand, oldest first, on ``device``: a list that saves itself on the CPU and restores itself.

    Args:
        batches: The batches held at first.
        device: Where restored batches go (a ``to_cuda`` stage's device); ``None``: left where they are.

    Example:
        >>> held = Held([{"x": torch.ones(1)}]); held.append({"x": torch.zeros(1)})
        >>> saved = held.saved(); held.clear()
        >>> again = Held(); again.restore(saved); [b["x"].tolist() for b in again]
        [[1.0], [0.0]]
    """

    def __init__(self, batches: Iterable[Any] = (), *, device: torch.device | None = None) -> None:
        super().__init__(batches)
        self.device = device

    def saved(self) -> list[Any]:
        """The batches as a state keeps them: every tensor on the CPU (the batches held are left as they are)."""
        return [to_cpu(b) for b in self]

    def restore(self, batches: Iterable[Any]) -> None:
        """Hold ``batches`` (from a state) instead, on this store's device."""
        self[:] = [to_device(b, self.device) for b in batches]


class Untrained:
    """The batches a loader returned that its trainer has not trained yet, and those to return first after a resume.

    ``recent`` keeps the last :meth:`keep` batches returned (the last one until told: a trainer may fetch its
    first batch before it says how many it fetches ahead); ``restored`` those a checkpoint gave back.

    Example:
        >>> kept = Untrained(); kept.keep(1)
        >>> kept.note({"x": 1}); kept.note({"x": 2})
        >>> kept.last(1)
        [{'x': 2}]
    """

    def __init__(self) -> None:
        self.recent: deque[Any] = deque(maxlen=1)
        self.restored = Held()
        self.outstanding = 0  # returned and not noted trained (PipelineLoader.trained)

    def keep(self, count: int) -> None:
        """Keep the last ``count`` batches returned (a trainer's fetch-ahead; 0: none)."""
        non_negative("count", count)
        self.recent = deque(self.recent, maxlen=count)

    def note(self, batch: Any) -> None:
        """A batch was returned."""
        self.recent.append(batch)
        self.outstanding += 1

    def last(self, count: int) -> list[Any]:
        """The last ``count`` batches returned and those restored not returned again yet: what a checkpoint holds."""
        if count > (self.recent.maxlen or 0):
            raise ValueError(
                f"a checkpoint was asked for the last {count} batches returned, but the loader keeps "
                f"{self.recent.maxlen or 0}: call loader.keep_untrained({count}) before iterating."
            )
        recent = list(self.recent)[len(self.recent) - count :] if count else []
        return [*recent, *self.restored]

    def restore(self, batches: list[Any], device: torch.device | None) -> None:
        """Return ``batches`` (from a checkpoint, on the CPU) first, on ``device``."""
        self.restored = Held(device=device)
        self.restored.restore(batches)

    def clear(self) -> None:
        self.recent.clear()
        self.restored.clear()
        self.outstanding = 0
