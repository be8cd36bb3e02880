"""The private ``transformers.Trainer`` hooks ``padpipe.hf.Trainer`` overrides or calls, and a loss check.

:func:`check_hooks` and :func:`private` raise, naming the hook or attribute, when a release changed one
(tests/integrations/test_hf_hooks*.py and test_contacts.py pin each); :func:`loss_ignores_items` finds a model
that leaves ``num_items_in_batch`` out of its loss (transformers#47688).
"""

from __future__ import annotations

import inspect
import logging
from typing import Any

import torch

from padpipe.inspection.packing_causes import INSTALL_TESTED, TESTED

logger = logging.getLogger("padpipe.hf")

OVERRIDES: dict[str, tuple[str, ...]] = {
    # resume the loader, save its state, count rows, one pass per epoch, count real tokens, epochs of a
    # pipeline (no max_steps check, the planned schedule), padpipe's loaders, row counts in logs
    "_validate_args": (),
    "get_train_dataloader": (),
    "get_eval_dataloader": ("eval_dataset",),
    "get_test_dataloader": ("test_dataset",),
    "create_scheduler": ("num_training_steps", "optimizer"),
    "log": ("logs", "start_time"),
    "predict": ("test_dataset", "ignore_keys", "metric_key_prefix"),
    "_init_training_state": tuple(
        "max_steps num_update_steps_per_epoch num_train_epochs resume_from_checkpoint trial".split()
    ),
    "_save_checkpoint": ("model", "trial"),
    "_finalize_training": ("trial", "num_train_samples", "start_time"),
    "_run_epoch": tuple(
        "model epoch train_dataloader steps_in_epoch num_update_steps_per_epoch trial ignore_keys_for_eval start_time "
        "resume_from_checkpoint epochs_trained steps_trained_in_current_epoch".split()
    ),
    "_track_num_input_tokens": ("inputs",),
    "get_batch_samples": ("epoch_iterator", "num_batches", "device"),
    "evaluation_loop": ("dataloader", "description", "prediction_loss_only", "ignore_keys", "metric_key_prefix"),
    "_get_num_items_in_batch": ("batch_samples", "device"),  # the loader's count of a window, else HF's
    "compute_loss": ("model", "inputs", "return_outputs", "num_items_in_batch"),  # a filler batch's loss times 0
}
"""Each ``Trainer`` method ``padpipe.hf.Trainer`` overrides (all but ``__init__``), with its parameters."""
HOOKS: dict[str, tuple[str, ...]] = {
    **OVERRIDES,
    # called, or relied on: a loader's length makes the epochs' max_steps
    "set_initial_training_values": ("args", "dataloader"),
    "_wrap_model": ("model", "training", "dataloader"),
    "_get_output_dir": ("trial",),
    "_set_signature_columns_if_needed": (),
    "_prepare_inputs": ("inputs",),
}
"""Each ``Trainer`` method padpipe overrides or relies on, with its parameters (after ``self``) in :data:`TESTED`."""
OVERRIDDEN = frozenset(OVERRIDES)


ATTRIBUTES: tuple[tuple[str, str, str, str], ...] = (
    # (module, class, attribute, what padpipe reads it for): set on the instance (in __init__ or by a hook)
    ("transformers.trainer", "Trainer", "_signature_columns", "the names model.forward takes, after "
     "_set_signature_columns_if_needed(): the evaluation loader's column filter"),
    ("transformers.trainer", "Trainer", "_loss_shifts_labels", "a bool set in __init__ since transformers 5.11: "
     "how HF counts a window's label tokens"),
    ("accelerate.accelerator", "Accelerator", "_models", "the models prepare() has wrapped: whether evaluation "
     "must prepare the model as Trainer.evaluation_loop does"),
)  # fmt: skip
"""Every private attribute of transformers or Accelerate ``padpipe.hf`` reads, as (module, class, attribute, why)."""


def private(owner: Any, name: str) -> Any:
    """``owner``'s private attribute ``name`` of :data:`ATTRIBUTES`; ``ImportError`` naming it when it is gone.

    Example:
        >>> private(object(), "_models")
        Traceback (most recent call last):
        ...
        ImportError: padpipe.hf reads accelerate.accelerator.Accelerator's `_models` (the models prepare() has ...
    """
    module, cls, _, why = next(row for row in ATTRIBUTES if row[2] == name)
    try:
        return getattr(owner, name)
    except AttributeError:
        raise ImportError(
            f"padpipe.hf reads {module}.{cls}'s `{name}` ({why}), but this {type(owner).__name__} has none: "
            f"{INSTALL_TESTED} (and its accelerate)."
        ) from None


