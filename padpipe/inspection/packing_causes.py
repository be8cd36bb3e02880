"""Why a model's packed logits differ from each document's own: the known causes, read from config and batch.

:func:`diagnose` names the first known cause that applies, from what the model is and what it was given, once
the logits have shown something is wrong. The private attributes of transformers it reads are in
:data:`CONTACTS` (tests/integrations/test_contacts.py pins each).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

from padpipe.inspection.packing_model import BUCKET, ModelKind, model_kind
from padpipe.inspection.packing_rows import Document

TESTED = "transformers 5.18 to 5.25"
"""The transformers releases padpipe is tested with."""
INSTALL_TESTED = (
    "install a transformers release padpipe was tested with (pip install 'transformers>=5.18,<=5.25') or a padpipe "
    "release for yours"
)
FLASH_KWARGS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")
TOLERANCES = {torch.float64: (1e-6, 1e-5), torch.float32: (1e-5, 1e-4), torch.float16: (2e-3, 1e-2)}
BF16_TOLERANCE = (1e-2, 2e-2)
CONTACTS: tuple[tuple[str, str, str], ...] = (
    # (module, class, attribute): what padpipe.check_packing and `padpipe check-packing` read of transformers
    ("transformers", "PretrainedConfig", "_attn_implementation"),  # the attention a model runs (a cause of leaks)
    ("transformers", "AutoModelForCausalLM", "_model_mapping"),  # the configs it builds (the command's model head)
    ("transformers", "AutoModelForMaskedLM", "_model_mapping"),
)
"""The private names of transformers the packing check reads."""


@dataclasses.dataclass(frozen=True)
class Cause:
    """A known reason for attention across documents: a short ``key``, what happened and the fix."""

    key: str
    what: str
    fix: str


def tolerance(dtype: torch.dtype) -> tuple[float, float]:
    """``(atol, rtol)`` for comparing logits computed in ``dtype``: rounding passes, a leak does not.

    Example:
        >>> tolerance(torch.bfloat16)
        (0.01, 0.02)
    """
    return TOLERANCES.get(dtype, BF16_TOLERANCE)


def attention_of(model: Any) -> str | None:
    """The model's ``attn_implementation`` (``None`` for a model without a transformers config)."""
    config = getattr(model, "config", None)
    if config is None or not type(config).__module__.startswith("transformers."):
        return getattr(config, "_attn_implementation", None)  # a config of its own may say, or not
    return transformers_private(config, "_attn_implementation")


def transformers_private(owner: Any, name: str) -> Any:
    """``owner``'s attribute ``name`` of :data:`CONTACTS`; ``ImportError`` naming it when transformers dropped it.

    Example:
        >>> transformers_private(object(), "_model_mapping")
        Traceback (most recent call last):
        ...
        ImportError: padpipe.check_packing reads transformers' `_model_mapping` (of AutoModelForCausalLM or ..., but ...
    """
    classes = " or ".join(cls for _, cls, attribute in CONTACTS if attribute == name)
    try:
        return getattr(owner, name)
    except AttributeError:
        raise ImportError(
            f"padpipe.check_packing reads transformers' `{name}` (of {classes}), but this {type(owner).__name__} has "
            f"none: {INSTALL_TESTED}."
        ) from None


def is_causal(model: Any) -> bool | None:
    """Whether the model's attention layers are causal (their ``is_causal``); ``None`` when they do not say."""
    flags = {m.is_causal for m in model.modules() if isinstance(getattr(m, "is_causal", None), bool)}
    return True in flags if flags else None


def use_cache_of(model: Any, inputs: Mapping[str, Any]) -> bool:
    """``use_cache`` as the forward sees it: the call's, else the config's."""
    if inputs.get("use_cache") is not None:
        return bool(inputs["use_cache"])
    return bool(getattr(getattr(model, "config", None), "use_cache", False))


