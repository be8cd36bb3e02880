"""What ``iter(pipe)`` learns from its callers: framework wrappers that lose or repeat rows.

A pipeline yields ready batches: a torch ``DataLoader`` with a ``batch_size`` (what plain
``transformers.Trainer`` builds) would stack several of them into one, so ``iter(pipe)`` refuses
an auto-collating caller (torch's fetcher, the one frame that calls it: in worker processes too).
A pipeline shards itself by rank and DataLoader worker. Accelerate's ``prepare`` shards an
``IterableDataset`` again (``IterableDatasetShard``) or reads it on rank 0 only and splits the
batches (``DataLoaderDispatcher``): either way each rank trains on part of its share, silently.
Lightning over a plain ``DataLoader`` saves no data position, so a resumed run starts the epoch
again. The frames above ``Pipeline.__iter__`` show which wrapper is reading; nothing here imports
a framework, and nothing runs unless one is already imported.

Lightning saves and restores a ``pipe.loader()`` it trains on (its ``CombinedLoader`` calls the
loader's ``state_dict``/``load_state_dict``); without the ``ExactResume`` callback that state would
be one batch late (the loop fetches a batch ahead) and rank 0's only, so :func:`check_state_caller`
refuses it, naming the callback. Both checks only raise or warn: what padpipe does never depends
on who calls it.
"""

from __future__ import annotations

import sys
import warnings
import weakref
from typing import Any

from padpipe.checkpoints import is_checkpoint
from padpipe.integrations.frames import caller_of, self_of, takes_self

MAX_DEPTH = 32
"""Frames looked at above ``Pipeline.__iter__`` (a ``DataLoader`` under a framework is ~12 deep)."""

_FRAMEWORKS = ("accelerate", "lightning", "pytorch_lightning")
_LIGHTNING_FETCHERS = ("lightning.pytorch.loops.fetchers", "pytorch_lightning.loops.fetchers")
_warned: set[str] = set()
TORCH_FETCHER = ("torch.utils.data._utils.fetch", "_IterableDatasetFetcher", "auto_collation")
"""torch's contact: the fetcher whose ``__init__`` calls ``iter(dataset)``, and its flag for a ``batch_size``."""

ACCELERATE = (
    ("accelerate.data_loader", "IterableDatasetShard", "num_processes"),
    ("accelerate.data_loader", "DataLoaderDispatcher", "state.num_processes"),
)
"""Accelerate's contacts: (module, class, attribute read) of the wrappers that shard a pipeline again."""

_READ = ("padpipe.", "accelerate.", "torch.utils.data.", "torchdata.", *_LIGHTNING_FETCHERS)
"""The modules whose method frames ``check_caller`` reads ``self`` from (never a user's frame)."""

LIGHTNING_COMBINED = ("lightning.pytorch.utilities.combined_loader", "pytorch_lightning.utilities.combined_loader")
"""The module of Lightning's ``CombinedLoader``, whose methods call a train loader's state methods."""
LOADER_SLOT = ("loops", "fit_loop", "state_dict", "combined_loader")
"""Where Lightning's checkpoint holds the states of its stateful train loaders (``ExactResume`` writes there)."""
LIGHTNING = (
    # (module, attribute path): every private name of Lightning padpipe reads (tests/integrations pins each)
    ("lightning.pytorch.utilities.combined_loader", "CombinedLoader._state_dicts"),  # the caller saving a loader
    ("lightning.pytorch.utilities.combined_loader", "CombinedLoader._load_state_dicts"),  # the caller restoring one
    ("lightning.pytorch.loops.fit_loop", "_FitLoop._data_fetcher"),  # ExactResume: restart an epoch read wrong
)
"""Lightning's contacts, with :data:`LOADER_SLOT` (``padpipe.integrations.lightning`` and this module)."""
EXACT_RESUME = "padpipe.integrations.lightning.ExactResume()"
_held: weakref.WeakSet[Any] = weakref.WeakSet()

ACCELERATE_FIX = (
    "pass `pipe.loader(...)` to `accelerator.prepare(...)` instead (Accelerate passes it through; padpipe "
    "shards by rank and worker and keeps steps equal across ranks), or use `padpipe.hf.Trainer` with "
    "transformers' Trainer"
)


def check_caller(pipeline: Any, batches: bool = True) -> None:
    """Raise or warn when ``iter(pipeline)`` runs under a wrapper that would lose, repeat or stack rows.

    Registered in :mod:`padpipe.drivers`, asked by ``Pipeline.__iter__`` (``batches``: the pipeline
    yields ready batches of tensors); ``pipeline`` is the pipeline being iterated, whose caller it reads.
    Raises ``RuntimeError`` when a torch ``DataLoader`` with a ``batch_size`` reads a pipeline of
    batches, and under Accelerate's ``IterableDatasetShard`` or ``DataLoaderDispatcher`` with
    more than one process; warns once when Lightning's training loop reads the pipeline through a
    torch ``DataLoader`` (seen when the ``DataLoader`` has no workers: worker processes do not see
    Lightning's frames).

    Example:
        >>> check_caller(pipe)  # doctest: +SKIP
    """
    frame = caller_of(pipeline, ("__iter__",))
    if batches and frame is not None:
        _check_collation(self_of(frame, (TORCH_FETCHER[0],)))
    if not any(name in sys.modules for name in _FRAMEWORKS):
        return
    dataloader = None
    for _ in range(MAX_DEPTH):
        if frame is None:
            return
        owner = self_of(frame, _READ)
        module = type(owner).__module__
        if module.startswith("padpipe."):
            return  # padpipe's own loaders and adapters read it: they handle ranks and resume
        if module == "accelerate.data_loader":
            _check_accelerate(owner)
        elif dataloader is None and _is_dataloader(owner):
            dataloader = owner
        elif module in _LIGHTNING_FETCHERS and dataloader is not None:
            _warn_lightning(dataloader)
            return
        frame = frame.f_back