def check_hooks(trainer: type, version: str) -> None:
    """Raise ``ImportError`` naming the first hook of :data:`HOOKS` that ``trainer`` lacks or has changed.

    Example:
        >>> class Old:
        ...     def _save_checkpoint(self, model): ...
        >>> check_hooks(Old, "4.0")
        Traceback (most recent call last):
        ...
        ImportError: padpipe.hf needs transformers.Trainer._validate_args() (transformers 5.18 to 5.25), but ...
    """
    for name, expected in HOOKS.items():
        method = getattr(trainer, name, None)
        found = None if method is None else tuple(inspect.signature(method).parameters)[1:]
        if found != expected:
            shown = "missing" if found is None else f"{name}({', '.join(found)})"
            raise ImportError(
                f"padpipe.hf needs transformers.Trainer.{name}({', '.join(expected)}) ({TESTED}), but transformers "
                f"{version} has {shown} instead: {INSTALL_TESTED}."
            )


def loss_shifts_labels(trainer: Any, version: str) -> bool:
    """Whether ``trainer`` counts ``num_items_in_batch`` on labels shifted one token (a causal LM's loss).

    ``Trainer.__init__`` sets ``_loss_shifts_labels`` since transformers 5.11; ``ImportError`` naming it
    when a release no longer sets it as a bool.

    Example:
        >>> class Old: ...
        >>> loss_shifts_labels(Old(), "5.10.4")
        Traceback (most recent call last):
        ...
        ImportError: padpipe.hf needs transformers.Trainer's `_loss_shifts_labels` (a bool set in __init__ since ...
    """
    shifts = getattr(trainer, "_loss_shifts_labels", None)  # a row of ATTRIBUTES, refused below when it is not a bool
    if not isinstance(shifts, bool):
        raise ImportError(
            "padpipe.hf needs transformers.Trainer's `_loss_shifts_labels` (a bool set in __init__ since "
            f"transformers 5.11), but found {shifts!r} in transformers {version} instead: {INSTALL_TESTED}."
        )
    return shifts


def turn_off_unused_loss_kwargs(trainer: Any, batch: dict[str, Any]) -> bool:
    """Set ``accepts_loss_kwargs = False`` (model and trainer) for a model whose loss ignores ``num_items_in_batch``.

    Checked only where HF would pass it and it matters: a model taking ``**kwargs`` that does not
    say ``accepts_loss_kwargs`` itself, its own loss, gradient accumulation or
    ``average_tokens_across_devices`` on several processes. Returns whether it was set (and warns).
    """
    model, args = trainer.accelerator.unwrap_model(trainer.model), trainer.args
    scaled = args.gradient_accumulation_steps > 1 or (args.average_tokens_across_devices and args.world_size > 1)
    if (
        not scaled
        or not trainer.model_accepts_loss_kwargs
        or trainer.compute_loss_func is not None
        or trainer.label_smoother is not None
        or hasattr(model, "accepts_loss_kwargs")
    ):
        return False
    if not loss_ignores_items(trainer.model, trainer._prepare_inputs(dict(batch))):
        return False
    trainer.model_accepts_loss_kwargs = model.accepts_loss_kwargs = False
    logger.warning(
        f"{type(model).__name__}.forward takes **kwargs but its loss ignores `num_items_in_batch` "
        "(transformers#47688), which would multiply its loss and gradient by the accumulation steps: "
        "padpipe.hf.Trainer set `model.accepts_loss_kwargs = False`, so each batch's mean loss is divided by "
        "the window's batch count. Set `model.accepts_loss_kwargs` yourself before training to skip this check."
    )
    return True


def loss_ignores_items(model: Any, inputs: dict[str, Any]) -> bool:
    """Whether ``model``'s loss on ``inputs`` is the same for ``num_items_in_batch`` n and 2n.

    A loss that honours it halves; one that ignores it (a per-batch mean) does not. Runs the model
    twice in eval mode without gradients, leaving every random state as it was.

    Example:
        >>> class Mean(torch.nn.Module):
        ...     def forward(self, labels=None, **kwargs):
        ...         return {"loss": labels.float().mean()}
        >>> loss_ignores_items(Mean(), {"labels": torch.tensor([1, 2])})
        True
    """
    labels = inputs.get("labels")
    if not isinstance(labels, torch.Tensor):
        return False
    items = labels.ne(-100).sum().clamp(min=1)
    devices = [labels.device] if labels.device.type == "cuda" else []
    training = model.training
    model.eval()
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=devices, device_type="cuda"):
            losses = [_loss(model(**inputs, num_items_in_batch=items * k)) for k in (1, 2)]
    finally:
        model.train(training)
    if any(loss is None for loss in losses) or not torch.isfinite(losses[0]) or losses[0] == 0:
        return False
    return bool(torch.allclose(losses[0], losses[1], rtol=1e-4, atol=0.0))


def _loss(outputs: Any) -> torch.Tensor | None:
    loss = outputs.get("loss") if isinstance(outputs, dict) else outputs[0]
    return loss.detach().float() if isinstance(loss, torch.Tensor) else None
