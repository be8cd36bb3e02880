"""The loader users iterate: one pass per epoch over a built pipeline, resumable, with stats."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any, Generic, TypeVar

from torchdata.nodes import BaseNode

from padpipe.checkpoints import check_nesting, gathered, is_checkpoint, one_checkpoint, own_part
from padpipe.drivers import check_loader_call
from padpipe.errors import non_negative
from padpipe.graph import start_at_epoch
from padpipe.runtime.assemble import LoaderOptions, assemble
from padpipe.runtime.held import Untrained
from padpipe.runtime.loader_state import LOADER_STATE
from padpipe.stage import Recipe
from padpipe.state import StateMismatchError
from padpipe.stats import StatsSnapshot

T = TypeVar("T")


class PipelineLoader(Generic[T]):
    """Iterable over a built pipeline: each ``iter(loader)`` is the next epoch, resumable mid-epoch.

    ``state_dict()`` at any step and ``load_state_dict()`` on a loader of the same pipeline (in this process or a
    new one) continue with exactly the batches that would have come next; a state taken at an epoch's end, inside
    the ``for`` loop or after it, resumes right, as ``torchdata``'s ``StatefulDataLoader`` (docs/state.md, "Resume
    in your loop"). An ``iter`` whose epoch returned no batch and did not end leaves that epoch unspent: the next
    ``iter`` starts it again (a framework that calls ``iter`` once to check the loader moves no epoch on). A loop
    that fetches batches ahead of the step it trains (Lightning's) notes them with :meth:`trained` and saves them
    with :meth:`checkpoint` (docs/training.md).

    Args:
        pipeline: The recipe it reads.
        options: How it runs it (:meth:`padpipe.Pipeline.loader`'s arguments).

    Example:
        >>> pipe = pp.from_iterable([{"text": "a"}, {"text": "b"}]).tokenize(pp.examples.tokenizer()).batch(1).pad()
        >>> loader = pipe.loader()
        >>> first = next(iter(loader)); state = loader.state_dict()
        >>> again = pipe.loader(); again.load_state_dict(state)
        >>> len(list(again)), len(list(again))  # the rest of epoch 0, then all of epoch 1
        (1, 2)
    """

    STATE = LOADER_STATE

    def __init__(self, pipeline: Recipe, options: LoaderOptions) -> None:
        self.pipeline, self.options = pipeline, options
        self._built = assemble(pipeline, options)
        self.root: BaseNode[T] = self._built.root
        self.device, self.group = self._built.device, options.group  # read by wrappers that restore batches
        self._untrained = Untrained()
        self._pending: dict[str, Any] | None = None
        self._started = self._finished = False
        self._epoch, self._step = -1, 0
        self._returned = 0  # batches returned to the loop, every epoch (stats().batches)
        self._trained: int | None = None  # batches its trainer noted trained (stats().batches once it notes)
        self._unspent = False  # the running epoch started from its start and has returned no batch, nor ended

    @property
    def epoch(self) -> int:
        """The epoch the last returned batch belongs to (the one running now); -1 before the first ``iter``."""
        return self._epoch

    @property
    def in_epoch(self) -> bool:
        """Whether the epoch of the last ``iter`` is running: started (no state loaded since) and not ended."""
        return self._started and not self._finished and self._pending is None

    def __iter__(self) -> Iterator[T]:
        """Start the next epoch (or continue a loaded state) and return its iterator."""
        pending, self._pending = self._pending, None
        self._untrained.outstanding = 0
        if pending is not None and pending["root"] is not None:
            self.root.reset(pending["root"])
            self._epoch, self._step = pending["epoch"], pending["step"]
            self._unspent = False
            if pending["finished"] and not self._untrained.restored:  # else: those batches, then the epoch's end
                self.root.reset(None)
                self._epoch, self._step = self._epoch + 1, 0
        else:
            if pending is not None:  # a state saved before the first batch: start at the epoch it would have
                self._epoch = pending["epoch"]
                start_at_epoch(self.root, self._epoch + 1)
            elif self._unspent:  # the last iter's epoch returned no batch and did not end: read it again
                start_at_epoch(self.root, self._epoch)
                self._epoch -= 1
            self.root.reset(None)
            self._epoch, self._step = self._epoch + 1, 0
            self._unspent = True
        self._started, self._finished = True, False
        return _Epoch(self)

    def keep_untrained(self, count: int) -> None:
        """Keep the last ``count`` batches returned, for :meth:`checkpoint` (a trainer that fetches ahead sets it).

        Example:
            >>> pipe = pp.from_iterable([{"text": "a"}, {"text": "b"}]).tokenize(pp.examples.tokenizer()).batch(1).pad()
            >>> loader = pipe.loader(); loader.keep_untrained(1)
        """
        self._untrained.keep(count)

    def trained(self, count: int = 1) -> None:
        """Note that the trainer has trained the oldest ``count`` batches returned since the last note.

        A loop that fetches ahead calls it after each training step, so that :attr:`untrained` is
        how many batches it holds; :meth:`checkpoint` saves those (``untrained=loader.untrained``).

        Example:
            >>> pipe = pp.from_iterable([{"text": t} for t in "abc"]).tokenize(pp.examples.tokenizer()).batch(1).pad()
            >>> loader = pipe.loader(); it = iter(loader); first, second = next(it), next(it)
            >>> loader.trained(); loader.untrained  # the first was trained, the second is fetched
            1
        """
        non_negative("count", count)
        done = min(count, self._untrained.outstanding)
        self._untrained.outstanding -= done
        self._trained = (self._trained or 0) + done

    @property
    def untrained(self) -> int:
        """Batches returned in the running epoch and not noted by :meth:`trained` (restored ones included)."""
        return self._untrained.outstanding

    def checkpoint(self, *, untrained: int = 0) -> dict[str, Any]:
        """Every rank's position in one value, the same on every rank: a collective over the loader's group.

        For each rank of the group: its :meth:`state_dict`, and the last ``untrained`` batches it returned
        that its trainer has not trained yet (:meth:`keep_untrained` must keep that many), with any restored
        ones not returned again yet. :meth:`load_state_dict` takes it on any layout (docs/elastic.md); it is
        plain data with CPU tensors.

        Example:
            >>> pipe = pp.from_iterable([{"text": t} for t in "abc"]).tokenize(pp.examples.tokenizer()).batch(1).pad()
            >>> loader = pipe.loader(); loader.keep_untrained(1)
            >>> it = iter(loader); first, second = next(it), next(it)  # the second is fetched, not trained
            >>> saved = loader.checkpoint(untrained=1)
            >>> again = pipe.loader(); again.load_state_dict(saved)
            >>> [b["input_ids"].tolist() for b in again] == [b["input_ids"].tolist() for b in pipe.loader()][1:]
            True
        """
        return gathered(self.state_dict(), self._untrained.last(untrained), self.group)

    def state_dict(self) -> dict[str, Any]:
        """The position after the last batch this loader returned (see the class docs)."""
        check_loader_call(self, "state_dict", None)
        if self._pending is not None:
            return self._pending
        root = self.root.state_dict() if self._started else None
        where = {"layout": self._built.layout(), "epoch": self._epoch, "step": self._step, "finished": self._finished}
        lockstep = bool(getattr(self.root, "in_lockstep", False))
        return self.STATE.make(self.options.settings(), root=root, lockstep=lockstep, **where)

    def load_state_dict(
        self,
        state: dict[str, Any] | list[dict[str, Any]],
        *,
        ahead: dict[int, list[Any]] | None = None,
        independent: bool = False,
    ) -> None:
        """Continue from ``state`` at the next ``iter(loader)``.

        ``state`` is this rank's state, a :meth:`checkpoint`, or a list of the states of every rank of a run
        saved with another number of ranks or workers (elastic resume: the rest of that epoch is shared over
        this run's ranks and workers; docs/elastic.md). A list must be one checkpoint: every rank in one
        epoch, at the same step (or each at the end of its share of the epoch).

        Args:
            state: One state, or every saved rank's.
            ahead: For an elastic resume, the batches each saved rank (the key) had taken from its
                loader but not trained on: they are shared out with the rest of the epoch (on the
                same layout a caller yields its own again itself, so passing any is an error).
            independent: The saved ranks ran independently (``Consumer`` ranks, equal steps off), so
                their states may be at different steps; without it such a list is refused as states
                of different checkpoints. States saved in lockstep must agree anyway.

        Example:
            >>> rows = datasets.Dataset.from_dict({"text": [f"row {i}" for i in range(400)]})
            >>> pipe = pp.from_hf(rows).tokenize(pp.examples.tokenizer()).batch(8).pad()
            >>> def saved(rank, steps):  # ranks that do not agree each step
            ...     loader = pipe.loader(consumer=pp.Consumer(rank=rank, world_size=2))
            ...     for _, _ in zip(range(steps), loader):
            ...         pass
            ...     return loader.state_dict()
            >>> states = [saved(0, 10), saved(1, 20)]
            >>> resumed = pipe.loader(consumer=pp.Consumer(rank=0, world_size=3))
            >>> resumed.load_state_dict(states)  # doctest: +ELLIPSIS
            Traceback (most recent call last):
            ...
            padpipe.state.StateMismatchError: ... checkpoints: rank 0 at epoch 0 step 10, rank 1 at epoch 0 step 20; ...
            >>> rest = 0
            >>> for rank in range(3):
            ...     resumed = pipe.loader(consumer=pp.Consumer(rank=rank, world_size=3))
            ...     resumed.load_state_dict(states, independent=True)
            ...     rest += sum(len(batch["input_ids"]) for batch in resumed)
            >>> rest == 400 - 8 * (10 + 20)  # the rows no rank had taken, each once
            True
        """
        check_loader_call(self, "load_state_dict", state)
        if not isinstance(independent, bool):
            raise TypeError(f"`independent` must be a bool, but is {independent!r} instead.")
        if isinstance(state, dict) and is_checkpoint(state):
            return self._load_checkpoint(own_part(state), independent)
        states = list(state) if isinstance(state, (list, tuple)) else [state]
        if not states:
            raise StateMismatchError(
                "PipelineLoader state is invalid: the states must be one rank's state or a list of every saved "
                "rank's, but is an empty list instead."
            )
        for one in states:
            self.STATE.check(one, self.options.settings())
            check_nesting(one)
        states = one_checkpoint(states, independent=independent)
        layout = self._built.layout()
        own = [s for s in states if s["layout"] == layout]
        if own and states[0]["layout"][1:] == layout[1:]:
            if any(ahead.values() if ahead else ()):
                raise ValueError(
                    "`ahead` batches are shared out only on another layout; on the same layout, yield "
                    "this rank's again before the loader's."
                )
            self._pending = dict(own[0])
            return
        saved = states[0]["layout"]
        if len(states) < saved[1]:
            raise StateMismatchError(
                f"PipelineLoader state was saved by rank {saved[0]} of {saved[1]} with {saved[2]} workers, but this "
                f"loader is rank {layout[0]} of {layout[1]} with {layout[2]} workers: to resume on another layout, "
                f"pass the states of all {saved[1]} saved ranks, loader.load_state_dict([state_rank0, ...]) "
                "(docs/elastic.md)."
            )
        carried = {key: states[0][key] for key in ("epoch", "step", "lockstep")}
        self._pending = self._built.reshare(states, layout, carried, dict(ahead or {}))

    def _load_checkpoint(self, parts: list[dict[str, Any]], independent: bool) -> None:
        """Resume from every rank's parts of a :meth:`checkpoint`: this rank's, or an elastic share of them all."""
        states = [one["loader"] for one in parts]
        for one in states:
            self.STATE.check(one, self.options.settings())
        layout = self._built.layout()
        if states[0]["layout"][1:] != layout[1:]:
            ahead = {rank: list(one["ahead"]) for rank, one in enumerate(parts)}
            self.load_state_dict(states, ahead=ahead, independent=independent)
            return
        self.load_state_dict(states, independent=independent)
        own = next(one for one in parts if one["loader"]["layout"] == layout)
        self._untrained.restore(own["ahead"], self.device)

    def set_epoch(self, epoch: int) -> None:
        """Make the next ``iter(loader)`` read epoch ``epoch`` from its start (a loaded state not yet used is dropped).

        Each ``iter`` otherwise reads the next epoch. For a framework that counts epochs itself.

        Example:
            >>> pipe = pp.from_iterable([{"text": t} for t in "abcd"]).shuffle(buffer_size=4, seed=0)
            >>> pipe = pipe.tokenize(pp.examples.tokenizer()).batch(1).pad()
            >>> loader = pipe.loader(); epochs = [[b["input_ids"].tolist() for b in loader] for _ in range(3)]
            >>> again = pipe.loader(); again.set_epoch(2)
            >>> [b["input_ids"].tolist() for b in again] == epochs[2] != epochs[0]
            True
        """
        non_negative("epoch", epoch)
        self._pending = None
        self._untrained.clear()
        start_at_epoch(self.root, epoch)
        self._epoch = epoch - 1  # the next iter's
        self._started = self._unspent = False  # a state_dict() now is "before epoch ``epoch``"

    def copy(self) -> PipelineLoader[T]:
        """A new loader of the same pipeline that reads next what this one reads next, leaving this one as it is.

        Built with the same options and its own graph and counters, so reading it changes nothing of this
        loader's. It starts where this loader's running epoch is (or at the state loaded and not yet used),
        else at the epoch this loader starts next. Under ``torch.distributed`` every rank reads its copy.

        Example:
            >>> pipe = pp.from_iterable([{"text": t} for t in "abc"]).tokenize(pp.examples.tokenizer()).batch(1).pad()
            >>> loader = pipe.loader(); it = iter(loader); first = next(it)
            >>> ahead = next(iter(loader.copy()))["input_ids"]
            >>> next(it)["input_ids"].tolist() == ahead.tolist(), loader.state_dict()["step"]
            (True, 2)
        """
        fresh = PipelineLoader[T](self.pipeline, self.options)
        if self._pending is not None or (self._started and not self._finished):
            fresh.load_state_dict(self.state_dict())
        else:  # before its first epoch, after an epoch's loop ended, or after set_epoch: the next epoch from its start
            fresh.set_epoch(self._epoch + 1)
        return fresh

    def stats(self) -> StatsSnapshot:
        """Rows, real and padded tokens, padding efficiency, skipped rows and time per stage so far.

        ``batches`` counts the batches this loader returned to the loop (a batch ``prefetch`` made ahead is
        not, though its rows and tokens are counted once made); once a trainer notes the batches it trained
        (:meth:`trained`), those.

        Example:
            >>> pipe = pp.from_iterable([{"text": t} for t in "abcd"]).tokenize(pp.examples.tokenizer()).batch(1).pad()
            >>> loader = pipe.prefetch(2).loader(); batches = iter(loader); first = next(batches)
            >>> loader.stats().batches
            1
        """
        return dataclasses.replace(
            self._built.stats.snapshot(), batches=self._returned if self._trained is None else self._trained
        )


class _Epoch(Iterator[T]):
    """One epoch of a loader: the batches restored from a checkpoint first, then the root's items.

    Not a generator: after an error the next ``next()`` asks the root again, which raises the same error
    instead of ending the epoch quietly.
    """

    def __init__(self, loader: PipelineLoader[T]) -> None:
        self.loader = loader
        self._checked = False

    def __iter__(self) -> _Epoch[T]:
        return self

    def __next__(self) -> T:
        loader = self.loader
        if not self._checked:  # the first batch: a framework about to save or resume the loader wrongly raises now
            check_loader_call(self, "__next__", None)
            self._checked = True
        untrained = loader._untrained
        if untrained.restored:  # returned before the checkpoint and not trained: counted in its step already
            item = untrained.restored.pop(0)
        else:
            try:
                item = next(loader.root)
            except StopIteration:
                loader._finished, loader._unspent = True, False
                raise
            loader._step += 1
        loader._unspent = False
        loader._returned += 1
        untrained.note(item)
        return item
