"""What ``padpipe.hf.Trainer``'s packing check costs at a real vocabulary size, against one training step.

A Llama-shaped model built from ``transformers.LlamaConfig`` (no download) with a ``--vocab``-row
embedding and LM head (151,646 rows by default: Qwen2.5's vocabulary, the size at which the check's
logits dominate), on CPU in float32 with ``sdpa``; one packed batch of the shipped chats through
``padpipe.recipes.sft`` (``--batch-size`` rows of ``--seq-len``). Timed, interleaved over ``--repeat``
rounds (the median of each):

- one training step of that batch: forward with its labels, backward, an AdamW step;
- ``pp.check_packing(model, [batch], columns=...)`` on it, the call ``padpipe.hf.Trainer`` makes before
  its first optimizer step (``hf_packing.guard_columns``: same batch, the columns an ``sdpa`` Llama is given).

Peak memory is the process's resident set sampled every millisecond by a thread, above what it held
before the call.

Usage:
    python benchmarks/check_packing_cost.py [--vocab 151646] [--hidden 256] [--layers 2] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("PADPIPE_PROGRESS", "0")

import psutil  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

import padpipe as pp  # noqa: E402
from padpipe.recipes.sft import sft  # noqa: E402


def peak(fn: Callable[[], Any]) -> tuple[float, float]:
    """Seconds ``fn`` takes and the most resident memory (bytes) it held above its start."""
    process = psutil.Process()
    base = process.memory_info().rss
    top, done = [base], threading.Event()

    def sample() -> None:
        while not done.is_set():
            top[0] = max(top[0], process.memory_info().rss)
            time.sleep(0.001)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    start = time.perf_counter()
    fn()
    seconds = time.perf_counter() - start
    done.set()
    thread.join()
    return seconds, max(top[0] - base, 0)


def model_of(args: argparse.Namespace) -> Any:
    config = transformers.LlamaConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        intermediate_size=2 * args.hidden,
        attn_implementation="sdpa",
        use_cache=False,
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config)


def first_batch(args: argparse.Namespace) -> dict:
    pipe = sft(pp.examples.CHATS_JSONL, pp.examples.chat_tokenizer(), seq_len=args.seq_len, batch_size=args.batch_size)
    return next(iter(pipe.loader()))


COLUMNS = ("input_ids", "position_ids", "labels")  # what padpipe.hf.Trainer gives an sdpa Llama (no flash keys)


def columns(batch: dict) -> dict:
    return {k: batch[k] for k in COLUMNS}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab", type=int, default=151_646)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    model = model_of(args)
    batch = first_batch(args)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step() -> None:
        model.train()
        model(**columns(batch)).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def check() -> None:
        pp.check_packing(model, [batch], columns=columns)

    step()  # AdamW's state is made here, not in a timed round
    times: dict[str, list[tuple[float, float]]] = {"step": [], "check": []}
    for _ in range(args.repeat):
        for name, fn in (("step", step), ("check", check)):
            times[name].append(peak(fn))
    step_s = statistics.median(t for t, _ in times["step"])
    check_s = statistics.median(t for t, _ in times["check"])
    step_m = statistics.median(m for _, m in times["step"])
    check_m = statistics.median(m for _, m in times["check"])
    params = sum(p.numel() for p in model.parameters())
    print(
        f"vocab {args.vocab:,}, hidden {args.hidden}, layers {args.layers} ({params / 1e6:.1f}M parameters, float32, "
        f"sdpa, CPU, {args.threads} threads); batch {args.batch_size} x {args.seq_len}; median of {args.repeat}\n"
    )
    print("| | seconds | vs one step | peak memory above start | vs one step |")
    print("|---|---|---|---|---|")
    print(f"| one training step (fwd+bwd+AdamW) | {step_s:.2f} | 1.00 | {step_m / 1e9:.2f} GB | 1.00 |")
    print(
        f"| `check_packing` on the batch (the Trainer's check) | {check_s:.2f} | {check_s / step_s:.2f} | "
        f"{check_m / 1e9:.2f} GB | {check_m / step_m:.2f} |"
    )


if __name__ == "__main__":
    main()
