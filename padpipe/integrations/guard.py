"""What ``iter(pipe)`` learns from its callers: framework wrappers that lose or repeat rows.

A pipeline yields ready batches and shards itself, so ``iter(pipe)`` refuses a torch ``DataLoader`` with a
``batch_size`` and Accelerate's ``IterableDatasetShard`` or ``DataLoaderDispatcher`` on several processes, and
warns when Lightning reads it through a torch ``DataLoader`` (no exact resume), read from the frames above
``Pipeline.__iter__``; nothing here imports a framework. (A ``pipe.loader()``'s callers:
:mod:`padpipe.integrations.loader_guard`.)
"""

from __future__ import annotations

import sys
import warnings
from typing import Any

from padpipe.integrations.frames import caller_of, self_of

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

ACCELERATE_FIX = (
    "pass `pipe.loader(...)` to `accelerator.prepare(...)` instead (Accelerate passes it through; padpipe "
    "shards by rank and worker and keeps steps equal across ranks), or use `padpipe.hf.Trainer` with "
    "transformers' Trainer"
)


def check_caller(pipeline: Any, batches: bool = True) -> None:
    """Raise or warn when ``iter(pipeline)`` runs under a wrapper that would lose, repeat or stack rows.

    Registered in :mod:`padpipe.drivers`, asked by ``Pipeline.__iter__`` (``batches``: the pipeline
    yields ready batches of tensors). Raises ``RuntimeError`` (see the module docs); warns once when
    Lightning's loop reads the pipeline through a torch ``DataLoader`` without workers (worker
    processes do not see Lightning's frames).

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
        elif dataloader is None and isinstance(owner, getattr(sys.modules.get("torch.utils.data"), "DataLoader", ())):
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
