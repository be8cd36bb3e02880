"""What a ``pipe.loader()`` learns from the framework iterating, saving or restoring it.

Without the ``ExactResume`` callback (which :func:`hold`-s its ``Trainer``), Lightning's states of a loader would
be one batch late and rank 0's only, so a fit that will save or resumes one raises at its first batch (one that
can only save it through ``trainer.save_checkpoint`` warns), saving raises, and so does restoring a state not
saved with the callback; Accelerate's ``save_state`` of a registered loader raises on several processes
(docs/training.md). Each check only raises or warns; nothing here imports a framework.
"""

from __future__ import annotations

import sys
import warnings
import weakref
from collections.abc import Mapping
from types import FrameType
from typing import Any

from padpipe.checkpoints import CHECKPOINT, is_checkpoint
from padpipe.integrations.frames import LIMIT, caller_of, self_of, takes_self
from padpipe.runtime.loader_state import LOADER_STATE
from padpipe.sharing.ranks import ranks
from padpipe.state import CHECKSUM_KEY, SETTINGS_KEY, VERSION_KEY

LIGHTNING_COMBINED = ("lightning.pytorch.utilities.combined_loader", "pytorch_lightning.utilities.combined_loader")
"""The module of Lightning's ``CombinedLoader``, which takes a train loader's batches and calls its state methods."""
LIGHTNING_TRAINER = ("lightning.pytorch.trainer.trainer", "pytorch_lightning.trainer.trainer")
"""The module of Lightning's ``Trainer``, whose method frames lie above every call of its loops."""
LOADER_SLOT = ("loops", "fit_loop", "state_dict", "combined_loader")
"""Where Lightning's checkpoint holds the states of its stateful train loaders (``ExactResume`` writes there)."""
LIGHTNING = (
    # (module, attribute path): every private name of Lightning padpipe reads (tests/integrations pins each)
    ("lightning.pytorch.utilities.combined_loader", "CombinedLoader._state_dicts"),  # the caller saving a loader
    ("lightning.pytorch.utilities.combined_loader", "CombinedLoader._load_state_dicts"),  # the caller restoring one
    ("lightning.pytorch.loops.fit_loop", "_FitLoop._data_fetcher"),  # ExactResume: restart an epoch read wrong
    # ExactResume: whether the epoch loop's on_run_start calls iter() on the train loaders (its own test)
    ("lightning.pytorch.loops.fit_loop", "_FitLoop.is_resuming"),
    ("lightning.pytorch.loops.fit_loop", "_FitLoop.epoch_loop.restarting"),
    ("lightning.pytorch.loops.fit_loop", "_FitLoop.batch_idx"),  # ExactResume: the epoch's last batch trained
)
"""Lightning's contacts, with :data:`LOADER_SLOT` and :data:`LIGHTNING_TRAINER` (read by this module and
``padpipe.integrations.lightning``)."""
ACCELERATE_SAVE = ("accelerate.accelerator", "save_state")
"""Accelerate's contact: the ``Accelerator`` method that saves the objects given to ``register_for_checkpointing``."""
EXACT_RESUME = "padpipe.integrations.lightning.ExactResume()"
WITHOUT = (
    f"without the {EXACT_RESUME} callback, so the state would be one batch late (its loop fetches a batch ahead) and "
    f"rank 0's only: add `callbacks=[{EXACT_RESUME}]` to the Trainer."
)
_held: weakref.WeakSet[Any] = weakref.WeakSet()


def hold(trainer: Any) -> None:
    """Note that ``trainer`` saves its train loaders exactly (``ExactResume`` calls it before the fit's first batch)."""
    _held.add(trainer)


def held(trainer: Any) -> bool:
    """Whether an ``ExactResume`` callback of ``trainer`` makes its checkpoints of the train loaders exact."""
    return trainer is not None and trainer in _held


def fit_trainer(loader: Any, method: str) -> Any:
    """The Lightning ``Trainer`` whose ``CombinedLoader`` calls ``loader``'s ``method`` now, else ``None``.

    Example:
        >>> fit_trainer(object(), "__iter__") is None  # nobody is calling it
        True
    """
    return _trainer_above(_lightning_caller(loader, method))


def train_loaders(trainer: Any) -> list[Any]:
    """Every loader in ``trainer.train_dataloader`` (nested in dicts, lists and tuples)."""
    found, todo = [], [trainer.train_dataloader]
    while todo:
        item = todo.pop()
        if isinstance(item, dict):
            todo.extend(item.values())
        elif isinstance(item, (list, tuple)):
            todo.extend(item)
        elif item is not None:
            found.append(item)
    return found