def _check_collation(owner: Any) -> None:
    """Refuse torch's auto-collating fetcher: it would stack ``batch_size`` padpipe batches into one."""
    module, name, flag = TORCH_FETCHER
    if type(owner).__module__ != module or type(owner).__name__ != name or not getattr(owner, flag, False):
        return
    raise RuntimeError(
        "A padpipe pipeline yields ready batches, but the torch DataLoader reading it batches them again "
        "(its batch_size is not None), so its collate_fn would stack several padpipe batches into one. Fix: "
        "with transformers, use padpipe.hf.Trainer (it reads the pipeline's batches as they are); with a "
        "DataLoader, pass batch_size=None, or iterate pipe.loader(...)."
    )


def _check_accelerate(owner: Any) -> None:
    name = type(owner).__name__
    if name == "IterableDatasetShard" and owner.num_processes > 1:
        raise RuntimeError(
            f"A padpipe pipeline is read through accelerate's IterableDatasetShard over {owner.num_processes} "
            "processes: `accelerator.prepare(DataLoader(pipe))` shards the data a second time on top of padpipe's "
            f"own rank sharding, so every rank would train on 1/{owner.num_processes} of its share. Fix: "
            f"{ACCELERATE_FIX}."
        )
    if name == "DataLoaderDispatcher" and owner.state.num_processes > 1:
        raise RuntimeError(
            f"A padpipe pipeline is read through accelerate's DataLoaderDispatcher over {owner.state.num_processes} "
            "processes: `accelerator.prepare(DataLoader(pipe))` reads only rank 0's padpipe share and splits its "
            f"batches across ranks (or fails to concatenate batches of different shapes). Fix: {ACCELERATE_FIX}."
        )


def _is_dataloader(owner: Any) -> bool:
    data = sys.modules.get("torch.utils.data")
    return data is not None and isinstance(owner, data.DataLoader)


def _warn_lightning(dataloader: Any) -> None:
    stateful = callable(getattr(dataloader, "state_dict", None))
    key = "stateful" if stateful else "plain"
    if key in _warned:
        return
    _warned.add(key)
    if stateful:
        what = (
            f"a {type(dataloader).__name__} over a padpipe pipeline: Lightning saves its state one batch "
            "late (it fetches a batch ahead), so a resumed run skips one batch"
        )
    else:
        what = (
            "a plain torch DataLoader over a padpipe pipeline: it saves no data position, so a run resumed "
            "from a checkpoint starts the epoch again and repeats rows"
        )
    warnings.warn(
        f"Lightning is training on {what}. For an exact resume, return `pipe.loader(...)` from "
        "`train_dataloader()` (Lightning's checkpoints then hold every rank's position after the batches trained).",
        stacklevel=3,
    )


def hold(loader: Any) -> None:
    """Note that a callback saves ``loader`` exactly under Lightning (``ExactResume`` calls it at the start of fit)."""
    _held.add(loader)


def check_state_caller(loader: Any, method: str, state: Any) -> None:
    """Raise when Lightning saves or restores ``loader`` and no ``ExactResume`` callback makes that exact.

    Registered in :mod:`padpipe.drivers`, asked by ``PipelineLoader.state_dict`` (``method``) and
    ``load_state_dict`` (``state``: the state given). Lightning is the caller when the first method
    above the loader's is its ``CombinedLoader``'s. Saving needs the loader held by the callback
    (:func:`hold`); restoring needs a state the callback saved (every rank's checkpoint), which the
    loader resumes exactly by itself.

    Example:
        >>> check_state_caller(pipe.loader(), "state_dict", None)  # doctest: +SKIP
    """
    if not any(name.split(".")[0] in sys.modules for name in LIGHTNING_COMBINED):
        return
    frame = caller_of(loader, (method,))
    for _ in range(MAX_DEPTH):  # up to the first method (past Lightning's list comprehension)
        if frame is None or takes_self(frame):
            break
        frame = frame.f_back
    if frame is None or frame.f_globals.get("__name__") not in LIGHTNING_COMBINED:
        return
    if method == "state_dict" and loader not in _held:
        raise RuntimeError(
            f"Lightning is saving pipe.loader() in a checkpoint without the {EXACT_RESUME} callback, so the state "
            "would be one batch late (its loop fetches a batch ahead) and rank 0's only: add "
            f"`callbacks=[{EXACT_RESUME}]` to the Trainer."
        )
    if method == "load_state_dict" and not is_checkpoint(state):
        raise RuntimeError(
            "Lightning is restoring pipe.loader() from a checkpoint saved without the "
            f"{EXACT_RESUME} callback (one batch late, or rank 0's only): resume from a checkpoint saved with "
            f"`callbacks=[{EXACT_RESUME}]` in the Trainer."
        )
