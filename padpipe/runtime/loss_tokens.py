"""Loss-token counts for gradient accumulation: ``num_items_in_batch`` of each optimizer step's window.

:class:`LossTokens` reads each window of ``k`` batches ahead, counts its label tokens as HF ``Trainer`` does,
sums them over the ranks in one all-reduce and gives every batch of it the total (docs/training.md,
"Gradient accumulation").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torchdata.nodes import BaseNode

from padpipe.batch_spec import HeldBatch
from padpipe.errors import check_bool, positive
from padpipe.graph import Parts
from padpipe.pipes.pairs import count_pairs
from padpipe.runtime.held import Held
from padpipe.runtime.lockstep import REPEAT_KEY
from padpipe.runtime.rebalance import FILLER_KEY
from padpipe.runtime.step_sync import StepSync, detect_sync
from padpipe.state import Bool, Child, Int, ListOf, StateSchema

ITEMS_KEY = "num_items_in_batch"
IGNORE_INDEX = -100  # the label HF's losses leave out


def label_tokens(batch: Any, *, causal: bool = True) -> int:
    """The label tokens of one batch that a loss counts, as HF ``Trainer._get_num_items_in_batch`` counts them.

    ``shift_labels`` when the batch has it, else ``labels[..., 1:]`` for a causal-LM loss or ``labels``, each
    without the ``-100`` entries (a packed row's document starts are ``-100`` already). A repeat or a filler,
    whose loss is zeroed, counts 0; a preference batch counts its pairs, the unit a DPO loss averages over.

    Example:
        >>> label_tokens({"labels": torch.tensor([[-100, 5, 6, -100], [7, 8, -100, -100]])})
        3
        >>> label_tokens({"labels": torch.tensor([1, 0, 1])}, causal=False)
        3
    """
    pairs = count_pairs(batch) if isinstance(batch, dict) else None
    if pairs is not None:
        return 0 if any(bool(batch.get(key, False)) for key in (REPEAT_KEY, FILLER_KEY)) else pairs
    if not isinstance(batch, dict) or ("labels" not in batch and "shift_labels" not in batch):
        found = sorted(batch) if isinstance(batch, dict) else type(batch).__name__
        raise ValueError(
            f"`accumulation_steps` counts the loss tokens of each batch's `labels`, but a batch has none: "
            f"expected a dict with `labels`, found {found} instead."
        )
    if any(isinstance(mark := batch.get(key), torch.Tensor) and bool(mark) for key in (REPEAT_KEY, FILLER_KEY)):
        return 0
    if "shift_labels" in batch:
        labels = batch["shift_labels"]
    else:
        labels = batch["labels"][..., 1:] if causal else batch["labels"]
    return int(labels.ne(IGNORE_INDEX).sum())


class LossTokens(BaseNode[Any]):
    """Give every batch ``num_items_in_batch``: the loss tokens of its optimizer step's window on all ranks.

    Each window is the next ``steps`` batches (the last one shorter); the count, a 0-d ``int64`` tensor on the
    ``labels`` device, is :func:`label_tokens` summed over the window and the ranks that share the data. The
    state holds the window's batches not yet given out and its count, so resume needs no other all-reduce.

    Args:
        source: The node below (equal steps, or the graph).
        steps: Batches per optimizer step, ``>= 1``.
        causal: Count ``labels[..., 1:]`` (a causal-LM loss, HF's rule) rather than ``labels``.
        across_ranks: Sum the count over the ranks (``False`` under ``shard("off")``).
        lockstep: Whether ranks take equal steps; without them several ranks are refused.
        group: The process group to sum in (default: the whole world).
        device: Where upstream batches are, for batches restored from a state.

    Example:
        >>> from torchdata.nodes import IterableWrapper
        >>> batches = [{"labels": torch.tensor([[-100, 1, 2]])}, {"labels": torch.tensor([[-100, 3, -100]])}]
        >>> [int(b["num_items_in_batch"]) for b in LossTokens(IterableWrapper(batches), steps=2)]
        [3, 3]
    """

    STATE = StateSchema(
        "LossTokens",
        1,
        source=Child(),
        window=ListOf(HeldBatch(labelled=True)),  # the window's batches not yet given out
        items=Int(0),  # the window's loss tokens over all ranks
        ended=Bool(),  # whether the source's epoch has ended
    )

    def __init__(
        self,
        source: BaseNode,
        *,
        steps: int,
        causal: bool = True,
        across_ranks: bool = True,
        lockstep: bool = True,
        group: Any = None,
        device: torch.device | None = None,
    ) -> None:
        super().__init__()
        positive("accumulation_steps", steps)
        check_bool("causal", causal)
        self.source, self.steps, self.causal = source, steps, causal
        self.settings = {"steps": steps, "causal": causal}  # what a state must match (its layer record's too)
        self.across_ranks, self.lockstep, self.group, self.device = across_ranks, lockstep, group, device
        self._sync: StepSync | None = None
        self._detected = False
        self._window = Held(device=device)  # the window's batches not yet given out
        self._items, self._ended = 0, False

    @classmethod
    def around(cls, source: dict[str, Any], settings: Mapping[str, Any]) -> dict[str, Any]:
        """The state of a stage that goes on from ``source`` (its upstream state) with no window read yet."""
        return cls.STATE.make(settings, source=source, window=[], items=0, ended=False)

    @classmethod
    def split(cls, state: dict[str, Any], settings: Mapping[str, Any]) -> Parts:
        """A saved state's upstream state and the window's batches it had not given out (checked first).

        Its window's end is no epoch's end: the stage below says whether the epoch ended.
        """
        loaded = cls.STATE.check(state, settings)
        return Parts(loaded.source, list(loaded.window))

    @property
    def in_lockstep(self) -> bool:
        """Whether steps are agreed with other ranks (the stage below's)."""
        return bool(getattr(self.source, "in_lockstep", False))

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        super().reset(initial_state)
        if not self._detected:
            self._sync = detect_sync(self.group) if self.across_ranks else None
            self._detected = True
            if self._sync is not None and not self.lockstep:
                raise ValueError(
                    "`accumulation_steps` sums each window's loss tokens over the ranks, so every rank must take "
                    "the same steps: `equal_steps` must be 'balance', 'repeat' or 'drop' under torch.distributed, but "
                    "is 'off' instead."
                )
        if initial_state is None:
            self.source.reset(None)
            self._window.clear()
            self._items, self._ended = 0, False
            return
        loaded = self.STATE.check(initial_state, self.settings)
        self.source.reset(loaded.source)
        self._window.restore(loaded.window)
        self._items, self._ended = loaded.items, loaded.ended

    def next(self) -> Any:
        if not self._window:
            self._read_window()
        batch = self._window.pop(0)
        return {**batch, ITEMS_KEY: torch.tensor(self._items, dtype=torch.int64, device=_device_of(batch))}

    def get_state(self) -> dict[str, Any]:
        source, window = self.source.state_dict(), self._window.saved()
        return self.STATE.make(self.settings, source=source, window=window, items=self._items, ended=self._ended)

    def _read_window(self) -> None:
        """Read the next window (``StopIteration`` when the epoch has none left) and count it over the ranks."""
        while not self._ended and len(self._window) < self.steps:
            try:
                self._window.append(next(self.source))
            except StopIteration:
                self._ended = True
        if not self._window:  # every rank ends here at the same step: equal steps
            raise StopIteration
        local = sum(label_tokens(b, causal=self.causal) for b in self._window)
        self._items = local if self._sync is None else self._sync.sum(local)


def _device_of(batch: dict[str, Any]) -> torch.device:
    labels = batch.get("shift_labels", batch.get("labels", batch.get("input_ids")))
    return labels.device if isinstance(labels, torch.Tensor) else torch.device("cpu")
