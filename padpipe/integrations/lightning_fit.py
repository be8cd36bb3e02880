"""Lightning's fit loop reading a bare ``pipe.loader()``: the loader's own hook for an exact resume.

Lightning checkpoints a train loader that has ``state_dict``/``load_state_dict``, but as it stands
that state would resume wrong in three ways: the loop fetches a batch ahead, so the loader's position
is past the last trained batch; only rank 0 writes the checkpoint and every rank loads rank 0's
state; and Lightning counts an epoch as done when ``fit`` stops at ``max_steps``, while the loader
would go on with the rest of it. When the calls come from Lightning's fit loop (seen in the calling
frames, as :mod:`padpipe.integrations.guard` does; nothing here imports Lightning), the loader
hands them to a :class:`FitDriver`: its state is every rank's loader state plus the batches fetched
and not trained, and each epoch starts at the epoch Lightning is about to run.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Iterator
from types import FrameType
from typing import Any

from padpipe.checkpoints import own_part
from padpipe.integrations.frames import caller_of, self_of, takes_self
from padpipe.sharing.ranks import ranks
from padpipe.state import Child, Int, StateMismatchError, StateSchema

MAX_DEPTH = 16
"""Frames looked at above the loader's method (Lightning's fit loop is 5-7 above)."""
LOADER_METHODS = ("__iter__", "state_dict", "load_state_dict")
"""The ``PipelineLoader`` methods whose caller may be Lightning's fit loop."""

ADAPTER = "padpipe.integrations.lightning.LightningLoader(pipe.loader(...)) with the ExactResume() callback"
_COMBINED = ("lightning.pytorch.utilities.combined_loader", "pytorch_lightning.utilities.combined_loader")
_LOOPS = ("lightning.pytorch.loops.", "pytorch_lightning.loops.")
FIT_LOOPS = (
    "_FitLoop",
    "_TrainingEpochLoop",
)  # the loop reading the loader when it trains (the latter's .trainer.fit_loop)
OTHER_LOOPS = ("_EvaluationLoop", "_PredictionLoop")  # validation, test, predict: not driving, the loader is bare

CONTACTS = (
    # (module, attribute path): every private name of Lightning this adapter reads (tests/integrations pins each)
    ("lightning.pytorch.utilities.combined_loader", "CombinedLoader"),
    ("lightning.pytorch.loops", "_FitLoop"),
    ("lightning.pytorch.loops", "_TrainingEpochLoop"),
    ("lightning.pytorch.loops", "_EvaluationLoop"),
    ("lightning.pytorch.loops", "_PredictionLoop"),
    ("lightning.pytorch.loops.fetchers", "_PrefetchDataFetcher"),
    ("lightning.pytorch.loops.fetchers", "_DataLoaderIterDataFetcher"),
    ("lightning.pytorch.loops.fetchers", "_PrefetchDataFetcher.prefetch_batches"),  # set on the instance too
    ("lightning.pytorch.loops.fit_loop", "_FitLoop._data_fetcher"),  # set in __init__ (checked on an instance)
    ("lightning.pytorch.loops.fit_loop", "_FitLoop.epoch_progress.current.processed"),
)
"""Lightning's private names this adapter reads, as (module, attribute path)."""
_drivers: weakref.WeakKeyDictionary[Any, FitDriver] = weakref.WeakKeyDictionary()


def fit_driver(loader: Any) -> FitDriver | None:
    """The driver of ``loader`` when Lightning's fit loop made the call in progress, else ``None``.

    Called by ``PipelineLoader.__iter__``, ``state_dict`` and ``load_state_dict``: the call counts
    as Lightning's when the first caller frame that has a ``self`` is Lightning's ``CombinedLoader``
    (not padpipe's own adapters, nor user code) and a loop above it is the fit loop (not validation).

    Example:
        >>> pipe = pp.from_iterable([{"text": "a"}]).tokenize(pp.examples.tokenizer()).batch(1).pad()
        >>> fit_driver(pipe.loader()) is None  # called from here, not by Lightning
        True
    """
    if not any(name.split(".")[0] in sys.modules for name in _COMBINED):
        return None
    fit_loop = _fit_loop(caller_of(loader, LOADER_METHODS))
    if fit_loop is None:
        return None
    driver = _drivers.get(loader)
    if driver is None:
        driver = _drivers[loader] = FitDriver(loader)
    driver.fit_loop = fit_loop
    return driver


def _fit_loop(frame: FrameType | None) -> Any:
    """Lightning's fit loop if ``frame`` (the loader's caller) is its ``CombinedLoader`` under it, else ``None``."""
    combined = False
    for _ in range(MAX_DEPTH):
        if frame is None:
            return None
        here, frame = frame, frame.f_back
        if not takes_self(here):  # a function or comprehension: look further up
            continue
        if not combined:  # the first caller that is a method must be Lightning's CombinedLoader's (or its iterator's)
            if here.f_globals.get("__name__") not in _COMBINED:
                return None
            combined = True
            continue
        owner = self_of(here, _LOOPS)
        name = type(owner).__name__
        if owner is not None and name.endswith("Loop"):  # the loop reading it: fit, or evaluation
            if name in OTHER_LOOPS:
                return None
            if name in FIT_LOOPS:
                return owner if name == FIT_LOOPS[0] else owner.trainer.fit_loop
            raise RuntimeError(_unknown(f"its loop {name}"))
    raise RuntimeError(_unknown(f"no loop of {sorted(FIT_LOOPS + OTHER_LOOPS)} within {MAX_DEPTH} frames"))


