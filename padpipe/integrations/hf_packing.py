"""``padpipe.hf.Trainer``'s packing guard: a packed pipeline never trains a model that reads it wrong.

On the first packed training batch, :func:`guard_columns` passes ``use_cache=False`` where that alone fixes the
model, refuses on every rank a model that nothing here keeps documents apart in (:func:`padpipe.model_kind`),
then runs :func:`padpipe.check_packing` on rank 0 on that batch. ``Trainer(check_packing=False)`` turns it off.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from typing import Any

from padpipe.inspection.packing_causes import attention_of, is_causal, layer_cause, use_cache_of
from padpipe.inspection.packing_check import NothingToCheck, PackingError, check_packing
from padpipe.inspection.packing_model import model_kind

logger = logging.getLogger("padpipe.hf")

OFF = "Pass `check_packing=False` to padpipe.hf.Trainer to train anyway."


def guard_columns(trainer: Any, columns: Callable[[dict], dict]) -> Callable[[dict], dict]:
    """``columns`` (the training column filter), checked on the first batch, plus ``use_cache=False`` where safe.

    Args:
        trainer: The ``padpipe.hf.Trainer`` (its ``model``, ``args`` and ``accelerator``).
        columns: What the model is given of a batch as the loader yields it.

    Example:
        >>> select = guard_columns(trainer, _columns(trainer, "training"))  # doctest: +SKIP
        >>> model(**select(batch))  # the first call checks the packing in this model  # doctest: +SKIP
    """
    extra: dict[str, Any] = {}
    checked = False

    def select(batch: dict) -> dict:
        nonlocal checked
        if not checked:
            checked = True
            _refuse_layers(trainer, batch, columns(batch))
            extra.update(_safe_fixes(trainer.model, columns(batch)))
            _check_on_rank_zero(trainer, batch, lambda b: {**columns(b), **extra})
        return {**columns(batch), **extra}

    return select


def _safe_fixes(model: Any, inputs: dict) -> dict[str, Any]:
    """``{"use_cache": False}`` for a causal ``eager``/``sdpa`` model that would look for packed rows with a cache."""
    attn = attention_of(model)
    if attn is None or "flash" in attn or inputs.get("attention_mask") is not None:  # a 4-D mask needs no fix
        return {}
    if is_causal(model) is not True or not use_cache_of(model, inputs) or not _takes(model, "use_cache"):
        return {}
    logger.warning(
        f"padpipe.hf.Trainer passes use_cache=False to {type(model).__name__}'s training forward: with "
        f"use_cache=True and attn_implementation={attn!r}, HF looks for packed rows in position_ids only without "
        "a cache, so attention would cross documents (model.config.use_cache is left as it is)."
    )
    return {"use_cache": False}


def _refuse_layers(trainer: Any, batch: dict, inputs: dict) -> None:
    """Raise, on every rank alike, where the model's layers would carry state across documents (its probe: one
    small forward on every rank, none under FSDP or DeepSpeed, whose forward is a collective)."""
    model, sharded = trainer.model, trainer.is_fsdp_enabled or trainer.is_deepspeed_enabled
    parameter = next(iter(model.parameters()), None)
    kind = model_kind(model, device=None if parameter is None else parameter.device, probe=not sharded)
    cause = layer_cause(kind, batch, inputs)
    if cause is not None:
        raise PackingError(
            f"padpipe.hf.Trainer: packed documents would see each other in this model; cause [{cause.key}]: "
            f"{cause.what}. Fix: {cause.fix}. {OFF}",
            cause,
            None,
        )


def _check_on_rank_zero(trainer: Any, batch: dict, columns: Callable[[dict], dict]) -> None:
    if trainer.args.process_index != 0:
        return
    if trainer.is_fsdp_enabled or trainer.is_deepspeed_enabled:  # a forward on one rank would wait for the others
        logger.warning(
            "padpipe.hf.Trainer does not check packing under FSDP or DeepSpeed: run pp.check_packing(model, "
            "pipe.loader()) on the model before it is sharded."
        )
        return
    try:
        report = check_packing(trainer.model, [batch], columns=columns)
    except PackingError as exc:
        raise PackingError(f"padpipe.hf.Trainer: {exc} {OFF}", exc.cause, exc.report) from exc
    except NothingToCheck as exc:  # rows of one document each: no verdict, and none is claimed
        logger.warning(
            f"padpipe.hf.Trainer: packing in the model is not checked: {exc} Run pp.check_packing(model, "
            "pipe.loader()) before training."
        )
        return
    logger.info(f"padpipe.hf.Trainer: packing in the model checked on the first batch: {report.verdict}")


def _takes(model: Any, name: str) -> bool:
    parameters = inspect.signature(model.forward).parameters.values()
    return any(p.name == name or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)
