"""GPU checks of the device stage, in one short run (under 3 minutes on one GPU).

1. Correctness: every batch of ``.to_cuda(prefetch=2)`` equals (after ``.cpu()``) the batch of
   ``.prefetch(2)`` at the same position, over one epoch of the shipped sample, and a loader
   resumed from a mid-epoch state continues with the same batches.
2. Host-to-device copy speed (GB/s), pinned vs pageable memory, for a batch-sized buffer and a
   256 MB one.
3. Input stall: the share of a small model's training step (4-layer ``TransformerEncoder``,
   ``d_model`` 512, bf16 autocast, LM head over the vocabulary) that the loop spends waiting for
   its next batch, for three ways of feeding it: plain CPU batches moved with ``.cuda()`` in the
   loop, ``.prefetch(2)`` batches moved with ``.cuda()`` in the loop, and ``.to_cuda(prefetch=2)``.
   Each step ends with ``torch.cuda.synchronize()`` (as a loop that logs ``loss.item()`` does), so
   step time = input wait + compute, and the wait is the time in ``next(loader)`` plus the copy.

Prints a table and writes ``benchmarks/out/gpu_check.json``; exits 1 if a correctness check fails.
Without CUDA it prints ``no CUDA device: skipped`` and exits 0; ``--smoke`` then runs the same code
paths on the CPU (tiny model, a few steps, no copies) to check the script itself.

Usage:
    python benchmarks/gpu_check.py [--steps 60] [--out benchmarks/out/gpu_check.json]
    python benchmarks/gpu_check.py --smoke   # CPU only: exercise the script, measure nothing
"""

from __future__ import annotations

import argparse
import itertools
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import torch
from torch import nn

import padpipe as pp
from padpipe.pipes.device import iter_tensors, map_tensors

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


def device_pipeline(pipe: pp.Pipeline, device: torch.device) -> pp.Pipeline:
    """``.to_cuda(prefetch=2)`` on a GPU; ``.prefetch(2)`` in the CPU smoke run."""
    return pipe.to_cuda(device, prefetch=2) if device.type == "cuda" else pipe.prefetch(2)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


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


# -- 1. correctness -------------------------------------------------------------------------------
def check_equal(pipe: pp.Pipeline, device: torch.device, max_batches: int | None) -> dict[str, Any]:
    """Device batches equal CPU batches over one epoch; a mid-epoch resume continues identically."""
    cpu_loader, dev_loader = pipe.prefetch(2).loader(), device_pipeline(pipe, device).loader()
    batches, problems, resume_state, resume_expected = 0, [], None, None
    for i, (expected, got) in enumerate(itertools.zip_longest(cpu_loader, dev_loader)):
        if expected is None or got is None:
            problems.append(f"batch {i}: only the {'device' if expected is None else 'CPU'} loader has it")
            break
        problem = same_batch(got, expected, device)
        if problem:
            problems.append(f"batch {i}: {problem}")
        if i == 4:
            resume_state = dev_loader.state_dict()
        if i == 5:
            resume_expected = expected
        batches += 1
        if max_batches is not None and batches >= max_batches:
            break
    resumed_ok = None
    if resume_state is not None and resume_expected is not None:
        fresh = device_pipeline(pipe, device).loader()
        fresh.load_state_dict(resume_state)
        resumed_ok = same_batch(next(iter(fresh)), resume_expected, device) is None
        if not resumed_ok:
            problems.append("resume after batch 4: batch 5 differs")
    return {"batches": batches, "equal": not problems, "resume_equal": resumed_ok, "problems": problems[:10]}


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
        name: {"bytes": size, "pinned_gbps": copy_gbps(size, True, device), "pageable_gbps": copy_gbps(size, False, device)}
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


def forever(loader: Any) -> Iterator[dict[str, Any]]:
    while True:
        yield from loader


def to_device(batch: dict[str, Any], device: torch.device) -> dict[str, Any]:
    return map_tensors(batch, lambda t: t.to(device))


