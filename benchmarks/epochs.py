"""Epochs 1-3: padpipe without and with the token cache vs the usual Hugging Face stack, same documents.

padpipe: ``read_parquet -> shuffle(1000) -> tokenize(max_length=512) -> bucket(max_tokens=16384) -> pad``,
iterated with ``pipe.loader()`` (tokenizing in 2 threads); with ``tokenize(cache=...)`` the first epoch
fills a fresh cache and the later ones read it. The HF stack: ``load_dataset("parquet")`` +
``map(batched=True, num_proc=2)`` (its own cache: later epochs read the mapped table) +
``DataCollatorWithPadding`` + ``DataLoader(batch_size=32, shuffle=True, num_workers=2)``. Epoch 1 of
each includes its tokenizing. The documents are generated (``long_docs.py``: long-tail lengths,
BERT-sized WordPiece tokenizer trained on them) unless ``--data`` names Parquet files.

Usage:
    python benchmarks/epochs.py                     # 3,183 generated documents
    python benchmarks/epochs.py --data docs.parquet --field text --tokenizer tokenizer.json
    python benchmarks/epochs.py --docs 300 --words 300 --skip-hf      # a quick look
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")

import long_docs  # noqa: E402

import padpipe as pp  # noqa: E402


def padpipe_epochs(args: argparse.Namespace, tokenizer: Any, cache: str | None) -> list[dict[str, float]]:
    """Seconds and counts of each epoch of the padpipe pipeline (one loader, epoch after epoch)."""
    pipe = (
        pp.read_parquet(args.data, columns=[args.field])
        .shuffle(buffer_size=args.shuffle, seed=0)
        .tokenize(tokenizer, fields=args.field, max_length=args.max_length, cache=cache)
        .bucket(max_tokens=args.max_tokens)
        .pad(pad_to_multiple_of=8)
    )
    loader = pipe.loader()
    out = []
    for _ in range(args.epochs):
        before = loader.stats()
        start, first, rows = time.perf_counter(), None, 0
        for batch in loader:
            first = first if first is not None else time.perf_counter() - start
            rows += len(batch["input_ids"])
        after = loader.stats()
        out.append(
            {
                "seconds": time.perf_counter() - start,
                "first": first or 0.0,
                "rows": rows,
                "efficiency": (after.real_tokens - before.real_tokens)
                / max(1, after.padded_tokens - before.padded_tokens),
                "hits": after.counters.get("cache.hit_rows", 0) - before.counters.get("cache.hit_rows", 0),
            }
        )
    return out


def hf_epochs(args: argparse.Namespace, tokenizer_file: str, workdir: str) -> list[dict[str, float]]:
    """Seconds of each epoch of the HF stack; epoch 1 includes load_dataset + map (fresh cache)."""
    import datasets
    import torch
    from torch.utils.data import DataLoader
    from transformers import DataCollatorWithPadding

    tok = long_docs.hf_tokenizer(tokenizer_file, args.max_length)
    collator = DataCollatorWithPadding(tok, pad_to_multiple_of=8)
    out = []
    start = time.perf_counter()
    ds = datasets.load_dataset("parquet", data_files=args.data, split="train", cache_dir=os.path.join(workdir, "hf"))
    ds = ds.map(
        lambda b: tok(b[args.field], truncation=True, max_length=args.max_length),
        batched=True,
        num_proc=2,
        remove_columns=ds.column_names,
    )
    for epoch in range(args.epochs):
        loader = DataLoader(
            ds,
            batch_size=32,
            shuffle=True,
            num_workers=2,
            collate_fn=collator,
            generator=torch.Generator().manual_seed(epoch),
        )
        if epoch:
            start = time.perf_counter()
        rows = real = padded = 0
        for batch in loader:
            rows += len(batch["input_ids"])
            real += int(batch["attention_mask"].sum())
            padded += batch["input_ids"].numel()
        out.append({"seconds": time.perf_counter() - start, "rows": rows, "efficiency": real / max(1, padded)})
    return out


def table(results: dict[str, list[dict[str, float]]]) -> str:
    """The results as a Markdown table: seconds per epoch and over all of them."""
    epochs = len(next(iter(results.values())))
    head = "| | " + " | ".join(f"epoch {e + 1}" for e in range(epochs)) + f" | {epochs} epochs | padding eff. |"
    lines = [head, "|---" * (epochs + 3) + "|"]
    for name, runs in results.items():
        cells = " | ".join(f"{r['seconds']:.2f} s" for r in runs)
        lines.append(f"| {name} | {cells} | {sum(r['seconds'] for r in runs):.2f} s | {runs[0]['efficiency']:.3f} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> dict[str, list[dict[str, float]]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", help="Parquet file(s) or glob (default: generate documents)")
    parser.add_argument("--field", default="text")
    parser.add_argument("--tokenizer", help="tokenizer.json or folder (default: a BERT-sized WordPiece trained here)")
    parser.add_argument("--docs", type=int, default=3183, help="generated documents")
    parser.add_argument("--words", type=int, default=1200, help="median words per generated document")
    parser.add_argument("--max-length", type=int, default=512)
    parser.add_argument("--max-tokens", type=int, default=16_384)
    parser.add_argument("--shuffle", type=int, default=1000, help="shuffle buffer rows")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--workdir", help="where data, tokenizer and caches go (default: a temporary folder)")
    parser.add_argument("--skip-hf", action="store_true", help="leave out the HF stack")
    args = parser.parse_args(argv)
    workdir = args.workdir or tempfile.mkdtemp(prefix="padpipe-epochs-")
    os.makedirs(workdir, exist_ok=True)
    texts = None
    if args.data is None:
        texts = long_docs.documents(args.docs, args.words)
        args.data = long_docs.write_parquet(os.path.join(workdir, "docs.parquet"), texts)
    tokenizer_file = args.tokenizer
    if tokenizer_file is None:
        if texts is None:
            texts = pp.read_parquet(args.data, columns=[args.field]).loader()
            texts = [t for b in texts for t in b.column(args.field).to_pylist()]
        tokenizer_file = long_docs.bert_sized_tokenizer(workdir, texts[:600])
    tokenizer = (
        long_docs.hf_tokenizer(tokenizer_file, args.max_length) if tokenizer_file.endswith(".json") else tokenizer_file
    )
    print(
        f"data: {args.data} ({args.docs if texts is not None else '?'} documents), tokenizer: {tokenizer_file}, "
        f"max_length={args.max_length}, max_tokens={args.max_tokens}, shuffle={args.shuffle}, cores={os.cpu_count()}\n"
    )
    pp.cache.clear(os.path.join(workdir, "token-cache"))  # a fresh cache: epoch 1 fills it
    results = {
        "padpipe": padpipe_epochs(args, tokenizer, None),
        "padpipe + token cache": padpipe_epochs(args, tokenizer, os.path.join(workdir, "token-cache")),
    }
    if not args.skip_hf:
        results["HF map(num_proc=2) + DataCollatorWithPadding + DataLoader(2)"] = hf_epochs(
            args, tokenizer_file, workdir
        )
    print(table(results))
    cached = results["padpipe + token cache"]
    print(
        f"\nwith the cache: epoch 2 is {cached[0]['seconds'] / cached[1]['seconds']:.1f}x faster than epoch 1"
        if len(cached) > 1
        else ""
    )
    if not args.skip_hf:
        hf = results["HF map(num_proc=2) + DataCollatorWithPadding + DataLoader(2)"]
        total = sum(r["seconds"] for r in cached) / sum(r["seconds"] for r in hf)
        print(f"{len(cached)} epochs, padpipe + cache / HF stack: {total:.2f}x the time")
    print(f"cache: {pp.cache.info(os.path.join(workdir, 'token-cache'))}".splitlines()[0])
    return results


if __name__ == "__main__":
    main()
