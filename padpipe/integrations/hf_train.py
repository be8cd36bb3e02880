"""``padpipe.hf.Trainer``'s training batches: one pass over the data per Trainer epoch, as HF runs a sized loader.

A pass has no length before it ends, so :class:`PassLength` gives HF's loop for a loader without one what a
length would; :class:`TrainBatches` counts each pass's batches, rows and real tokens, and saves where it is.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch

from padpipe.runtime.loss_tokens import ITEMS_KEY
from padpipe.runtime.rebalance import FILLER_KEY
from padpipe.state import Bool, Child, Int, StateSchema

_END = object()


class Batch(dict):
    """A training batch, with its real tokens (``tokens``) and its window's ``num_items_in_batch`` (``loss_items``)."""

    tokens: int = 0
    loss_items: torch.Tensor | None = None


class PassLength(int):
    """``steps_in_epoch`` for ``Trainer._run_epoch`` over a pipeline, whose pass length is known at its end.

    Its value is HF's bound for a loader without a length. Once the pass has ended, ``step + 1 ==
    steps_in_epoch`` holds at its last batch (so HF closes the last, short window with its own
    optimizer step), and ``(step + 1) / steps_in_epoch`` counts the batches read before a resume too.

    Example:
        >>> batches = TrainBatches([], dict)
        >>> length = PassLength(40, batches); batches.ended, batches.read = True, 3
        >>> (3 == length, 40 == length, 2 / length)
        (True, False, 0.05)
    """

    _batches: TrainBatches

    def __new__(cls, value: int, batches: TrainBatches) -> PassLength:
        self = super().__new__(cls, value)
        self._batches = batches
        return self

    def __eq__(self, other: object) -> bool:
        if self._batches.ended and isinstance(other, int):
            return other == self._batches.read
        return int(self) == other

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = int.__hash__

    def __rtruediv__(self, other: Any) -> float:
        return (other + self._batches.offset) / int(self)