def diagnose(
    model: Any, batch: Mapping[str, Any], inputs: Mapping[str, Any], documents: list[Document]
) -> Cause | None:
    """The first known cause that applies to ``model`` given ``inputs`` (``batch`` is the loader's).

    The model's layers come first (:func:`padpipe.model_kind`: state that runs on across documents,
    a missing kernel, boundaries dropped, a batch of several rows for flash-linear-attention), then
    the attention's causes.

    Example:
        >>> model = torch.nn.Linear(2, 2)
        >>> diagnose(model, {"position_ids": 1}, {"input_ids": 1}, []).key
        'position_ids_missing'
    """
    attn = attention_of(model) or "unknown"
    flash = "flash" in attn
    mask = inputs.get("attention_mask")
    mask = mask if isinstance(mask, torch.Tensor) else None
    mask_4d = mask is not None and mask.dim() == 4
    parameter = next(iter(model.parameters()), None)
    kind = model_kind(model, device=None if parameter is None else parameter.device)
    found = layer_cause(kind, batch, inputs) or (
        Cause("mask_without_positions", kind.why, kind.fix) if kind.mask_without_positions and not flash else None
    )
    if found is not None:
        return found
    causal = is_causal(model)
    block = "4-D attention_mask (pack(block_mask=True))"
    if mask_4d and flash:
        return Cause(
            "flash_4d_mask",
            f"a {block} goes to attn_implementation={attn!r}, whose flash path takes a 2-D padding mask only",
            "pack without block_mask: flash-attention reads cu_seq_lens_q/k and max_length_q/k",
        )
    if mask is not None and mask_4d and mask.dtype == torch.bool and attn == "eager":
        return Cause(
            "bool_mask_eager",
            "a bool 4-D attention_mask goes to attn_implementation='eager', which adds the mask to the scores, "
            "so True and False mask nothing",
            "pack(block_mask=True) with the default float mask_dtype, or attn_implementation='sdpa'",
        )
    if mask is not None and mask_4d and causal is False and _masks_the_future(mask, documents):
        return Cause(
            "causal_mask_on_encoder",
            f"a causal {block} goes to a bidirectional model ({type(model).__name__}): each token sees only the "
            "tokens before it",
            "give it a bidirectional block mask, seq_idx[:, None, :, None] == seq_idx[:, None, None, :] "
            "(bool, for sdpa), or use flash-attention with the default batch",
        )
    attention = causal is not False and not (kind.kind == "varlen" and causal is None)  # Mamba2: no positions read
    if "position_ids" not in inputs and attention:
        how = " (the batch has them; they were dropped before the model)" if "position_ids" in batch else ""
        return Cause(
            "position_ids_missing",
            f"the model gets no position_ids{how}, so positions run on across documents and HF finds no packed rows",
            "pass the position_ids pack() makes to the model",
        )
    wrong = _positions_not_restarting(inputs.get("position_ids"), documents)
    if wrong is not None:
        return Cause(
            "position_ids_not_restarting",
            f"position_ids do not restart at each document: {wrong}",
            "give the model the position_ids pack() makes, unchanged",
        )
    if mask is not None and mask.dim() == 2:
        return Cause(
            "mask_2d",
            "the packed batch carries a 2-D attention_mask: HF then reads packed rows neither from position_ids "
            "nor from cu_seq_lens_*",
            "drop attention_mask from packed batches (pack() makes none), or pack with block_mask=True",
        )
    rows = _rows(inputs)
    missing = [k for k in FLASH_KWARGS if k not in inputs]
    if flash and missing and rows > 1:
        dropped = [k for k in missing if k in batch]
        how = f" ({', '.join(dropped)} dropped before the model, as remove_unused_columns=True does)" if dropped else ""
        return Cause(
            "flash_kwargs_missing",
            f"attn_implementation={attn!r} gets no {', '.join(missing)}{how}, so on a batch of {rows} rows HF runs "
            "the dense kernel over whole rows",
            "keep those keys: TrainingArguments(remove_unused_columns=False), or padpipe.hf.Trainer (it keeps them "
            "for a forward that takes **kwargs)",
        )
    if not flash and not mask_4d and causal is False:
        return Cause(
            "encoder_without_mask",
            f"a bidirectional model ({type(model).__name__}, attn_implementation={attn!r}) reads packed rows "
            "without a mask: HF finds packed rows in the position_ids of bidirectional masks only from transformers "
            "5.25 on, and only when given them",
            "give it the position_ids pack() makes (transformers>=5.25), use flash-attention with the default batch, "
            "or give a bidirectional 4-D block mask built from seq_idx",
        )
    if not flash and not mask_4d and use_cache_of(model, inputs):
        how = " (the batch's use_cache=False was dropped before the model)" if "use_cache" in batch else ""
        return Cause(
            "use_cache",
            f"use_cache=True{how} with attn_implementation={attn!r} and no 4-D mask: HF looks for packed rows "
            "in position_ids only when there is no cache",
            "pass the batch's use_cache=False to the model (or set model.config.use_cache = False), or pack with "
            "block_mask=True",
        )
    if kind.kind == "varlen":  # every boundary given, yet a state runs on
        return Cause("state_leak", f"{kind.why}, yet a document sees another", f"do not pack: {BUCKET}")
    return None


