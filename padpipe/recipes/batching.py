"""How a recipe batches for a model: packed rows, one flat row, or buckets where packing cannot be right.

:func:`batching` reads :func:`padpipe.model_kind` once and turns its verdict into a recipe's
``mode`` and ``pack(layout=...)``: a model whose layers carry state from one document into the
next with nothing here to keep them apart is bucketed (one document a row, padded on the right,
where a causal model's real tokens never read the padding), and told so in one warning line.
"""

from __future__ import annotations

import logging
from typing import Any

from padpipe.errors import one_of
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
