"""Chat SFT epochs with and without the chat cache (``.chat(..., cache=DIR)``, ``sft(..., cache=DIR)``).

On ``--conversations`` conversations written to a JSON Lines file, for each template: the ``sft`` recipe
(``read_jsonl -> shuffle -> chat(max_length=seq_len) -> pack(seq_len)``) read for ``--epochs`` epochs
without a cache, then with a fresh cache (epoch 1 renders, tokenizes and fills it; later epochs read it),
then one epoch of a new loader on the filled cache (a later run). Every epoch's batches are digested
and checked equal to the uncached ones, and so are the ``chat.*`` counters. Templates:

- ``chatml``: the shipped chat tokenizer (ChatML with ``{% generation %}`` markers) on
  ``pp.examples.conversations`` (the shipped sentences; 1-4 exchanges, a system message in 3 of 10);
- ``qwen3``: TRL's Qwen3 template (prefix rendering, reasoning rows) on the test suite's Qwen3
  conversations (reasoning in half the answers, a tool call and its result in a third), with a
  tokenizer made of the shipped BPE and Qwen's control tokens (needs ``trl`` for the template text);
- ``qwen3-151k``: the same with Qwen's real 151,669-id tokenizer (``qwen.tiktoken`` from the ``dashscope``
  package, as ``make setup`` installs it; ``tests/tokenizer_fixtures.py``, ``qwen()``), where serializing and
  parsing the tokenizer costs about 0.3 s and 1 s: the first epoch of each loader includes building it.

Usage:
    python benchmarks/sft_cache.py                                  # 10,000 conversations, chatml and qwen3
    python benchmarks/sft_cache.py --conversations 500 --templates chatml   # a quick look
    python benchmarks/sft_cache.py --conversations 50 --templates qwen3-151k  # small data, a big vocabulary
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("PADPIPE_PROGRESS", "0")

import padpipe as pp  # noqa: E402
from padpipe.recipes.sft import sft  # noqa: E402

TEMPLATES = ("chatml", "qwen3", "qwen3-151k")


def data(template: str, n: int, folder: str) -> tuple[str, Any]:
    """A JSON Lines file of ``n`` conversations for ``template``, and its tokenizer."""
    if template == "chatml":
        rows, tok = pp.examples.conversations(n, seed=0), pp.examples.chat_tokenizer()
    else:
        from tests import tokenizer_fixtures as tf
        from tests.chat import real_templates as rt

        rows = [{"messages": c, "id": i} for i, c in enumerate(rt.conversations("qwen3", n, seed=0))]
        tok = rt.tokenizer("qwen3") if template == "qwen3" else tf.qwen(rt.template_text("trl:qwen3"))
    path = os.path.join(folder, f"{template}.jsonl")
    with open(path, "w") as f:
        f.writelines(json.dumps(row) + "\n" for row in rows)
    return path, tok


def epoch(source: Any) -> tuple[Any, tuple[float, str, int, float]]:
    """The loader and, for one epoch of it, seconds, a digest of its batches, how many, and the CPU seconds the
    process spent (all its threads: less sensitive than wall time to other work on the machine). ``source`` is a
    loader, or a pipeline whose loader is built inside the timing (where a big vocabulary's cost is)."""
    digest, count = hashlib.sha1(), 0
    start, cpu = time.perf_counter(), time.process_time()
    loader = source.loader() if isinstance(source, pp.Pipeline) else source
    for batch in loader:
        digest.update(batch["input_ids"].numpy().tobytes())
        digest.update(batch["labels"].numpy().tobytes())
        count += 1
    return loader, (time.perf_counter() - start, digest.hexdigest(), count, time.process_time() - cpu)


def chat_counters(loader: Any) -> dict[str, int]:
    stats = loader.stats()
    return {**{k: v for k, v in stats.counters.items() if k.startswith("chat.")}, **stats.skipped}


def measure(template: str, args: argparse.Namespace, folder: str) -> dict[str, Any]:
    path, tok = data(template, args.conversations, folder)
    cache = os.path.join(folder, f"cache-{template}")

    def pipe(with_cache: bool) -> pp.Pipeline:
        return sft(path, tok, seq_len=args.seq_len, batch_size=args.batch_size, cache=cache if with_cache else None)

    def epochs(first: pp.Pipeline, n: int) -> tuple[Any, list[tuple[float, str, int, float]]]:
        loader, done = epoch(first)  # epoch 1 builds the loader
        return loader, [done] + [epoch(loader)[1] for _ in range(n - 1)]

    plain, uncached = epochs(pipe(False), args.epochs)
    cached_loader, cached = epochs(pipe(True), args.epochs)
    later_loader, (later,) = epochs(pipe(True), 1)
    same = [u[1] for u in uncached] == [c[1] for c in cached] and later[1] == uncached[0][1]
    same_counts = chat_counters(plain) == chat_counters(cached_loader)
    stats = later_loader.stats().counters
    return {
        "template": template,
        "uncached": [u[0] for u in uncached],
        "cpu uncached": sum(u[3] for u in uncached) / len(uncached),
        "cpu cached": (sum(c[3] for c in cached[1:]) + later[3]) / len(cached),
        "cached": [c[0] for c in cached],
        "later run": later[0],
        "batches": uncached[0][2],
        "same": same and same_counts and stats.get("cache.hit_rows") == args.conversations,
        "size": pp.cache.info(cache).bytes,
        "rows": chat_counters(plain).get("chat.rows", 0) // args.epochs,
    }


def table(results: Sequence[dict[str, Any]], epochs: int) -> str:
    head = ["template", "rows", "batches"]
    head += [f"uncached epoch {i + 1}" for i in range(epochs)]
    head += ["cache: epoch 1 (fills)"] + [f"cache: epoch {i + 1}" for i in range(1, epochs)]
    head += ["later run, epoch 1", "uncached / cached epoch", "CPU s: uncached / cached epoch"]
    head += ["same batches and counters", "cache size"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        served = sum(r["cached"][1:] + [r["later run"]]) / len(r["cached"])
        ratio = (sum(r["uncached"]) / len(r["uncached"])) / served
        cells = [r["template"], f"{r['rows']:,}", str(r["batches"])]
        cells += [f"{s:.2f} s" for s in r["uncached"]] + [f"{s:.2f} s" for s in r["cached"]]
        cpu = f"{r['cpu uncached']:.1f} / {r['cpu cached']:.2f} = {r['cpu uncached'] / r['cpu cached']:.0f}x"
        cells += [f"{r['later run']:.2f} s", f"{ratio:.0f}x", cpu, "yes" if r["same"] else "NO"]
        cells.append(f"{pp.cache.size_text(r['size'])}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--conversations", type=int, default=10_000)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=2, help="epochs of each loader (at least 2)")
    parser.add_argument("--templates", nargs="+", default=["chatml", "qwen3"], choices=TEMPLATES)
    args = parser.parse_args(argv)
    if args.epochs < 2:
        parser.error("--epochs must be at least 2 (epoch 1 fills the cache)")
    found = {name: importlib.util.find_spec(name) is not None for name in ("trl", "dashscope")}
    templates = [t for t in args.templates if t == "chatml" or (found["trl"] and (t == "qwen3" or found["dashscope"]))]
    if len(templates) < len(args.templates):
        print(f"left out (needs trl, and dashscope for qwen3-151k): {sorted(set(args.templates) - set(templates))}")
    with tempfile.TemporaryDirectory() as folder:
        results = [measure(t, args, folder) for t in templates]
    print(
        f"{args.conversations:,} conversations, sft(seq_len={args.seq_len}, batch_size={args.batch_size}), "
        f"{os.cpu_count()} CPUs (load average {os.getloadavg()[0]:.1f} at the end); each loader's epoch 1 includes "
        "building it; the ratios are the mean uncached epoch over the mean epoch read from the cache, in wall and in "
        "CPU seconds:"
    )
    print(table(results, args.epochs))
    return 0 if all(r["same"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
