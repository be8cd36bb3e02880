"""What knowing the model costs, and what the flat layout fills: ``pp.model_kind``'s probe and ``layout="flat"``.

1. The probe. ``pp.model_kind(model)`` on models built from configs (no download), CPU float32,
   against one training step of a ``--batch-size`` x ``--seq-len`` batch (forward with labels,
   backward, an AdamW step), interleaved over ``--repeat`` rounds (the median of each): a
   Qwen3.5-shaped hybrid (Gated DeltaNet and attention layers; the probe runs a 16-token forward),
   a Mamba (recurrent: read from its config and code, no forward; its step is not timed: the torch
   fallback of its scan takes minutes on a CPU) and a Llama (attention only). The step's batch is
   bucketed (one document a row), as the verdict says on a CPU without kernels.
2. The fill. ``pack(seq_len, batch_size=B)`` in rows against ``layout="flat"`` on the same documents:
   the shipped chats (``padpipe.recipes.sft``'s rows) and long documents (lognormal lengths, median
   300, to 10,000, split at ``seq_len``: benchmarks/pack_speed.py's corpus), real tokens over slots.

Usage:
    python benchmarks/model_kinds.py [--hidden 256] [--layers 4] [--vocab 32000] [--repeat 2]
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("PADPIPE_PROGRESS", "0")

import torch  # noqa: E402
import transformers  # noqa: E402
from torchdata.nodes import IterableWrapper  # noqa: E402

import padpipe as pp  # noqa: E402
from padpipe.pipes.pack import Packer  # noqa: E402
from padpipe.stats import PipelineStats  # noqa: E402

try:
    from benchmarks.pack_speed import make_chunks
except ModuleNotFoundError:  # run as a script from benchmarks/
    from pack_speed import make_chunks  # type: ignore[no-redef]


def models(hidden: int, layers: int, vocab: int) -> dict[str, Callable[[], Any]]:
    heads = max(2, hidden // 64)
    common = dict(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, intermediate_size=2 * hidden)
    attention = dict(num_attention_heads=heads, num_key_value_heads=2, head_dim=64)
    linear = dict(linear_num_key_heads=heads, linear_num_value_heads=heads, linear_key_head_dim=64,
                  linear_value_head_dim=64)  # fmt: skip
    kinds = ["linear_attention"] * (layers - 1) + ["full_attention"]
    return {
        "Qwen3.5-shaped (varlen: probed)": lambda: transformers.Qwen3_5ForCausalLM(
            transformers.Qwen3_5TextConfig(**common, **attention, **linear, layer_types=kinds)
        ),
        "Mamba (recurrent)": lambda: transformers.MambaForCausalLM(transformers.MambaConfig(**common, state_size=16)),
        "Llama (attention)": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(**common, **attention)),
    }


def step_batch(batch_size: int, seq_len: int, vocab: int) -> dict[str, torch.Tensor]:
    """A bucketed batch of one document a row, right padding: ``batch_size`` rows of up to ``seq_len`` tokens."""
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(5, vocab, (batch_size, seq_len), generator=generator)
    lengths = torch.linspace(seq_len * 3 // 4, seq_len, batch_size).long()
    mask = (torch.arange(seq_len)[None] < lengths[:, None]).long()
    return {"input_ids": ids * mask, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


def timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def train_step(model: Any, optimizer: Any, batch: dict[str, torch.Tensor]) -> None:
    model.train()
    model(**batch, use_cache=False).loss.backward()
    optimizer.step()
    optimizer.zero_grad()


def probe_cost(args: argparse.Namespace) -> None:
    batch = step_batch(args.batch_size, args.seq_len, args.vocab)
    print("| model | parameters | kind (layout on this CPU) | model_kind s | training step s | model_kind / step |")
    print("|---|---|---|---|---|---|")
    for name, make in models(args.hidden, args.layers, args.vocab).items():
        torch.manual_seed(0)
        model = make()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

        kind = pp.model_kind(model)
        step = functools.partial(train_step, model, optimizer, batch)
        if kind.kind != "recurrent":  # Mamba's torch scan on the CPU: minutes a step, and no probe to weigh
            step()  # warm-up (the optimizer's state, first-call costs)
        probes, steps = [], []
        for _ in range(args.repeat):
            probes.append(timed(functools.partial(pp.model_kind, model)))
            if kind.kind != "recurrent":
                steps.append(timed(step))
        probe = statistics.median(probes)
        train = f"{statistics.median(steps):.2f} | {probe / statistics.median(steps):.3f}" if steps else "- | -"
        size = sum(p.numel() for p in model.parameters()) / 1e6
        print(f"| {name} | {size:.1f}M | {kind.kind} ({kind.layout}) | {probe:.3f} | {train} |")


def fill(args: argparse.Namespace) -> None:
    chats = pp.read_jsonl(pp.examples.CHATS_JSONL)
    chunks = make_chunks(args.docs)
    print(
        "| data | seq_len x batch_size | rows: real tokens / slots | flat: real tokens / slots | batches rows / flat |"
    )
    print("|---|---|---|---|---|")
    for name in ("shipped chats (1,000)", f"long documents ({args.docs:,}, lognormal, split)"):
        for seq_len in (args.seq_len, 2 * args.seq_len):
            found = []
            for layout in ("rows", "flat"):
                if name.startswith("shipped"):
                    pipe = chats.chat(pp.examples.chat_tokenizer(), max_length=seq_len)
                    loader = pipe.pack(seq_len, batch_size=8, layout=layout).loader()
                    batches = sum(1 for _ in loader)
                    snap = loader.stats()
                else:
                    stats = PipelineStats()
                    node = Packer(IterableWrapper(chunks), seq_len=seq_len, batch_size=8, long_docs="split", pad_id=0,
                                  layout=layout, stats=stats)  # fmt: skip
                    batches = sum(1 for _ in node)
                    snap = stats.snapshot()
                found.append((snap.padding_efficiency, batches))
            (rows, n_rows), (flat, n_flat) = found
            print(f"| {name} | {seq_len} x 8 | {rows:.2%} | {flat:.2%} | {n_rows} / {n_flat} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=32_000)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--docs", type=int, default=20_000, help="long documents for the fill comparison")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, {torch.get_num_threads()} threads\n")
    probe_cost(args)
    print()
    fill(args)


if __name__ == "__main__":
    main()
