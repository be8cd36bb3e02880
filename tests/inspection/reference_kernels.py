"""Reference kernels for causal-conv1d, mamba-ssm and flash-linear-attention, then every tiny hybrid model packed.

Run as ``python -m tests.inspection.reference_kernels`` (a fresh interpreter: transformers binds a
kernel when it imports a modeling module). Each reference kernel checks what the real one checks of
its boundary argument (their sources: causal-conv1d ``csrc/causal_conv1d.cpp``: ``seq_idx`` int32,
contiguous, ``[batch, seqlen]``, a channel-last input; mamba-ssm ``ops/triton/ssd_combined.py``:
``seq_idx`` ``[batch, seqlen]``; flash-linear-attention 0.6.0 ``ops/gated_delta_rule/chunk.py``,
``ops/kda/chunk.py``: a batch of one row with ``cu_seqlens``, ``ValueError`` otherwise) and then
runs transformers' own torch fallback document by document, as the kernel keeps documents apart.
transformers is told the kernels run on the CPU. It prints one JSON line: for each model type of
tests/hybrid_models.py, what ``pp.model_kind`` finds and ``pp.check_packing``'s verdict on the flat
layout and on rows, and the steps ``padpipe.hf.Trainer`` took on the flat layout.
"""

from __future__ import annotations

import functools
import importlib
import importlib.machinery
import inspect
import json
import sys
import tempfile
import types
from typing import Any

import torch
import transformers.integrations.hub_kernels as hub_kernels

from tests.hybrid_models import TINY, build


def _segments(seq_idx: torch.Tensor) -> list[tuple[int, int]]:
    """``(start, end)`` of each run of one value in a row of ``seq_idx``."""
    change = (seq_idx[1:] != seq_idx[:-1]).nonzero().flatten().add(1).tolist()
    bounds = [0, *change, len(seq_idx)]
    return list(zip(bounds, bounds[1:]))


FALLBACKS = (
    ("mamba2.modeling_mamba2", "causal_conv1d_fn"),
    ("mamba2.modeling_mamba2", "mamba2_chunk_scan"),
    ("qwen3_next.modeling_qwen3_next", "torch_chunk_gated_delta_rule"),
    ("kimi_linear.modeling_kimi_linear", "chunk_kimi_delta_attention"),
)


@functools.cache
def _fallback(module: str, name: str) -> Any:
    """transformers' torch implementation of a hooked kernel (under its hook, and the module ``kernels`` makes of it)."""
    hooked = getattr(importlib.import_module(f"transformers.models.{module}"), name)
    if isinstance(hooked, torch.nn.Module):  # the `kernels` package's module around the hooked function
        hooked = inspect.getclosurevars(type(hooked).forward).nonlocals["func"]
    return inspect.unwrap(hooked)


def causal_conv1d_fn(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    seq_idx: torch.Tensor | None = None,
    initial_states: torch.Tensor | None = None,
    return_final_states: bool = False,
    final_states_out: torch.Tensor | None = None,
    activation: str | None = None,
) -> torch.Tensor:
    torch_fn = _fallback("mamba2.modeling_mamba2", "causal_conv1d_fn")
    if seq_idx is None:
        return torch_fn(x, weight, bias, activation=activation)
    assert x.stride(1) == 1, "seq_idx is only supported for channel last layout"
    assert seq_idx.dtype == torch.int32 and seq_idx.is_contiguous() and seq_idx.shape == (x.shape[0], x.shape[2])
    assert initial_states is None and not return_final_states
    rows = [
        torch.cat([torch_fn(x[b : b + 1, :, s:e], weight, bias, activation=activation) for s, e in _segments(row)], 2)
        for b, row in enumerate(seq_idx)
    ]
    return torch.cat(rows)


def mamba_chunk_scan_combined(
    x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor, chunk_size: int,
    D: torch.Tensor | None = None, z: torch.Tensor | None = None, dt_bias: torch.Tensor | None = None,
    initial_states: torch.Tensor | None = None, seq_idx: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None, dt_softplus: bool = False,
    dt_limit: tuple[float, float] = (0.0, float("inf")), return_final_states: bool = False,
    return_varlen_states: bool = False,
) -> Any:  # fmt: skip
    torch_fn = _fallback("mamba2.modeling_mamba2", "mamba2_chunk_scan")
    options = dict(chunk_size=chunk_size, D=D, dt_bias=dt_bias, dt_softplus=dt_softplus, dt_limit=dt_limit)
    assert z is None and not return_varlen_states
    if seq_idx is None:
        return torch_fn(
            x, dt, A, B, C, initial_states=initial_states, return_final_states=return_final_states, **options
        )
    assert seq_idx.shape == x.shape[:2] and initial_states is None and not return_final_states
    rows = []
    for b, row in enumerate(seq_idx):
        parts = [torch_fn(*(t[b : b + 1, s:e] for t in (x, dt)), A, *(t[b : b + 1, s:e] for t in (B, C)), **options)
                 for s, e in _segments(row)]  # fmt: skip
        rows.append(torch.cat(parts, 1))
    return torch.cat(rows)


