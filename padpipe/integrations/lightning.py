"""Lightning: resume from a mid-epoch checkpoint exactly, with the default training loop (docs/training.md).

Lightning saves a stateful train loader one batch late and from rank 0 only; the :class:`ExactResume` callback
fixes both through Lightning's public hooks, for a ``pipe.loader(...)`` or any stateful loader wrapped in
:class:`LightningLoader` (:mod:`padpipe.integrations.loader_guard` raises without it).

Example:
    >>> import lightning as L  # doctest: +SKIP
    >>> class Model(L.LightningModule):  # doctest: +SKIP
    ...     def train_dataloader(self):
    ...         return pipe.loader()
    ...     def training_step(self, batch, batch_idx): ...
    >>> trainer = L.Trainer(strategy="ddp", devices=2, callbacks=[ExactResume()])  # doctest: +SKIP
    >>> trainer.fit(Model(), ckpt_path="last.ckpt")  # doctest: +SKIP
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

from padpipe._optional import require
from padpipe.checkpoints import gathered, own_part
from padpipe.integrations.loader_guard import LOADER_SLOT, fit_trainer, held, hold, train_loaders
from padpipe.loader import PipelineLoader
from padpipe.runtime.held import Untrained
from padpipe.sharing.ranks import ranks
from padpipe.state import StateMismatchError

pl = require("lightning.pytorch", "padpipe.integrations.lightning")

MAX_AHEAD = 2
"""Batches yielded and not yet taken by the loop, at most: Lightning fetches one ahead."""
NEEDS_CALLBACK = (
    "LightningLoader needs `padpipe.integrations.lightning.ExactResume()` in `Trainer(callbacks=...)` (it tells the "
    "loader which batches were trained on), and must be returned from `train_dataloader()` only."
)


class LightningLoader:
    """A loader whose ``state_dict()`` is the position after the batches Lightning has trained on.

    Iterates ``loader`` (a ``pipe.loader(...)``, or any loader with ``state_dict`` and
    ``load_state_dict``); its state is :meth:`~padpipe.loader.PipelineLoader.checkpoint`'s: every
    rank's loader state and the batches fetched and not trained (on the CPU), which come first after
    ``load_state_dict``. A ``pipe.loader()`` keeps those itself; another loader's are kept here.
    Return it from ``train_dataloader()``, with :class:`ExactResume` in the ``Trainer``'s callbacks.

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

    def __init__(self, loader: Any) -> None:
        if not (callable(getattr(loader, "state_dict", None)) and callable(getattr(loader, "load_state_dict", None))):
            raise TypeError(
                f"`loader` must have state_dict() and load_state_dict() (e.g. pipe.loader()), but is a "
                f"{type(loader).__name__} instead."
            )
        self.loader = loader
        self._untrained = Untrained()  # another loader's batches fetched, not trained (a pipe.loader() keeps its own)
        self._untrained.keep(MAX_AHEAD)
        if isinstance(loader, PipelineLoader):
            loader.keep_untrained(MAX_AHEAD)

    def __iter__(self) -> Iterator[Any]:
        trainer = fit_trainer(self, "__iter__")  # at the first batch: Lightning's fit without the callback fails now
        if trainer is not None and not held(trainer):
            raise RuntimeError(NEEDS_CALLBACK)
        if isinstance(self.loader, PipelineLoader):  # it returns its restored batches first and counts the rest
            for batch in self.loader:
                if self.loader.untrained > MAX_AHEAD:
                    raise RuntimeError(NEEDS_CALLBACK)
                yield batch
            return
        kept = self._untrained
        kept.outstanding = 0
        for batch in self._restored_then(self.loader):
            kept.note(dict(batch) if isinstance(batch, dict) else batch)  # a step popping keys leaves it whole
            if kept.outstanding > MAX_AHEAD:
                raise RuntimeError(NEEDS_CALLBACK)
            yield batch

    def _restored_then(self, loader: Any) -> Iterator[Any]:
        while self._untrained.restored:
            yield self._untrained.restored.pop(0)
        yield from loader

    def taken(self) -> None:
        """Note that the training loop trained the oldest batch fetched (called by :class:`ExactResume`)."""
        if isinstance(self.loader, PipelineLoader):
            self.loader.trained()  # and its stats() count the batches trained
        else:
            self._untrained.outstanding = max(0, self._untrained.outstanding - 1)

    def state_dict(self) -> dict[str, Any]:
        """Every rank's loader state and its batches fetched but not trained (a collective under DDP)."""
        if isinstance(self.loader, PipelineLoader):
            return self.loader.checkpoint(untrained=self.loader.untrained)
        ahead = self._untrained.last(self._untrained.outstanding)
        return gathered(self.loader.state_dict(), ahead, getattr(self.loader, "group", None))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume this rank's share from ``state`` at the next ``iter()``.

        A ``pipe.loader()`` takes the checkpoint itself, on any number of ranks (an elastic resume,
        docs/elastic.md). Any other loader resumes on as many ranks as saved it.
        """
        if isinstance(self.loader, PipelineLoader):
            self.loader.load_state_dict(state)
            return
        parts = own_part(state)
        rank, world = ranks(getattr(self.loader, "group", None))
        if len(parts) != world:
            raise StateMismatchError(
                f"LightningLoader state was saved by {len(parts)} ranks, but this run has {world}: only a "
                "pipe.loader() resumes on another number of ranks (docs/elastic.md)."
            )
        self.loader.load_state_dict(parts[rank]["loader"])
        self._untrained.restore(parts[rank]["ahead"], getattr(self.loader, "device", None))


class ExactResume(pl.Callback):
    """Makes Lightning's checkpoints of the train loaders exact: every rank's position after the batches trained.

    It notes each batch trained (:meth:`~padpipe.loader.PipelineLoader.trained`) and puts the loader's
    :meth:`~padpipe.loader.PipelineLoader.checkpoint` where Lightning keeps the loader's state, so Lightning's own
    restore resumes it exactly; a :class:`LightningLoader` is told the batches trained. Warns when no train loader
    is either; refuses several train loaders (docs/training.md, "Lightning").

    Example:
        >>> trainer = L.Trainer(callbacks=[ExactResume()])  # doctest: +SKIP
    """

    def __init__(self) -> None:
        self._loaders: list[PipelineLoader[Any]] = []
        self._wrapped: list[LightningLoader] = []
        self._epochs: list[PipelineLoader[Any]] = []  # bare and wrapped: each reads Lightning's epoch

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        hold(trainer)  # before the fit's first batch, which Lightning fetches before on_train_start

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._find(trainer)
        loaders = train_loaders(trainer)
        if (self._wrapped or self._loaders) and len(loaders) > 1:
            raise RuntimeError(
                f"ExactResume resumes one train loader exactly, but train_dataloader() returns {len(loaders)}: mix "
                "their data in one pipeline (pp.mix) and return its pipe.loader()."
            )
        if not (self._wrapped or self._loaders):
            warnings.warn(
                "ExactResume: the train dataloader is neither a LightningLoader nor a pipe.loader(), so a resumed run "
                "will not continue exactly; return `pipe.loader(...)` from `train_dataloader()`.",
                stacklevel=2,
            )

    def _find(self, trainer: pl.Trainer) -> None:
        """The train loaders Lightning reads now (new ones each epoch with ``reload_dataloaders_every_n_epochs``)."""
        self._wrapped = [one for one in train_loaders(trainer) if isinstance(one, LightningLoader)]
        self._loaders = [one for one in train_loaders(trainer) if isinstance(one, PipelineLoader)]
        inner = [one.loader for one in self._wrapped if isinstance(one.loader, PipelineLoader)]
        self._epochs = self._loaders + inner
        for loader in self._loaders:
            loader.keep_untrained(MAX_AHEAD)  # it kept its first batch, fetched before this hook

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """After the step (a step that raised leaves its batch untrained; ``training_step(dataloader_iter)``
        fetches inside it). An epoch Lightning cuts short (``limit_train_batches``) ends for the loaders too."""
        for wrapped in self._wrapped:
            wrapped.taken()
        for loader in self._loaders:
            loader.trained()
        if trainer.fit_loop.batch_idx + 1 >= trainer.num_training_batches:  # (a dataloader_iter's batch_idx may lie)
            for loader in self._epochs:
                if loader.in_epoch:
                    loader.set_epoch(loader.epoch + 1)

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Make each loader read the epoch Lightning starts: through Lightning's ``iter`` where it calls one for this
        epoch (the test of its ``_TrainingEpochLoop.on_run_start``), else through a new one here."""
        self._find(trainer)
        epoch, loop = trainer.current_epoch, trainer.fit_loop
        iterates = epoch > 0 and not loop.is_resuming and not loop.epoch_loop.restarting
        stale = [one for one in self._epochs if iterates or one.epoch != epoch]
        for loader in stale:
            loader.set_epoch(epoch)
        if stale and not iterates:  # the iterator made at the fit's start reads another epoch
            iter(loop._data_fetcher)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        for loader in self._epochs:  # fit stopped inside an epoch (max_steps): Lightning counts it as done
            if trainer.current_epoch > loader.epoch:
                loader.set_epoch(trainer.current_epoch)

    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict) -> None:
        stateful = [one for one in _flattened(trainer) if callable(getattr(one, "state_dict", None))]
        if not any(isinstance(one, PipelineLoader) for one in stateful):
            return
        *path, key = LOADER_SLOT
        fit_state = checkpoint
        for name in path:
            fit_state = fit_state.get(name) if isinstance(fit_state, dict) else None
        if not isinstance(fit_state, dict) or len(fit_state.get(key, ())) != len(stateful):
            raise RuntimeError(
                f"ExactResume: Lightning's checkpoint keeps no state of its {len(stateful)} stateful train loaders "
                f"under {'/'.join(LOADER_SLOT)}, where this padpipe knows it; use a Lightning version padpipe was "
                "tested with (docs/install.md)."
            )
        states = list(fit_state[key])
        for i, loader in enumerate(stateful):
            if isinstance(loader, PipelineLoader):
                states[i] = loader.checkpoint(untrained=loader.untrained)
        fit_state[key] = states


def _flattened(trainer: pl.Trainer) -> list[Any]:
    """The train loaders in the order Lightning keeps their states (its ``CombinedLoader``'s)."""
    loaders = trainer.train_dataloader
    return [] if loaders is None else list(pl.utilities.CombinedLoader(loaders).flattened)
