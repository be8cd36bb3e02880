"""The correctness half of benchmarks/gpu_check.py: device batches equal CPU batches, in every setting.

Each check returns ``{"ok": bool | None, ...}`` (``None``: could not run here, e.g. no
flash-attention kernel) and runs on the CPU too (``--smoke``), with ``.prefetch(2)`` standing in
for ``.to_cuda(prefetch=2)``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import torch

import padpipe as pp
from padpipe.pipes.batch_tensors import map_tensors
from padpipe.runtime.batch_cut import split_batch


def device_pipeline(pipe: pp.Pipeline, device: torch.device) -> pp.Pipeline:
    """``.to_cuda(prefetch=2)`` on a GPU; ``.prefetch(2)`` in the CPU smoke run."""
    return pipe.to_cuda(device, prefetch=2) if device.type == "cuda" else pipe.prefetch(2)


def to_device(batch: Any, device: torch.device) -> Any:
    return map_tensors(batch, lambda t: t.to(device))


def same_batch(got: dict[str, Any], expected: dict[str, Any], device: torch.device) -> str | None:
    """``None`` if equal (tensors on ``device``, equal after ``.cpu()``), else what differs."""
    if sorted(got) != sorted(expected):
        return f"keys {sorted(got)} instead of {sorted(expected)}"
    for key, value in expected.items():
        if isinstance(value, torch.Tensor):
            other = got[key]
            if not isinstance(other, torch.Tensor) or other.device.type != device.type:
                return f"{key!r} is not a tensor on {device.type}"
            if other.dtype != value.dtype or not torch.equal(other.cpu(), value):
                return f"{key!r} differs"
        elif got[key] != value:
            return f"{key!r} (not a tensor) differs"
    return None


def compare(expected: Any, got: Any, device: torch.device, max_batches: int | None) -> tuple[int, list[str]]:
    """Batches compared and the problems found, position by position."""
    batches, problems = 0, []
    for i, (want, have) in enumerate(itertools.zip_longest(expected, got)):
        if want is None or have is None:
            problems.append(f"batch {i}: only the {'device' if want is None else 'CPU'} loader has it")
            break
        problem = same_batch(have, want, device)
        if problem:
            problems.append(f"batch {i}: {problem}")
        batches += 1
        if max_batches is not None and batches >= max_batches:
            break
    return batches, problems


def check_equal(pipe: pp.Pipeline, device: torch.device, max_batches: int | None) -> dict[str, Any]:
    """Device batches equal CPU batches over one epoch; a loader resumed after batch 4 continues with batch 5."""
    batches, problems = compare(pipe.prefetch(2).loader(), device_pipeline(pipe, device).loader(), device, max_batches)
    loader = device_pipeline(pipe, device).loader()
    expected = list(itertools.islice(pipe.loader(), 6))
    for _ in zip(range(5), loader):
        pass
    fresh = device_pipeline(pipe, device).loader()
    fresh.load_state_dict(loader.state_dict())
    resumed = same_batch(next(iter(fresh)), expected[5], device) is None
    if not resumed:
        problems.append("resume after batch 4: batch 5 differs")
    return {"ok": not problems, "batches": batches, "resume_equal": resumed, "problems": problems[:10]}


def packed_pipeline(seq_len: int = 256, batch_size: int = 5) -> pp.Pipeline:
    return (
        pp.read_jsonl(pp.examples.SAMPLE_JSONL).tokenize(pp.examples.tokenizer()).pack(seq_len, batch_size=batch_size)
    )


def check_split(device: torch.device) -> dict[str, Any]:
    """Equal steps' split of a packed batch on the device equals the split of the same batch on the CPU."""
    batch = next(iter(packed_pipeline().loader()))
    halves = split_batch(to_device(batch, device))
    problems = [p for got, want in zip(halves or (), split_batch(batch)) if (p := same_batch(got, want, device))]
    return {"ok": halves is not None and not problems, "problems": problems}


def check_workers(
    pipe: pp.Pipeline, device: torch.device, model: torch.nn.Module, max_batches: int | None
) -> dict[str, Any]:
    """``loader(num_workers=2)`` forked after ``model`` is on the device: the same batches as on the CPU."""
    expected = pipe.loader(num_workers=2, multiprocessing_context="fork")
    got = device_pipeline(pipe, device).loader(num_workers=2, multiprocessing_context="fork")
    batches, problems = compare(expected, got, device, max_batches or 40)
    return {
        "ok": not problems,
        "batches": batches,
        "model_on": str(next(model.parameters()).device),
        "problems": problems[:10],
    }


def varlen_kernel() -> tuple[str, Callable[..., torch.Tensor]] | None:
    """A causal flash-attention varlen kernel: ``flash_attn``'s, else torch's, else ``None``."""
    try:
        from flash_attn import flash_attn_varlen_func

        return "flash_attn", lambda q, k, v, cu, n: flash_attn_varlen_func(q, k, v, cu, cu, n, n, causal=True)
    except ImportError:
        pass
    try:
        from torch.nn.attention.varlen import varlen_attn

        return "torch varlen_attn", lambda q, k, v, cu, n: varlen_attn(q, k, v, cu, cu, n, n, window_size=(-1, 0))
    except ImportError:
        return None


def check_varlen(device: torch.device) -> dict[str, Any]:
    """A packed batch through real varlen flash-attention equals attention over each document alone."""
    kernel = varlen_kernel()
    if device.type != "cuda" or kernel is None:
        return {"ok": None, "kernel": None if kernel is None else kernel[0], "why": "needs CUDA and a varlen kernel"}
    batch = to_device(next(iter(packed_pipeline(512, 4).loader())), device)
    torch.manual_seed(0)
    heads, dim, tokens = 4, 64, batch["input_ids"].numel()
    q, k, v = (torch.randn(tokens, heads, dim, device=device, dtype=torch.bfloat16) for _ in range(3))
    cu = batch["cu_seq_lens_q"]
    try:
        out = kernel[1](q, k, v, cu, batch["max_length_q"])
    except RuntimeError as error:  # e.g. a GPU the kernel does not support
        return {"ok": None, "kernel": kernel[0], "why": str(error)[:200]}
    bounds, worst = cu.tolist(), 0.0
    for a, b in zip(bounds, bounds[1:]):
        ref = torch.nn.functional.scaled_dot_product_attention(
            *(t[a:b].transpose(0, 1).float() for t in (q, k, v)), is_causal=True
        ).transpose(0, 1)
        worst = max(worst, float((out[a:b].float() - ref).abs().max()))
    return {"ok": worst < 2e-2, "kernel": kernel[0], "segments": len(bounds) - 1, "max_abs_error": worst}
