"""How a recipe batches for a model: packed rows, one flat row, or buckets where packing cannot be right.

:func:`batching` turns :func:`padpipe.model_kind`'s verdict into a recipe's ``mode`` and
``pack(layout=...)``: a model that carries state across documents with nothing to keep them apart is
bucketed (one document a row, padded on the right), with one warning. :func:`sizes` checks a recipe's sizes.
"""

from __future__ import annotations

import logging
from typing import Any

from padpipe.errors import one_of, positive
from padpipe.inspection.packing_model import ModelKind, model_kind

logger = logging.getLogger("padpipe.recipes")


def batching(model: Any, mode: str | None, recipe: str) -> tuple[str, str]:
    """``(mode, layout)`` for ``model`` (a model, config, :class:`~padpipe.ModelKind` or ``None``) and ``mode``.

    ``mode=None`` packs where the model keeps packed documents apart, else buckets (with a warning);
    ``mode="pack"`` for a model that cannot be packed raises ``ValueError`` naming its layers.

    Example:
        >>> kind = pp.ModelKind("MambaForCausalLM", "recurrent", "2 layers", "no kernel takes any")
        >>> batching(kind, None, "sft"), batching(None, None, "sft")
        (('bucket', 'rows'), ('pack', 'rows'))
    """
    if mode is not None:
        one_of("mode", mode, ("pack", "bucket"))
    if model is None:
        return mode or "pack", "rows"
    kind = model if isinstance(model, ModelKind) else model_kind(model)
    if kind.layout != "bucket" or mode == "bucket":
        return mode or "pack", "rows" if kind.layout == "bucket" else kind.layout
    if mode == "pack":
        raise ValueError(f"{recipe}(mode='pack') cannot keep packed documents apart in this model: {kind}")
    logger.warning(f"{recipe}: batches by bucket, not pack: {kind}")
    return "bucket", "rows"


def sizes(
    model: Any, mode: str | None, recipe: str, seq_len: int, batch_size: int, max_tokens: int | None, **buffers: int
) -> tuple[str, str, int]:
    """``(mode, layout, max_tokens)`` of a recipe that packs ``batch_size`` rows of ``seq_len`` or buckets under
    ``max_tokens`` (default ``seq_len * batch_size``), each size checked (``buffers``: more sizes, by name).

    Example:
        >>> sizes(None, "bucket", "sft", 512, 4, None)  # seq_len, batch_size, max_tokens
        ('bucket', 'rows', 2048)
    """
    positive("seq_len", seq_len)
    if seq_len < 2:
        raise ValueError(f"`seq_len` must be at least 2, but is {seq_len} instead.")
    positive("batch_size", batch_size)
    positive("max_tokens", max_tokens, allow_none=True)
    for name, value in buffers.items():
        positive(name, value)
    mode, layout = batching(model, mode, recipe)
    if mode == "pack" and max_tokens is not None:
        raise ValueError("`max_tokens` is for mode='bucket'; with mode='pack' a batch is `batch_size` x `seq_len`.")
    max_tokens = seq_len * batch_size if max_tokens is None else max_tokens
    if max_tokens < seq_len:
        raise ValueError(f"`max_tokens` must be at least `seq_len`={seq_len}, but is {max_tokens} instead.")
    return mode, layout, max_tokens
