"""What ``padpipe.hf.Trainer``'s packing check costs at a real vocabulary size, against one training step.

A Llama-shaped model built from ``transformers.LlamaConfig`` (no download) with a ``--vocab``-row
embedding and LM head (151,646 rows by default: Qwen2.5's vocabulary, the size at which the check's
logits dominate), on CPU in float32 with ``sdpa``; one packed batch of the shipped chats through
``padpipe.recipes.sft`` (``--batch-size`` rows of ``--seq-len``). Timed, interleaved over ``--repeat``
rounds (the median of each):

- one training step of that batch: forward with its labels, backward, an AdamW step;
- ``pp.check_packing(model, [batch], columns=...)`` on it, the call ``padpipe.hf.Trainer`` makes before
  its first optimizer step (``hf_packing.guard_columns``: same batch, the columns an ``sdpa`` Llama is given);
- with ``--trainer-steps N``: ``padpipe.hf.Trainer`` itself on the same pipeline for N steps, each step timed
  (and its peak memory) by a callback: the first step holds the check, the others are plain steps.

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


def pipeline(args: argparse.Namespace) -> Any:
    return sft(pp.examples.CHATS_JSONL, pp.examples.chat_tokenizer(), seq_len=args.seq_len, batch_size=args.batch_size)


def first_batch(args: argparse.Namespace) -> dict:
    return next(iter(pipeline(args).loader()))


def trainer_steps(args: argparse.Namespace) -> list[tuple[float, float]]:
    """``padpipe.hf.Trainer`` on the pipeline: each optimizer step's seconds and peak memory above its start."""
    import tempfile

    from padpipe.hf import Trainer

    process, steps = psutil.Process(), []
    state: dict[str, Any] = {}

    def sample() -> None:
        while not state["done"].is_set():
            state["top"] = max(state["top"], process.memory_info().rss)
            time.sleep(0.001)

    class Clock(transformers.TrainerCallback):
        def on_step_begin(self, *_: Any, **__: Any) -> None:
            state.update(base=process.memory_info().rss, done=threading.Event(), start=time.perf_counter())
            state["top"] = state["base"]
            state["thread"] = threading.Thread(target=sample, daemon=True)
            state["thread"].start()

        def on_step_end(self, *_: Any, **__: Any) -> None:
            seconds = time.perf_counter() - state["start"]
            state["done"].set()
            state["thread"].join()
            steps.append((seconds, state["top"] - state["base"]))

    options = dict(max_steps=args.trainer_steps, report_to=[], use_cpu=True, save_strategy="no")
    training = transformers.TrainingArguments(tempfile.mkdtemp(prefix="padpipe-check-cost-"), **options)
    trainer = Trainer(
        model=model_of(args), args=training, train_dataset=pipeline(args), callbacks=[Clock()], check_packing=args.check
    )
    trainer.train()
    return steps


COLUMNS = ("input_ids", "position_ids", "labels")  # what padpipe.hf.Trainer gives an sdpa Llama (no flash keys)


def columns(batch: dict) -> dict:
    return {k: batch[k] for k in COLUMNS}


def direct(args: argparse.Namespace) -> None:
    """One training step against the check, interleaved over ``--repeat`` rounds (the median of each)."""
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


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab", type=int, default=151_646)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--trainer-steps", type=int, default=0, help="also run padpipe.hf.Trainer this many steps")
    parser.add_argument(
        "--no-check", dest="check", action="store_false", help="the Trainer with check_packing=False (a baseline)"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.repeat:
        direct(args)
    if args.trainer_steps:
        steps = trainer_steps(args)
        plain_s = statistics.median(t for t, _ in steps[1:])
        plain_m = statistics.median(m for _, m in steps[1:])
        what = "the first holds the check" if args.check else "check_packing=False"
        print(f"\npadpipe.hf.Trainer, {len(steps)} steps ({what}): seconds and peak memory per step")
        print("| step | seconds | vs the later steps (median) | peak memory above its start | vs the later steps |")
        print("|---|---|---|---|---|")
        for number, (seconds, memory) in enumerate(steps, 1):
            print(
                f"| {number} | {seconds:.2f} | {seconds / plain_s:.2f} | {memory / 1e9:.2f} GB | "
                f"{memory / plain_m:.2f} |"
            )


if __name__ == "__main__":
    main()