def train(model: nn.Module, optimizer: torch.optim.Optimizer, batches: Iterator[dict[str, Any]], *,
          device: torch.device, move: bool, warmup: int, steps: int) -> dict[str, float]:
    """Time ``steps`` training steps after ``warmup``: seconds waiting for input vs the whole step."""
    wait = total = 0.0
    tokens = 0
    for step in range(warmup + steps):
        sync(device)
        start = time.perf_counter()
        batch = next(batches)
        if move:
            batch = to_device(batch, device)
        got = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = model(batch["input_ids"], batch["attention_mask"])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        sync(device)
        end = time.perf_counter()
        if step >= warmup:
            wait, total = wait + got - start, total + end - start
            tokens += int(batch["input_ids"].numel())
    return {
        "step_ms": 1000 * total / steps,
        "wait_ms": 1000 * wait / steps,
        "stall_share": wait / total,
        "padded_tokens_per_s": tokens / total,
    }


def check_stall(pipe: pp.Pipeline, device: torch.device, *, d_model: int, warmup: int, steps: int) -> dict[str, Any]:
    vocab = pp.examples.tokenizer().get_vocab_size()
    torch.manual_seed(0)
    model = TinyEncoder(vocab, d_model, layers=4).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    feeds = {  # each loader is built when its turn comes, so no other feed's thread runs meanwhile
        "cpu + .cuda() in loop": (pipe.loader, True),
        ".prefetch(2) + .cuda() in loop": (pipe.prefetch(2).loader, True),
        ".to_cuda(prefetch=2)": (device_pipeline(pipe, device).loader, False),
    }
    # compute alone: the same kind of batches already on the device
    staged = [to_device(b, device) for _, b in zip(range(warmup + steps), forever(pipe.loader()))]
    results = {"compute only (batches staged on device)": train(
        model, optimizer, iter(staged), device=device, move=False, warmup=warmup, steps=steps)}
    del staged
    for name, (make_loader, move) in feeds.items():
        batches = forever(make_loader())
        results[name] = train(model, optimizer, batches, device=device, move=move, warmup=warmup, steps=steps)
        batches.close()  # drops the loader, which stops its prefetch thread
    return results


# -- report ---------------------------------------------------------------------------------------
def print_report(report: dict[str, Any]) -> None:
    eq = report["equal"]
    print(f"\n{report['device_name']}  torch {report['torch']}")
    print(f"\n1. device batches == CPU batches: {eq['equal']} over {eq['batches']} batches; "
          f"resume equal: {eq['resume_equal']}")
    for problem in eq["problems"]:
        print(f"   {problem}")
    if "copies" in report:
        print("\n2. host->device copy      bytes        pinned GB/s   pageable GB/s")
        for name, row in report["copies"].items():
            print(f"   {name:<20} {row['bytes']:>12,} {row['pinned_gbps']:>13.2f} {row['pageable_gbps']:>15.2f}")
    print("\n3. input stall                                step ms   wait ms   stall share   padded tok/s")
    for name, row in report["stall"].items():
        print(f"   {name:<42} {row['step_ms']:>8.2f} {row['wait_ms']:>9.2f} {row['stall_share']:>12.1%} "
              f"{row['padded_tokens_per_s']:>14,.0f}")


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
        device, d_model, max_batches, pipe = torch.device("cpu"), 32, 8, base_pipeline(max_tokens=1024, buffer_size=512)
        args.steps, args.warmup, name = 2, 1, f"CPU smoke run ({platform.processor() or platform.machine()})"
    else:
        print("no CUDA device: skipped")
        return 0

    started = time.perf_counter()
    report: dict[str, Any] = {"device_name": name, "torch": torch.__version__, "cuda": torch.version.cuda}
    report["equal"] = check_equal(pipe, device, max_batches)
    if device.type == "cuda":
        first = next(iter(pipe.loader()))
        report["copies"] = check_copies(device, sum(t.nbytes for t in iter_tensors(first)))
    report["stall"] = check_stall(pipe, device, d_model=d_model, warmup=args.warmup, steps=args.steps)
    report["seconds"] = time.perf_counter() - started
    print_report(report)
    print(f"\ntotal {report['seconds']:.1f} s")
    if device.type == "cuda":
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.out}")
    return 0 if report["equal"]["equal"] and report["equal"]["resume_equal"] is not False else 1


if __name__ == "__main__":
    sys.exit(main())