def check_loader_caller(loader: Any, method: str, state: Any) -> None:
    """Raise (or warn) when a framework iterates, saves or restores ``loader`` in a way that cannot resume exactly.

    Registered in :mod:`padpipe.drivers`, asked by ``PipelineLoader.state_dict`` and ``load_state_dict``
    (``state``: the state being loaded) and by each epoch's iterator at its first batch (``"__next__"``).
    Lightning is the caller when the first method above is its ``CombinedLoader``'s; its ``Trainer``
    above tells whether ``ExactResume`` is there (:func:`hold`) and whether the fit saves or resumes.

    Example:
        >>> check_loader_caller(pipe.loader(), "state_dict", None)  # doctest: +SKIP
    """
    if method == "state_dict" and ACCELERATE_SAVE[0] in sys.modules:
        _check_accelerate_save(loader)
    if not any(name.split(".")[0] in sys.modules for name in LIGHTNING_COMBINED):
        return
    frame = _lightning_caller(loader, method)
    if frame is None:
        return
    trainer = _trainer_above(frame)
    if method == "__next__":
        if trainer is not None and not held(trainer) and any(one is loader.loader for one in train_loaders(trainer)):
            _check_fit_start(trainer)
    elif method == "state_dict":
        if not held(trainer):
            raise RuntimeError(f"Lightning is saving pipe.loader() in a checkpoint {WITHOUT}")
    else:
        _check_restored(state)


def _lightning_caller(owner: Any, method: str) -> FrameType | None:
    """The frame of Lightning's ``CombinedLoader`` method calling ``owner``'s ``method`` (past its comprehension)."""
    frame = caller_of(owner, (method,))
    for _ in range(LIMIT):
        if frame is None or takes_self(frame):
            break
        frame = frame.f_back
    return frame if frame is not None and frame.f_globals.get("__name__") in LIGHTNING_COMBINED else None


def _trainer_above(frame: FrameType | None) -> Any:
    """The ``Trainer`` whose method runs in ``frame`` or above it, else ``None``."""
    for _ in range(LIMIT):
        if frame is None:
            return None
        trainer = self_of(frame, LIGHTNING_TRAINER)
        if trainer is not None:
            return trainer
        frame = frame.f_back
    return None


def _check_fit_start(trainer: Any) -> None:
    """At a fit's first batch of a train loader without ``ExactResume``: raise if it will be saved or resumes."""
    if trainer.ckpt_path:
        raise RuntimeError(
            f"Lightning is resuming pipe.loader() from {trainer.ckpt_path} without the {EXACT_RESUME} callback, so "
            f"its epochs would not follow Lightning's: add `callbacks=[{EXACT_RESUME}]` to the Trainer."
        )
    callbacks = trainer.checkpoint_callbacks  # ModelCheckpoint(save_top_k=0) without save_last never saves
    saving = sorted({type(c).__name__ for c in callbacks if getattr(c, "save_top_k", 1) or getattr(c, "save_last", 0)})
    if saving:
        raise RuntimeError(f"Lightning will save pipe.loader() in its checkpoints ({', '.join(saving)}) {WITHOUT}")
    warnings.warn(f"Lightning may save pipe.loader() in `trainer.save_checkpoint(...)` {WITHOUT}", stacklevel=2)


def _check_restored(state: Any) -> None:
    """Refuse a loader state Lightning restores that ``ExactResume`` of this padpipe did not save, by its version."""
    version = state.get(VERSION_KEY) if isinstance(state, Mapping) else None
    current = (CHECKPOINT.version, sorted(CHECKPOINT.fields))
    if is_checkpoint(state) and (version, sorted(set(state) - {VERSION_KEY, SETTINGS_KEY, CHECKSUM_KEY})) == current:
        return  # the loader checks the rest
    if version is None or ("root" in state and version == LOADER_STATE.version):
        raise RuntimeError(
            f"Lightning is restoring pipe.loader() from a checkpoint saved without the {EXACT_RESUME} callback (one "
            f"batch late, or rank 0's only): resume from a checkpoint saved with `callbacks=[{EXACT_RESUME}]` in the "
            "Trainer."
        )
    saved = f"{LOADER_STATE.stage} state" if "root" in state else f"state with keys {sorted(state)}"
    raise RuntimeError(
        f"Lightning is restoring pipe.loader() from a checkpoint of another padpipe version: its loader state is a "
        f"version-{version} {saved}, and this padpipe resumes a version-{CHECKPOINT.version} "
        f"{CHECKPOINT.stage} (saved with the {EXACT_RESUME} callback): resume with the padpipe that saved it."
    )


def _check_accelerate_save(loader: Any) -> None:
    """Refuse Accelerate's ``save_state`` saving ``loader`` (rank 0's state alone) over several processes."""
    frame = caller_of(loader, ("state_dict",))
    for _ in range(LIMIT):
        if frame is None:
            return
        if frame.f_code.co_name == ACCELERATE_SAVE[1] and frame.f_globals.get("__name__") == ACCELERATE_SAVE[0]:
            break
        frame = frame.f_back
    else:
        return
    world = ranks(getattr(loader, "group", None))[1]
    if world > 1:
        raise RuntimeError(
            f"Accelerate's save_state is saving pipe.loader() (given to register_for_checkpointing) from rank 0 of "
            f"{world} alone, which no other rank could resume from: do not register the loader; save each rank's "
            '`loader.state_dict()` yourself (torch.save(state, f"loader_{accelerator.process_index}.pt")).'
        )
