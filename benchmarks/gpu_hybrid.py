"""GPU check of packing in hybrid models with the real kernels: causal-conv1d, mamba-ssm, flash-linear-attention.

Tiny bfloat16 models of three kinds (tests/hybrid_models.py's configs, with flash-attention for their
attention layers where ``flash_attn`` is installed, else ``sdpa``): Qwen3.5 (Gated DeltaNet: causal-conv1d
and flash-linear-attention), Mamba2 (causal-conv1d and mamba-ssm) and Lfm2 (short convolutions:
causal-conv1d). For each, with its kernels installed:

- ``pp.model_kind`` finds them usable and names the layout: ``flat`` for Qwen3.5, ``rows`` for the others;
- ``pp.check_packing`` on that layout finds every document's own logits (the kernels keep them apart);
- for Qwen3.5 on rows of 2, the check names ``flat_layout`` (FLA: "The batch size is expected to be 1");
- one training step (``model(**batch).loss.backward()``) on that layout gives a finite loss and gradients,
  through the kernels' backward with ``seq_idx``/``cu_seqlens``.

Without a model's packages (or CUDA) its row is ``None`` with the reason; ``ok`` is ``None`` when none ran.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import torch

import padpipe as pp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

EXPECTED = {"qwen3_5_text": "flat", "mamba2": "rows", "lfm2": "rows"}
NEEDS = {"qwen3_5_text": ("causal_conv1d", "fla"), "mamba2": ("causal_conv1d", "mamba_ssm"), "lfm2": ("causal_conv1d",)}


def packed(layout: str, device: torch.device) -> pp.Pipeline:
    pipe = pp.read_jsonl(pp.examples.SAMPLE_JSONL).tokenize(pp.examples.tokenizer(), max_length=96)
    pipe = pipe.pack(256, batch_size=2, layout=layout)
    return pipe.to_cuda() if device.type == "cuda" else pipe


def check_model(model_type: str, device: torch.device) -> dict[str, Any]:
    from tests.hybrid_models import build

    attention = "flash_attention_2" if importlib.util.find_spec("flash_attn") else "sdpa"
    model = build(model_type, attn_implementation=attention).to(device, torch.bfloat16)
    kind = pp.model_kind(model)
    found: dict[str, Any] = {"layout": kind.layout, "attention": attention}
    try:
        pp.check_packing(model, packed(kind.layout, device).loader())
        found["check"] = "exact"
    except pp.PackingError as error:
        found["check"] = error.cause.key if error.cause else "unknown cause"
    if model_type == "qwen3_5_text":
        try:
            pp.check_packing(model, packed("rows", device).loader())
            found["rows"] = "exact"
        except pp.PackingError as error:
            found["rows"] = error.cause.key if error.cause else "unknown cause"
    model.train()
    batch = next(iter(packed(kind.layout, device).loader()))
    loss = model(**batch).loss
    loss.backward()
    grads = all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    found["step"] = bool(torch.isfinite(loss)) and grads
    found["ok"] = (
        kind.layout == EXPECTED[model_type]
        and found["check"] == "exact"
        and found["step"]
        and found.get("rows", "flat_layout") == "flat_layout"
    )
    return found


def check_hybrid_packing(device: torch.device) -> dict[str, Any]:
    """Each model's findings; ``ok`` over those whose kernels are installed (``None`` when none ran)."""
    found: dict[str, Any] = {}
    for model_type, packages in NEEDS.items():
        missing = [p for p in packages if importlib.util.find_spec(p) is None]
        if device.type != "cuda" or missing:
            found[model_type] = None if device.type != "cuda" else f"skipped (not installed: {', '.join(missing)})"
            continue
        found[model_type] = check_model(model_type, device)
    ran = [v for v in found.values() if isinstance(v, dict)]
    return {"ok": all(v["ok"] for v in ran) if ran else None, **found}