def _unknown(found: str) -> str:
    """The message for a Lightning structure this adapter does not know, while Lightning drives the loader."""
    return (
        f"padpipe.integrations.lightning_fit: Lightning's CombinedLoader is reading pipe.loader(), but {found} is "
        "not what this adapter knows, so it cannot tell which batches were trained (an exact resume needs it). "
        f"Use {ADAPTER}, or a Lightning version padpipe was tested with (README, Install)."
    )


class FitDriver:
    """What a ``PipelineLoader`` does when Lightning's fit loop reads, saves or restores it.

    Its state holds ``epoch`` (the epoch the loader was reading) and the loader's
    :meth:`~padpipe.loader.PipelineLoader.checkpoint`: every rank's position and the batches
    Lightning had fetched but not trained (a count this driver reads off Lightning's data fetcher;
    gathered over the loader's group, a collective as Lightning's checkpoint already is). After a
    restore those batches come first; each ``iter`` starts at the epoch Lightning runs next (its
    ``epoch_progress.current.processed``), where the loaded position goes on only if it is inside
    that epoch.

    Args:
        loader: The ``PipelineLoader`` (its ``iter``, ``state_dict`` and ``load_state_dict`` are
            called from here as they are outside Lightning).
    """

    STATE = StateSchema("PipelineLoader (under Lightning)", 2, epoch=Int(0), checkpoint=Child())

    def __init__(self, loader: Any) -> None:
        self._loader = weakref.ref(loader)  # the loader keys its driver: a strong reference would keep both alive
        self.fit_loop: Any = None
        self.epoch = 0
        self._loaded: dict[str, Any] | None = None  # a state loaded and not yet started
        self._loaded_at: tuple[int, bool] = (0, False)  # its epoch, and whether the loader had finished it

    @property
    def loader(self) -> Any:
        """The ``PipelineLoader`` driven."""
        return self._loader()

    def iterate(self) -> Iterator[Any]:
        """The epoch Lightning runs next: the loaded position if it lies in it, else that epoch from its start."""
        target = self.fit_loop.epoch_progress.current.processed
        epoch, finished = self._loaded_at
        goes_on = self._loaded is not None and (epoch == target or finished and target == epoch + 1)
        if goes_on:
            self.epoch = epoch + 1 if finished else epoch
        else:
            self.loader.set_epoch(target)  # and forgets batches restored for another epoch
            self.epoch = target
        self._loaded = None
        self.loader.keep_untrained(max(1, getattr(self.fit_loop._data_fetcher, "prefetch_batches", 1)))
        return iter(self.loader)

    def state_dict(self) -> dict[str, Any]:
        """Every rank's loader state and untrained batches (see the class docs)."""
        if self._loaded is not None:  # restored and not started: the same position
            return self._loaded
        ahead = self._ahead(self.loader.state_dict()["finished"])
        return self.STATE.make({}, epoch=self.epoch, checkpoint=self.loader.checkpoint(untrained=ahead))

    def load_state_dict(self, state: Any) -> None:
        """Restore this rank's share of ``state`` (on another number of ranks, every rank's: an elastic resume)."""
        if not isinstance(state, dict) or not set(self.STATE.fields) <= set(state):
            found = sorted(state) if isinstance(state, dict) else type(state).__name__
            raise StateMismatchError(
                f"Lightning is restoring pipe.loader() from a checkpoint whose loader state was not saved by "
                f"pipe.loader() under Lightning (an older padpipe's state is one batch past the trained steps, or "
                f"it is a LightningLoader's): expected keys {sorted(self.STATE.fields)}, found {found}. Resume it "
                f"with the train_dataloader() that saved it ({ADAPTER}), or from a checkpoint saved by this padpipe."
            )
        saved = self.STATE.check(state, {})
        parts = own_part(saved.checkpoint)
        rank, world = ranks(getattr(self.loader, "group", None))
        finished_key = "finished"
        if len(parts) == world:
            finished = parts[rank]["loader"][finished_key]
        else:  # the batches fetched ahead are shared out with the rest of the epoch: equal steps on every rank
            finished = all(one["loader"][finished_key] for one in parts)
        self.loader.load_state_dict(saved.checkpoint)
        self._loaded, self._loaded_at = state, (saved.epoch, finished)

    def _ahead(self, finished: bool) -> int:
        """How many of the batches yielded Lightning has fetched and not trained yet."""
        fetcher = self.fit_loop._data_fetcher
        if fetcher is None:  # fit is over (torn down): Lightning counts its last epoch as done
            if (
                finished
                or not self.loader.kept_untrained
                or self.fit_loop.epoch_progress.current.processed > self.epoch
            ):
                return 0
            raise RuntimeError(
                f"pipe.loader() under Lightning: a checkpoint saved after fit stopped inside epoch {self.epoch} "
                "(interrupted) cannot hold the batches Lightning had fetched ahead, so a resume would skip them; "
                "resume from a ModelCheckpoint saved during fit instead."
            )
        batches = getattr(fetcher, "batches", None)
        if isinstance(batches, list):  # _PrefetchDataFetcher: the batches fetched ahead
            if len(batches) > self.loader.kept_untrained:
                raise RuntimeError(
                    f"pipe.loader() under Lightning: the loop holds {len(batches)} batches fetched ahead, but the "
                    f"loader kept {self.loader.kept_untrained}; use {ADAPTER}."
                )
            return len(batches)
        if type(fetcher).__name__ == "_DataLoaderIterDataFetcher":  # training_step(dataloader_iter): no prefetch
            return 0
        raise RuntimeError(
            f"pipe.loader() under Lightning: unknown data fetcher {type(fetcher).__name__} (expected Lightning's "
            f"_PrefetchDataFetcher or _DataLoaderIterDataFetcher), so the batches trained are unknown; use {ADAPTER}."
        )
