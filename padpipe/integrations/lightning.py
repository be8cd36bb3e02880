"""Lightning: resume from a mid-epoch checkpoint exactly, with the default training loop.

A bare ``pipe.loader(...)`` returned from ``train_dataloader()`` needs nothing from here: when
Lightning's fit loop reads, saves or restores it, the loader itself keeps every rank's position
after the batches trained and follows Lightning's epochs (:mod:`padpipe.integrations.lightning_fit`).

The pieces here do the same for any loader with ``state_dict``/``load_state_dict`` (a
``StatefulDataLoader``, a loader of your own), whose own state Lightning would save one batch late
(its loop fetches a batch ahead) and from rank 0 only:

- :class:`LightningLoader` wraps the loader; its state is the loader's plus the batches fetched
  but not yet trained (the first ones yielded after a resume), gathered from every rank.
- :class:`ExactResume` is the callback that tells it which batches the loop has taken.

Example:
    >>> import lightning as L  # doctest: +SKIP
    >>> class Model(L.LightningModule):  # doctest: +SKIP
    ...     def train_dataloader(self):
    ...         return LightningLoader(pipe.loader())
    ...     def training_step(self, batch, batch_idx): ...
    >>> trainer = L.Trainer(strategy="ddp", devices=2, callbacks=[ExactResume()])  # doctest: +SKIP
    >>> trainer.fit(Model(), ckpt_path="last.ckpt")  # doctest: +SKIP
"""

from __future__ import annotations

import warnings
from collections import deque
from collections.abc import Iterator
from typing import Any

from padpipe._optional import require
from padpipe.loader import PipelineLoader
from padpipe.pipes.batch_tensors import to_cpu, to_device
from padpipe.sharing.ranks import all_ranks, ranks
from padpipe.state import ListOf, Plain, StateSchema

pl = require("lightning.pytorch", "padpipe.integrations.lightning")

MAX_AHEAD = 2
"""Batches yielded and not yet taken by the loop, at most: Lightning fetches one ahead."""