def layer_cause(kind: ModelKind, batch: Mapping[str, Any], inputs: Mapping[str, Any]) -> Cause | None:
    """Why layers that carry state would see other documents in ``inputs`` (``batch``: the loader's), or ``None``.

    ``None`` for a model of attention layers only, or for layers given what they need: the kernels on
    this device, ``seq_idx``/``cu_seq_lens_q``, and one row for flash-linear-attention.

    Example:
        >>> kind = ModelKind("MambaForCausalLM", "recurrent", "2 linear_attention layers", "no kernel takes any")
        >>> layer_cause(kind, {}, {}).key
        'recurrent_state'
    """
    if kind.kind == "recurrent":
        return Cause("recurrent_state", kind.why, kind.fix)
    if kind.kind != "varlen":
        return None
    if kind.missing:
        return Cause("kernel_missing", kind.why, kind.fix)
    dropped = [k for k in ("seq_idx", "cu_seq_lens_q") if k not in inputs]
    if dropped:
        how = (
            " (dropped before the model, as remove_unused_columns=True does)"
            if all(k in batch for k in dropped)
            else ""
        )
        return Cause(
            "boundaries_missing",
            f"{kind.why}, but the model gets no {', '.join(dropped)}{how}",
            "keep them: padpipe.hf.Trainer keeps them, or TrainingArguments(remove_unused_columns=False)",
        )
    if kind.one_row and _rows(inputs) > 1:
        return Cause(
            "flat_layout",
            f"{kind.why}, and flash-linear-attention takes cu_seqlens for a batch of one row only (this one has "
            f"{_rows(inputs)})",
            "pack(..., layout='flat')",
        )
    return None


def _rows(inputs: Mapping[str, Any]) -> int:
    ids = inputs.get("input_ids")
    return int(ids.shape[0]) if isinstance(ids, torch.Tensor) and ids.dim() == 2 else 1


def _positions_not_restarting(positions: Any, documents: list[Document]) -> str | None:
    """Where ``positions`` fail to run ``p, p+1, ...`` from each document's start (``p``: the row's first)."""
    if not isinstance(positions, torch.Tensor) or positions.dim() != 2:
        return None
    positions = positions.cpu()
    for d in documents:
        row = positions[d.row if positions.shape[0] > 1 else 0]
        expected = int(row[0]) + torch.arange(d.end - d.start)
        found = row[d.start : d.end]
        if not torch.equal(found, expected):
            column = d.start + int((found != expected).nonzero()[0])
            return (
                f"at {d} (column {column}) expected {int(expected[column - d.start])}, found {int(row[column])} "
                f"(positions {found[:6].tolist()}{' ...' if len(found) > 6 else ''})"
            )
    return None


def _masks_the_future(mask: torch.Tensor, documents: list[Document]) -> bool:
    """Whether the 4-D mask hides a document's second token from its first (a causal mask)."""
    for d in documents:
        if d.end - d.start > 1:
            value = mask[d.row, 0, d.start, d.start + 1]
            return not bool(value) if mask.dtype == torch.bool else bool(value < 0)
    return False
