"""GPU checks of the device stage, in one short run (a few minutes on one GPU).

1. Correctness (benchmarks/gpu_correctness.py): every batch of ``.to_cuda(prefetch=2)`` equals
   (after ``.cpu()``) the batch of ``.prefetch(2)`` at the same position over one epoch of the
   shipped sample, and a loader resumed mid-epoch continues with the same batches; equal steps'
   split of a packed batch on the GPU equals the CPU split; ``loader(num_workers=2)`` forked after
   the model is on the GPU gives the same batches; a packed batch through a real varlen
   flash-attention kernel (``flash_attn``, else torch's ``varlen_attn``) equals attention over
   each document alone; ``pp.check_packing`` on a tiny bf16 Llama with the GPU's sdpa and
   ``flash_attention_2`` kernels gives the verdicts docs/packing.md states (benchmarks/gpu_packing.py);
   tiny bf16 hybrids (Qwen3.5, Mamba2, Lfm2) with the real causal-conv1d, mamba-ssm and
   flash-linear-attention kernels keep packed documents apart in the layout ``pp.model_kind`` names,
   flat for flash-linear-attention, and train a step on it (benchmarks/gpu_hybrid.py).
2. Host-to-device copy speed (GB/s), pinned vs pageable memory, for a batch-sized buffer and a
   256 MB one.
3. Input stall of a small model's training step (4-layer ``TransformerEncoder``, ``d_model``
   512, bf16 autocast, LM head over the vocabulary), for five feeds: batches already on the GPU
   (compute only), CPU batches moved with ``.cuda()`` in the loop, ``.prefetch(2)`` batches moved
   with ``.cuda()`` (pageable, blocking) or pinned + ``non_blocking`` in the loop, and
   ``.to_cuda(prefetch=2)``. Each step ends with ``loss.item()``, which waits for the current
   stream only, as a loop that logs its loss does (never a device-wide ``synchronize``, which
   would also wait for the copy stream). Per feed: throughput over the timed steps, the median
   and p95 step and host wait (time in ``next(loader)`` plus any move), the GPU's own wait
   (CUDA events around ``next(loader)`` on the current stream: the ``wait_event`` on the copy
   counts there), and the epoch-start steps (the bucket buffer refills) apart.

Prints a table and writes ``benchmarks/out/gpu_check.json``; exits 1 if a correctness check fails.
Without CUDA it prints ``no CUDA device: skipped`` and exits 0; ``--smoke`` then runs the same code
paths on the CPU (tiny model in float32, 512-token batches, one step a feed and no warm-up, ``.prefetch(2)``
in place of ``.to_cuda``) to check the script itself. With a GPU, run the race tests first (one command):

    python -m pytest -q tests/pipes/test_device_gpu.py tests/pipes/test_device.py && python benchmarks/gpu_check.py

Usage:
    python benchmarks/gpu_check.py [--steps 60] [--out benchmarks/out/gpu_check.json]
    python benchmarks/gpu_check.py --smoke   # CPU only: exercise the script, measure nothing
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from gpu_correctness import check_equal, check_split, check_varlen, check_workers, device_pipeline, to_device
from gpu_hybrid import check_hybrid_packing
from gpu_packing import check_model_packing
from torch import nn

import padpipe as pp
from padpipe.pipes.batch_tensors import iter_tensors, map_tensors

FIELDS = ("sentence1", "sentence2")
MAX_TOKENS = 16384
OUT = Path(__file__).parent / "out" / "gpu_check.json"


def base_pipeline(max_tokens: int = MAX_TOKENS, buffer_size: int = 10_000) -> pp.Pipeline:
    """The shipped sample: sentence pairs, bucketed by padded-token budget, padded to multiples of 8."""
    return (
        pp.read_parquet(pp.examples.SAMPLE_PARQUET)
        .tokenize(pp.examples.tokenizer(), fields=FIELDS, max_length=512)
        .bucket(max_tokens=max_tokens, buffer_size=buffer_size)
        .pad(pad_to_multiple_of=8)
    )


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# -- 2. copy speed ----------------------------------------------------------------------------------
def copy_gbps(nbytes: int, pinned: bool, device: torch.device, seconds: float = 0.5) -> float:
    """Host-to-device GB/s of ``copy_(non_blocking=True)`` from a pinned or pageable buffer."""
    src = torch.empty(nbytes, dtype=torch.uint8)
    src = src.pin_memory() if pinned else src
    dst = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst.copy_(src, non_blocking=True)  # warm-up
    sync(device)
    repeats, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(10):
            dst.copy_(src, non_blocking=True)
        repeats += 10
        sync(device)
    return nbytes * repeats / (time.perf_counter() - start) / 1e9


def check_copies(device: torch.device, batch_bytes: int) -> dict[str, Any]:
    sizes = {"batch": batch_bytes, "256MB": 256 * 2**20}
    return {
        name: {
            "bytes": size,
            "pinned_gbps": copy_gbps(size, True, device),
            "pageable_gbps": copy_gbps(size, False, device),
        }
        for name, size in sizes.items()
    }


# -- 3. input stall ---------------------------------------------------------------------------------
class TinyEncoder(nn.Module):
    """Embedding, a ``TransformerEncoder`` and an LM head over the vocabulary."""

    def __init__(self, vocab: int, d_model: int, layers: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        layer = nn.TransformerEncoderLayer(d_model, nhead=8, dim_feedforward=4 * d_model, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, vocab)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.encoder(self.embed(input_ids), src_key_padding_mask=attention_mask == 0)
        logits = self.head(hidden).float()
        targets = input_ids.masked_fill(attention_mask == 0, -100)
        return nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100)


def forever(batches: Any) -> Iterator[tuple[dict[str, Any], bool]]:
    """``(batch, first of its epoch)`` over epoch after epoch."""
    while True:
        for i, batch in enumerate(batches):
            yield batch, i == 0


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else float("nan")


def train(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    batches: Iterator[tuple[dict[str, Any], bool]],
    *,
    device: torch.device,
    move: Callable[[Any], Any] | None,
    warmup: int,
    steps: int,
) -> dict[str, Any]:
    """Time ``steps`` training steps after ``warmup``; each ends with ``loss.item()`` (see the module docs)."""
    cuda = device.type == "cuda"
    timed: list[tuple[float, float, Any, Any, bool]] = []
    tokens, started = 0, 0.0
    for step in range(warmup + steps):
        if step == warmup:
            started = time.perf_counter()
        start = time.perf_counter()
        before = torch.cuda.Event(enable_timing=True) if cuda else None
        if before is not None:
            before.record()
        batch, epoch_start = next(batches)
        batch = move(batch) if move is not None else batch
        after = torch.cuda.Event(enable_timing=True) if cuda else None
        if after is not None:
            after.record()
        got = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):  # CPU: float32
            loss = model(batch["input_ids"], batch["attention_mask"])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loss.item()  # waits for the current stream only
        if step >= warmup:
            timed.append((got - start, time.perf_counter() - start, before, after, epoch_start))
            tokens += int(batch["input_ids"].numel())
    total = time.perf_counter() - started
    sync(device)  # every event has happened: read them
    steady = [row for row in timed if not row[4]] or timed
    gpu_wait = [1e-3 * b.elapsed_time(a) for _, _, b, a, _ in steady] if cuda else []
    return {
        "steps": steps,
        "steps_per_s": steps / total,
        "padded_tokens_per_s": tokens / total,
        "step_ms_median": 1000 * statistics.median(r[1] for r in steady),
        "step_ms_p95": 1000 * percentile([r[1] for r in steady], 0.95),
        "wait_ms_median": 1000 * statistics.median(r[0] for r in steady),
        "wait_ms_p95": 1000 * percentile([r[0] for r in steady], 0.95),
        "gpu_wait_ms_median": 1000 * statistics.median(gpu_wait) if gpu_wait else None,
        "epoch_start_step_ms": [1000 * r[1] for r in timed if r[4]],
        "stall_share": sum(r[0] for r in timed) / total,
    }


def pinned_move(device: torch.device) -> Callable[[Any], Any]:
    """Pin in the loop, then ``non_blocking`` copies (on the CPU: a plain move)."""
    if device.type != "cuda":
        return lambda batch: to_device(batch, device)
    return lambda batch: map_tensors(batch, lambda t: t.pin_memory().to(device, non_blocking=True))


def feeds(pipe: pp.Pipeline, device: torch.device) -> dict[str, tuple[Callable[[], Any], Callable[[Any], Any] | None]]:
    """Feed name -> (make its loader, move in the loop); each loader is made when its turn comes."""
    blocking = lambda batch: to_device(batch, device)  # noqa: E731 - pageable, blocking
    last = ".to_cuda(prefetch=2)" if device.type == "cuda" else ".to_cuda(prefetch=2) [smoke: .prefetch(2)]"
    return {
        "cpu + .cuda() in loop": (pipe.loader, blocking),
        ".prefetch(2) + .cuda() in loop": (pipe.prefetch(2).loader, blocking),
        ".prefetch(2) + pin + non_blocking in loop": (pipe.prefetch(2).loader, pinned_move(device)),
        last: (device_pipeline(pipe, device).loader, None),
    }


def check_stall(
    pipe: pp.Pipeline, device: torch.device, model: nn.Module, *, warmup: int, steps: int
) -> dict[str, Any]:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    staged = [(to_device(b, device), first) for (b, first), _ in zip(forever(pipe.loader()), range(warmup + steps))]
    results = {
        "compute only (batches staged on device)": train(
            model, optimizer, iter(staged), device=device, move=None, warmup=warmup, steps=steps
        )
    }
    del staged
    for name, (make_loader, move) in feeds(pipe, device).items():
        batches = forever(make_loader())
        results[name] = train(model, optimizer, batches, device=device, move=move, warmup=warmup, steps=steps)
        batches.close()  # drops the loader, which stops its prefetch thread
    return results


# -- report ---------------------------------------------------------------------------------------
def print_report(report: dict[str, Any]) -> None:
    eq = report["equal"]
    print(f"\n{report['device_name']}  torch {report['torch']}")
    print(
        f"\n1. device batches == CPU batches: {eq['ok']} over {eq['batches']} batches; "
        f"resume equal: {eq['resume_equal']}"
    )
    for name in ("split", "workers", "varlen", "packing", "hybrid"):
        row = report[name]
        print(f"   {name}: {row['ok']}  " + ", ".join(f"{k}={v}" for k, v in row.items() if k != "ok"))
    for problem in eq["problems"]:
        print(f"   {problem}")
    if "copies" in report:
        print("\n2. host->device copy      bytes        pinned GB/s   pageable GB/s")
        for name, row in report["copies"].items():
            print(f"   {name:<20} {row['bytes']:>12,} {row['pinned_gbps']:>13.2f} {row['pageable_gbps']:>15.2f}")
    print(
        "\n3. input stall (ms: median/p95)                     step          wait    gpu wait   padded tok/s"
        "   epoch-start steps"
    )
    for name, row in report["stall"].items():
        gpu = "-" if row["gpu_wait_ms_median"] is None else f"{row['gpu_wait_ms_median']:.2f}"
        starts = ", ".join(f"{ms:.0f}" for ms in row["epoch_start_step_ms"]) or "-"
        print(
            f"   {name:<46} {row['step_ms_median']:>6.2f}/{row['step_ms_p95']:<6.2f} "
            f"{row['wait_ms_median']:>6.2f}/{row['wait_ms_p95']:<6.2f} {gpu:>8} {row['padded_tokens_per_s']:>14,.0f}"
            f"   {starts}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60, help="timed training steps per feed")
    parser.add_argument("--warmup", type=int, default=10, help="untimed steps before them")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--smoke", action="store_true", help="without CUDA: run the code paths on the CPU")
    args = parser.parse_args(argv)

    if torch.cuda.is_available():
        device, d_model, max_batches = torch.device("cuda", torch.cuda.current_device()), 512, None
        name, pipe = torch.cuda.get_device_name(device), base_pipeline()
    elif args.smoke:
        device, d_model, max_batches, pipe = torch.device("cpu"), 32, 8, base_pipeline(max_tokens=512, buffer_size=512)
        args.steps, args.warmup, name = 1, 0, f"CPU smoke run ({platform.processor() or platform.machine()})"
    else:
        print("no CUDA device: skipped")
        return 0

    started = time.perf_counter()
    report: dict[str, Any] = {"device_name": name, "torch": torch.__version__, "cuda": torch.version.cuda}
    report["equal"] = check_equal(pipe, device, max_batches)
    report["split"] = check_split(device)
    torch.manual_seed(0)
    model = TinyEncoder(pp.examples.tokenizer().get_vocab_size(), d_model, layers=4).to(device)
    report["workers"] = check_workers(pipe, device, model, max_batches)
    report["varlen"] = check_varlen(device)
    report["packing"] = check_model_packing(device)
    report["hybrid"] = check_hybrid_packing(device)
    if device.type == "cuda":
        first = next(iter(pipe.loader()))
        report["copies"] = check_copies(device, sum(t.nbytes for t in iter_tensors(first)))
    report["stall"] = check_stall(pipe, device, model, warmup=args.warmup, steps=args.steps)
    report["seconds"] = time.perf_counter() - started
    print_report(report)
    print(f"\ntotal {report['seconds']:.1f} s")
    if device.type == "cuda":
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.out}")
    checks = [report[k]["ok"] for k in ("equal", "split", "workers", "varlen", "packing", "hybrid")] + [
        report["equal"]["resume_equal"]
    ]
    return 1 if False in checks else 0


if __name__ == "__main__":
    sys.exit(main())