class LightningLoader:
    """A loader whose ``state_dict()`` is the position after the batches Lightning has trained on.

    Iterates ``loader`` (a ``pipe.loader(...)``, or any loader with ``state_dict`` and
    ``load_state_dict``), remembering the batches Lightning has fetched but not yet given to
    ``training_step`` (one, as Lightning fetches ahead). Its state holds the loader's state and
    those batches, for every rank (rank 0 writes the checkpoint for all); after
    ``load_state_dict`` it yields them first, so training continues with exactly the batch that
    comes next. Return it from ``train_dataloader()`` and add :class:`ExactResume` to the
    ``Trainer``'s callbacks. States are plain data (the loader's state and batch tensors, kept on
    the CPU and moved back to the loader's ``device`` when yielded after a resume), so
    checkpoints load with Lightning's default ``weights_only``.

    Args:
        loader: The loader to wrap.

    Raises:
        TypeError: If ``loader`` has no ``state_dict``/``load_state_dict``.

    Example:
        >>> pipe = pp.from_iterable([{"text": "a"}, {"text": "b c"}]).tokenize(pp.examples.tokenizer()).batch(1).pad()
        >>> loader = LightningLoader(pipe.loader())
        >>> batches = iter(loader); first, second = next(batches), next(batches)  # Lightning fetches one ahead
        >>> loader.taken()  # ExactResume: the loop took the first batch
        >>> state = loader.state_dict()  # the second is not trained yet: it is in the state
        >>> again = LightningLoader(pipe.loader()); again.load_state_dict(state)
        >>> [b["input_ids"].shape for b in again]  # the second batch, then the epoch ends
        [torch.Size([1, 4])]
    """

    STATE = StateSchema(
        "LightningLoader", 2, ranks=ListOf(Plain())
    )  # ranks: per rank, {"loader": its loader state, "ahead": its batches fetched and not trained}

    def __init__(self, loader: Any) -> None:
        if not (callable(getattr(loader, "state_dict", None)) and callable(getattr(loader, "load_state_dict", None))):
            raise TypeError(
                f"`loader` must have state_dict() and load_state_dict() (e.g. pipe.loader()), but is a "
                f"{type(loader).__name__} instead."
            )
        self.loader = loader
        self._ahead: deque[Any] = deque()
        self._restored: list[Any] = []
        self._resumed = False

    def __iter__(self) -> Iterator[Any]:
        self._ahead.clear()
        restored = [to_device(b, getattr(self.loader, "device", None)) for b in self._restored]
        self._restored = []
        resumed, self._resumed = self._resumed, False
        empty = True
        for batch in _chain(restored, self.loader):
            empty = False
            self._ahead.append(_copy(batch))
            if len(self._ahead) > MAX_AHEAD:
                raise RuntimeError(
                    "LightningLoader: the training loop took no batch from it: add "
                    "`padpipe.integrations.lightning.ExactResume()` to `Trainer(callbacks=...)` (it tells the loader "
                    "which batches were trained on), and return the loader from `train_dataloader()` only."
                )
            yield batch
        if empty and resumed:  # saved right after an epoch's last batch: that epoch is over, read the next
            yield from self

    def taken(self) -> None:
        """Note that the training loop took the oldest batch fetched (called by :class:`ExactResume`)."""
        if self._ahead:
            self._ahead.popleft()

    def state_dict(self) -> dict[str, Any]:
        """Every rank's loader state and its batches fetched but not trained yet (a collective under DDP)."""
        mine = {"loader": self.loader.state_dict(), "ahead": [to_cpu(b) for b in self._ahead]}
        return self.STATE.make({}, ranks=all_ranks(mine, getattr(self.loader, "group", None)))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume this rank's share from ``state`` at the next ``iter()``.

        On another number of ranks (an elastic resume, docs/elastic.md) every saved rank's loader
        state goes to the loader, with the batches each had fetched ahead, which the loader shares
        out with the rest of the epoch.
        """
        rank, world = ranks(getattr(self.loader, "group", None))
        saved = self.STATE.check(state, {}).ranks
        if len(saved) == world:
            mine = saved[rank]
            self.loader.load_state_dict(mine["loader"])
            self._restored = list(mine["ahead"])
        else:  # the batches fetched ahead are shared out with the rest of the epoch: equal steps on every rank
            ahead = {r: list(one["ahead"]) for r, one in enumerate(saved)}
            self.loader.load_state_dict([r["loader"] for r in saved], ahead=ahead)
            self._restored = []
        self._resumed = True


class ExactResume(pl.Callback):
    """Tells every :class:`LightningLoader` of the fit which batches the loop has taken.

    Warns at the start of training when the train loader is neither a :class:`LightningLoader` nor a
    ``pipe.loader(...)`` (which needs no callback).

    Example:
        >>> trainer = L.Trainer(callbacks=[ExactResume()])  # doctest: +SKIP
    """

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not _loaders(trainer, (LightningLoader, PipelineLoader)):
            warnings.warn(
                "ExactResume: the train dataloader is neither a LightningLoader nor a pipe.loader(), so a resumed run "
                "will not continue exactly; return `pipe.loader(...)` from `train_dataloader()`.",
                stacklevel=2,
            )

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        for loader in _loaders(trainer):
            loader.taken()


def _loaders(trainer: pl.Trainer, kinds: tuple[type, ...] = (LightningLoader,)) -> list[Any]:
    found, todo = [], [trainer.train_dataloader]
    while todo:
        item = todo.pop()
        if isinstance(item, kinds):
            found.append(item)
        elif isinstance(item, dict):
            todo.extend(item.values())
        elif isinstance(item, (list, tuple)):
            todo.extend(item)
    return found


def _chain(first: list[Any], loader: Any) -> Iterator[Any]:
    yield from first
    yield from loader


def _copy(batch: Any) -> Any:
    """A shallow copy, so a ``training_step`` that pops keys does not change the batch kept for the state."""
    return dict(batch) if isinstance(batch, dict) else batch