class TrainBatches:
    """A pipeline loader's training batches, one pass per ``iter``, unused columns removed, resumable.

    Args:
        loader: The pipeline's loader (each ``iter`` is its next epoch).
        columns: The model's columns of a batch (``remove_unused_columns``).
        tokens: The real (not padding) tokens of a batch as padpipe made it.

    Example:
        >>> filler = {"input_ids": torch.ones(1, 3), "is_filler": torch.tensor(True)}
        >>> batches = TrainBatches([{"input_ids": torch.ones(2, 3)}, filler], dict)
        >>> [sorted(b) for b in batches], batches.rows, batches.read, batches.ended  # a filler's row is no row trained
        ([['input_ids'], ['input_ids', 'is_filler']], 2, 2, True)
    """

    PASS = dict(epoch=Int(0), batches=Int(0), ended=Bool())  # the pass being read, its batches read, whether it ended
    STATE = StateSchema("padpipe.hf.Trainer", 2, checkpoint=Child(), **PASS)  # checkpoint: loader.checkpoint()

    def __init__(
        self, loader: Any, columns: Callable[[dict], dict], tokens: Callable[[dict], int] = lambda batch: 0
    ) -> None:
        self.loader, self._columns, self._tokens = loader, columns, tokens
        self.rows = 0
        self.epoch = 0  # the pass being read (or the next, once ``ended``): Trainer's epoch
        self.read = 0  # batches of this pass read by this iteration
        self.offset = 0  # batches of this pass read before a resume
        self.ended = False
        self._it: Iterator[Any] | None = None
        self._peeked: Any = _END
        self._started = self._resumed = False

    def __iter__(self) -> Iterator[Batch]:
        if self._started and not self._resumed:
            self.epoch, self.offset = self.epoch + 1, 0
        self._started, self._resumed = True, False
        self.read, self.ended, self._peeked = 0, False, _END
        self._it = iter(self.loader)
        while (batch := self._next()) is not _END:
            self.read += 1
            self.rows += 0 if bool(batch.get(FILLER_KEY, False)) else _rows(batch)  # a filler trains no row
            out = Batch(self._columns({k: v for k, v in batch.items() if k != ITEMS_KEY}))
            out.tokens, out.loss_items = self._tokens(batch), batch.get(ITEMS_KEY)
            if FILLER_KEY in batch:  # equal steps' filler: compute_loss zeroes its loss
                out[FILLER_KEY], out.tokens = batch[FILLER_KEY], 0
            yield out

    def state_dict(self) -> dict[str, Any]:
        """Where the data stands after the last batch given out: every rank's ``loader.checkpoint()`` and the pass.

        A collective over the loader's ranks. It reads one batch ahead to learn whether the pass ended; that
        batch is kept in the checkpoint as fetched and not trained (the loader must keep one: ``keep_untrained(1)``).
        """
        self.peek()
        return self.STATE.make(
            {},
            checkpoint=self.loader.checkpoint(untrained=int(self._peeked is not _END)),
            epoch=self.epoch,
            batches=self.offset + self.read,
            ended=self.ended,
        )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a :meth:`state_dict` (this rank's part, or on another number of ranks the elastic share of
        them all)."""
        loaded = self.STATE.check(state, {})
        self.loader.load_state_dict(loaded.checkpoint)
        self.ended = False
        self.epoch = loaded.epoch + loaded.ended
        self.offset = 0 if loaded.ended else loaded.batches
        self._started = self._resumed = True

    def peek(self) -> bool:
        """Whether the pass has no batch after the last one given out (read one ahead, given out next)."""
        if self._it is not None and not self.ended and self._peeked is _END:
            self._peeked = self._next()
        return self.ended

    def _next(self) -> Any:
        if self._peeked is not _END:
            batch, self._peeked = self._peeked, _END
            return batch
        if self.ended or self._it is None:
            return _END
        try:
            return next(self._it)
        except StopIteration:
            self.ended = True
            return _END


def _rows(batch: dict) -> int:
    ids = batch.get("input_ids")
    return int(ids.shape[0]) if isinstance(ids, torch.Tensor) else 0


def real_tokens(pad_id: int | None, label_pad_id: int) -> Callable[[dict], int]:
    """Count a padpipe batch's real tokens: ``attention_mask`` of padded rows, all but each packed row's padding.

    A packed row's padding is its last segment (``cu_seq_lens_q``) when every slot there holds
    ``pad_id`` and ``label_pad_id``.

    Example:
        >>> count = real_tokens(0, -100)
        >>> count({"input_ids": torch.tensor([[5, 6, 7, 0]]), "labels": torch.tensor([[-100, 6, -100, -100]]),
        ...        "cu_seq_lens_q": torch.tensor([0, 2, 3, 4])})
        3
        >>> count({"input_ids": torch.ones(2, 4), "attention_mask": torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0]])})
        5
    """

    def count(batch: dict) -> int:
        ids, cu = batch["input_ids"], batch.get("cu_seq_lens_q")
        if cu is not None and pad_id is not None and "labels" in batch:
            rows, length = ids.shape
            starts = cu[:-1].long()
            ends = torch.arange(1, rows + 1, device=ids.device) * length
            last = starts[torch.searchsorted(starts, ends) - 1]  # each row's last segment
            real = ((ids.reshape(-1) != pad_id) | (batch["labels"].reshape(-1) != label_pad_id)).long()
            seen = torch.cat([real.new_zeros(1), real.cumsum(0)])
            padding = torch.where(seen[ends] == seen[last], ends - last, 0)
            return int(rows * length - padding.sum())
        mask = batch.get("attention_mask")
        if isinstance(mask, torch.Tensor) and mask.dim() == 2:
            return int(mask.sum())
        return int(ids.numel())

    return count


def counts_as_hf(trainer: Any) -> bool:
    """Whether the loader's ``num_items_in_batch`` is what ``Trainer._get_num_items_in_batch`` would compute.

    It is when HF sums the count over the ranks too (``average_tokens_across_devices``, or one
    process) and divides it by nothing (no ``DataParallel``, tensor, context or sequence parallelism).
    """
    args = trainer.args
    split = trainer.get_tp_size() * trainer.get_cp_size() * trainer.get_sp_size()
    return (args.average_tokens_across_devices or args.world_size == 1) and args.n_gpu <= 1 and split == 1


def loader_items(trainer: Any, batches: list[Any], device: Any) -> torch.Tensor | None:
    """The loader's count of ``batches`` (one window) where HF would count it, on ``device``; else ``None``.

    Example:
        >>> from types import SimpleNamespace as Fake
        >>> args, one = Fake(average_tokens_across_devices=True, world_size=1, n_gpu=1), lambda: 1
        >>> hf = Fake(args=args, model_accepts_loss_kwargs=True, compute_loss_func=None, get_tp_size=one,
        ...           get_cp_size=one, get_sp_size=one)
        >>> batch = Batch(labels=torch.tensor([[1, 2]])); batch.loss_items = torch.tensor(7)
        >>> loader_items(hf, [batch], "cpu")
        tensor(7)
    """
    if not batches or not all(isinstance(b, Batch) and b.loss_items is not None for b in batches):
        return None
    if "labels" not in batches[0] or not (trainer.model_accepts_loss_kwargs or trainer.compute_loss_func is not None):
        return None  # HF counts nothing either: the caller asks HF
    return batches[0].loss_items.to(device) if counts_as_hf(trainer) else None