def mamba_split_conv1d_scan_combined(*args: Any, seq_idx: torch.Tensor | None = None, **kwargs: Any) -> None:
    """Not the fused kernel: transformers then runs the convolution and the scan apart (the two above)."""
    return None


def _varlen(module: str, name: str) -> Any:
    """flash-linear-attention's chunk kernel: ``cu_seqlens`` over a batch of one row, else one sequence a row."""

    def kernel(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
        scale: float | None = None, initial_state: torch.Tensor | None = None, output_final_state: bool = False,
        use_qk_l2norm_in_kernel: bool = False, cu_seqlens: torch.Tensor | None = None, **kwargs: Any,
    ) -> tuple[torch.Tensor, Any]:  # fmt: skip
        torch_fn = _fallback(module, name)
        options = dict(use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)
        if cu_seqlens is None:
            return torch_fn(q, k, v, g=g, beta=beta, initial_state=initial_state,
                            output_final_state=output_final_state, **options)  # fmt: skip
        if q.shape[0] != 1:
            raise ValueError(
                f"The batch size is expected to be 1 rather than {q.shape[0]} when using `cu_seqlens`."
                "Please flatten variable-length inputs before processing."
            )
        bounds = cu_seqlens.tolist()
        assert cu_seqlens.dim() == 1 and bounds[0] == 0 and bounds[-1] == q.shape[1] and initial_state is None
        assert cu_seqlens.dtype in (torch.int32, torch.int64)
        parts = [torch_fn(*(t[:, s:e] for t in (q, k, v)), g=g[:, s:e], beta=beta[:, s:e], **options)[0]
                 for s, e in zip(bounds, bounds[1:])]  # fmt: skip
        return torch.cat(parts, 1), None

    return kernel


def install() -> None:
    """The three packages as modules holding the reference kernels, usable on the CPU (for transformers)."""
    layout = {
        "causal_conv1d": {"": {"causal_conv1d_fn": causal_conv1d_fn}},
        "mamba_ssm": {
            "ops.triton.ssd_combined": {
                "mamba_chunk_scan_combined": mamba_chunk_scan_combined,
                "mamba_split_conv1d_scan_combined": mamba_split_conv1d_scan_combined,
            }
        },
        "fla": {
            "ops.gated_delta_rule": {
                "chunk_gated_delta_rule": _varlen("qwen3_next.modeling_qwen3_next", "torch_chunk_gated_delta_rule")
            },
            "ops.kda": {"chunk_kda": _varlen("kimi_linear.modeling_kimi_linear", "chunk_kimi_delta_attention")},
        },
    }
    for package, parts in layout.items():
        for part, functions in parts.items():
            names = [package, *(part.split(".") if part else [])]
            for i in range(1, len(names) + 1):
                name = ".".join(names[:i])
                if name not in sys.modules:
                    sys.modules[name] = types.ModuleType(name)
                    sys.modules[name].__spec__ = importlib.machinery.ModuleSpec(name, None)
                    if i > 1:
                        setattr(sys.modules[".".join(names[: i - 1])], names[i - 1], sys.modules[name])
            for function, implementation in functions.items():
                setattr(sys.modules[".".join(names)], function, implementation)
        hub_kernels._PACKAGE_SUPPORTED_DEVICES[package] = ("cpu",)


def main() -> None:
    install()
    for module, name in FALLBACKS:  # found now, before model_kind's probe wraps the hooked functions for a call
        _fallback(module, name)
    import transformers

    import padpipe as pp
    from padpipe.hf import Trainer
    from padpipe.inspection import packing_model
    from tests.inspection.test_hybrid_models import packed

    packing_model.PACKAGES = {k: (name, ("cpu",)) for k, (name, _) in packing_model.PACKAGES.items()}
    results: dict[str, Any] = {}
    for model_type in sorted(TINY):
        model = build(model_type)
        kind = pp.model_kind(model)
        got: dict[str, Any] = {"kind": [kind.kind, kind.layout]}
        layouts = (
            {"flat": packed("flat"), "rows": packed("rows")} if kind.kind == "varlen" else {"flat": packed("flat")}
        )
        if kind.mask_without_positions:  # its attention needs a block mask (or flash-attention) too
            layouts["rows"] = packed("rows", block_mask=True)
        for layout, pipe in layouts.items():
            try:
                pp.check_packing(model, pipe.loader(), max_documents=4)
                got[layout] = "exact"
            except pp.PackingError as error:
                got[layout] = f"PackingError {error.cause.key if error.cause else None}: {error}"
        results[model_type] = got
    results["trained"] = {}
    with tempfile.TemporaryDirectory() as out:
        for model_type in ("qwen3_5_text",):
            args = transformers.TrainingArguments(out, max_steps=2, report_to=[], use_cpu=True, save_strategy="no")
            trainer = Trainer(model=build(model_type), args=args, train_dataset=packed("flat"))
            trainer.train()
            results["trained"][model_type] = trainer.state.global_step
    print(json.dumps(results))


if __name__ == "__main__":
    main()
