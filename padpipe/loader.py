"""The loader users iterate: one pass per epoch over a built pipeline, resumable, with stats."""

from __future__ import annotations

from typing import Any, Generic, Iterator, TypeVar

from torchdata.nodes import BaseNode

from padpipe._iterable import start_at_epoch
from padpipe._state import Bool, Child, Optional, check_state, make_state
from padpipe.stats import PipelineStats, StatsSnapshot

T = TypeVar("T")


class PipelineLoader(Generic[T]):
    """Iterable over a built pipeline: each ``iter(loader)`` is the next epoch, resumable mid-epoch.

    ``state_dict()`` at any step and ``load_state_dict()`` on a loader of the same pipeline (in
    this process or a new one) continue with exactly the batches that would have come next. At an
    epoch's end the state says whether the epoch was finished (the ``for`` loop ended) or its
    last batch was just taken (still inside the loop), so the ordinary loop resumes right:

    * a state taken inside the loop after the epoch's last batch resumes with nothing left of
      that epoch (the next ``iter`` yields no batch), then the following epoch;
    * a state taken after the loop ended resumes with the next epoch.

    This is what ``torchdata``'s ``StatefulDataLoader`` does, so both loaders agree.

    Args:
        root: The built node graph (equal steps and worker processes included).
        stats: The counters its stages report into.
        settings: What a loaded state must match (e.g. the number of worker processes).

    Example:
        >>> pipe = pp.from_iterable([{"text": "a"}, {"text": "b"}]).tokenize(pp.examples.tokenizer()).batch(1).pad()
        >>> loader = pipe.loader()
        >>> first = next(iter(loader)); state = loader.state_dict()
        >>> again = pipe.loader(); again.load_state_dict(state)
        >>> len(list(again)), len(list(again))  # the rest of epoch 0, then all of epoch 1
        (1, 2)
    """

    VERSION = 1
    ROOT_KEY = "root"
    FINISHED_KEY = "finished"

    def __init__(self, root: BaseNode[T], stats: PipelineStats, *, settings: dict[str, Any] | None = None) -> None:
        self.root = root
        self._stats = stats
        self._settings = dict(settings or {})
        self._pending: dict[str, Any] | None = None
        self._started = False
        self._finished = False

    def __iter__(self) -> Iterator[T]:
        """Start the next epoch (or continue a loaded state) and return its iterator."""
        pending, self._pending = self._pending, None
        if pending is not None and pending[self.ROOT_KEY] is not None:
            self.root.reset(pending[self.ROOT_KEY])
            if pending[self.FINISHED_KEY]:
                self.root.reset(None)
        else:
            if pending is not None:  # a state saved before the first batch: start at epoch 0
                start_at_epoch(self.root, 0)
            self.root.reset(None)
        self._started, self._finished = True, False
        return _Epoch(self)

    def state_dict(self) -> dict[str, Any]:
        """The position after the last batch this loader returned (see the class docs)."""
        if self._pending is not None:
            return self._pending
        root = self.root.state_dict() if self._started else None
        return make_state(version=self.VERSION, settings=self._settings,
                          **{self.ROOT_KEY: root, self.FINISHED_KEY: self._finished})

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` at the next ``iter(loader)``."""
        fields = {self.ROOT_KEY: Optional(Child()), self.FINISHED_KEY: Bool()}
        check_state("PipelineLoader", state, version=self.VERSION, settings=self._settings, fields=fields)
        self._pending = dict(state)

    def stats(self) -> StatsSnapshot:
        """Rows, real and padded tokens, padding efficiency, skipped rows and time per stage so far."""
        return self._stats.snapshot()



class _Epoch(Iterator[T]):
    """One epoch of a loader: the root's items; the loader learns when the epoch ended.

    Not a generator: after an error the next ``next()`` asks the root again, which raises the same
    error (a failed pipeline stays failed) instead of ending the epoch quietly.
    """

    def __init__(self, loader: PipelineLoader[T]) -> None:
        self._loader = loader

    def __iter__(self) -> _Epoch[T]:
        return self

    def __next__(self) -> T:
        try:
            return next(self._loader.root)
        except StopIteration:
            self._loader._finished = True
            raise
