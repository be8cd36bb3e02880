"""Throughput against the yardstick: the raw Rust tokenizer, padpipe, and the usual HF stack.

One run, same data, same tokenizer, same machine threads:

1. raw ``Tokenizer.encode_batch`` (and ``encode_batch_fast``) over the texts in 1,024-row chunks:
   the limit any pipeline can reach;
2. padpipe end to end from the Parquet file: read, tokenize, bucket by token budget, pad;
3. the stack users run today: ``datasets.map(batched=True, num_proc=2)`` +
   ``DataCollatorWithPadding`` + ``DataLoader(num_workers=2)``, end to end from raw text;
4. padding alone: ``DataCollatorWithPadding`` vs padpipe's vectorized pad on the same rows;
5. padding efficiency of each batching strategy.

Usage:
    python benchmarks/throughput.py [--rows 100000] [--chart benchmarks/out/throughput.png]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torchdata.nodes import BaseNode

import padpipe as pp
from padpipe._optional import require
from padpipe.tokenizer import TextEncoder

FIELDS = ("sentence1", "sentence2")


def make_corpus(rows: int, directory: str) -> str:
    """Repeat the shipped sample to ``rows`` rows in a Parquet file with 2,048-row groups."""
    table = pq.read_table(pp.examples.SAMPLE_PARQUET)
    reps = -(-rows // table.num_rows)
    big = pa.concat_tables([table] * reps).slice(0, rows)
    big = big.set_column(big.schema.get_field_index("idx"), "idx", pa.array(np.arange(rows)))
    path = os.path.join(directory, "corpus.parquet")
    pq.write_table(big, path, row_group_size=2048)
    return path


def timed(fn: Callable[[], int]) -> tuple[float, int]:
    """Seconds and the token count ``fn`` returns."""
    start = time.perf_counter()
    tokens = fn()
    return time.perf_counter() - start, tokens


def raw_tokenizer(path: str, max_length: int | None, fast: bool) -> Callable[[], int]:
    """Encode every pair with the Rust batch call, 1,024 rows at a time (texts already in memory).

    With ``max_length`` the tokenizer truncates as ``transformers`` configures it
    (``longest_first``); with ``None`` it encodes whole pairs, which avoids the Rust pair
    truncation's overflow work and is the tokenizer model's own rate.
    """
    tok = pp.examples.tokenizer()
    tok.no_padding()
    if max_length is None:
        tok.no_truncation()
    else:
        tok.enable_truncation(max_length)
    table = pq.read_table(path, columns=list(FIELDS))
    chunks = [
        list(
            zip(table.column(FIELDS[0]).slice(i, 1024).to_pylist(), table.column(FIELDS[1]).slice(i, 1024).to_pylist())
        )
        for i in range(0, table.num_rows, 1024)
    ]
    call = tok.encode_batch_fast if fast else tok.encode_batch

    def run() -> int:
        return sum(len(e.ids) for chunk in chunks for e in call(chunk))

    return run


def padpipe_run(pipe: pp.Pipeline) -> Callable[[], int]:
    """One epoch of a padpipe pipeline; returns the real tokens it produced."""

    def run() -> int:
        loader = pipe.loader()
        for _ in loader:
            pass
        return loader.stats().real_tokens

    return run


def hf_stack_run(path: str, max_length: int, batch_size: int, workers: int) -> Callable[[], int]:
    """``datasets.map`` + ``DataCollatorWithPadding`` + ``DataLoader``, from raw text, uncached."""
    from torch.utils.data import DataLoader

    datasets = require("datasets", "the HF-stack comparison")
    DataCollatorWithPadding = require("transformers", "the HF-stack comparison").DataCollatorWithPadding

    tok = pp.examples.hf_tokenizer()
    datasets.disable_progress_bars()

    def run() -> int:
        with tempfile.TemporaryDirectory() as cache:
            ds = datasets.Dataset.from_parquet(path, cache_dir=cache)
            ds = ds.map(
                lambda b: tok(b[FIELDS[0]], b[FIELDS[1]], truncation=True, max_length=max_length),
                batched=True,
                num_proc=workers,
                remove_columns=list(FIELDS) + ["idx"],
            )
            loader = DataLoader(
                ds, batch_size=batch_size, shuffle=True, collate_fn=DataCollatorWithPadding(tok), num_workers=workers
            )
            return sum(int(b["attention_mask"].sum()) for b in loader)

    return run


def collator_vs_pad(path: str, max_length: int, batch_size: int) -> tuple[float, float]:
    """Seconds to pad the same 200 batches with ``DataCollatorWithPadding`` and with padpipe."""
    DataCollatorWithPadding = require("transformers", "the collator comparison").DataCollatorWithPadding

    from padpipe.pipes.pad import Padder

    tok = pp.examples.hf_tokenizer()
    rows = pq.read_table(path, columns=list(FIELDS)).slice(0, batch_size * 200)
    enc = tok(
        rows.column(FIELDS[0]).to_pylist(), rows.column(FIELDS[1]).to_pylist(), truncation=True, max_length=max_length
    )
    features = [{k: enc[k][i] for k in enc} for i in range(rows.num_rows)]
    batches = [features[i : i + batch_size] for i in range(0, len(features), batch_size)]
    collate = DataCollatorWithPadding(tok)
    start = time.perf_counter()
    for b in batches:
        collate(b)
    hf_s = time.perf_counter() - start
    chunk = TextEncoder.load(tok, max_length=max_length, truncation=True, add_special_tokens=True).encode(
        rows.column(FIELDS[0]).to_pylist(), rows.column(FIELDS[1]).to_pylist()
    )
    pieces = [
        chunk.take(np.arange(i, min(i + batch_size, chunk.num_rows))) for i in range(0, chunk.num_rows, batch_size)
    ]
    padder = Padder(
        _ListNode(pieces),
        pad_id=0,
        side="right",
        pad_to_multiple_of=None,
        pad_to_length=None,
        label_pad_id=-100,
        dtype=torch.int64,
        stats=pp.PipelineStats(),
    )
    start = time.perf_counter()
    for _ in padder:
        pass
    return hf_s, time.perf_counter() - start


class _ListNode(BaseNode):
    """A node over a prepared list (benchmark input for the pad stage alone)."""

    def __init__(self, items: list) -> None:
        super().__init__()
        self.items = items

    def reset(self, initial_state: dict | None = None) -> None:
        super().reset(initial_state)
        self._i = 0

    def next(self):
        if self._i >= len(self.items):
            raise StopIteration
        self._i += 1
        return self.items[self._i - 1]

    def get_state(self) -> dict:
        return {"i": self._i}


def main() -> None:
    """Run every measurement and print the tables (and a chart with ``--chart``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=8192)
    parser.add_argument("--workers", type=int, default=2, help="processes for the HF stack")
    parser.add_argument("--skip-hf", action="store_true", help="skip the datasets/transformers stack")
    parser.add_argument("--chart", help="write a PNG bar chart here")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        path = make_corpus(args.rows, tmp)
        tok = pp.examples.tokenizer()
        base = pp.read_parquet(path).tokenize(tok, fields=FIELDS, max_length=args.max_length)
        runs: dict[str, Callable[[], int]] = {
            "raw encode_batch (the limit)": raw_tokenizer(path, args.max_length, fast=False),
            "raw encode_batch_fast": raw_tokenizer(path, args.max_length, fast=True),
            "raw encode_batch_fast, untruncated": raw_tokenizer(path, None, fast=True),
            "padpipe token budget": padpipe_run(base.bucket(max_tokens=args.max_tokens).pad(pad_to_multiple_of=8)),
            "padpipe bucketed batch_size": padpipe_run(base.bucket(args.batch_size).pad(pad_to_multiple_of=8)),
        }
        if not args.skip_hf:
            runs["HF map+collator+DataLoader"] = hf_stack_run(path, args.max_length, args.batch_size, args.workers)
        timings = {name: timed(run) for name, run in runs.items()}
        limit_s, limit_tokens = timings["raw encode_batch (the limit)"]
        limit = limit_tokens / limit_s
        print(f"\n{args.rows:,} sentence pairs, max_length={args.max_length}, cores={os.cpu_count()}")
        print("'vs raw': tokens/s over raw encode_batch's; 'time vs raw': raw encode_batch seconds over")
        print("this path's, for the same pairs (differs from 'vs raw' only where tokens are not truncated)\n")
        print(f"{'path':<36} {'seconds':>8} {'tokens/s':>12} {'vs raw':>7} {'time vs raw':>11}")
        speeds = {}
        for name, (secs, tokens) in timings.items():
            speeds[name] = limit_s / secs
            print(
                f"{name:<36} {secs:>8.2f} {tokens / secs:>12,.0f} {tokens / secs / limit:>7.2f} {limit_s / secs:>11.2f}"
            )

        hf_pad, pp_pad = collator_vs_pad(path, args.max_length, args.batch_size)
        print(
            f"\npadding 200 batches of {args.batch_size}: DataCollatorWithPadding {hf_pad * 1000:.1f} ms, "
            f"padpipe pad {pp_pad * 1000:.1f} ms ({hf_pad / pp_pad:.0f}x)"
        )

        print(f"\n{'strategy':<34} {'padding efficiency':>18}")
        from padpipe.demo import strategies

        for name, pipe in strategies(
            base, max_length=args.max_length, batch_size=args.batch_size, max_tokens=args.max_tokens
        ).items():
            loader = pipe.loader()
            for _ in loader:
                pass
            print(f"{name:<34} {loader.stats().padding_efficiency:>18.1%}")
        if args.chart:
            write_chart(speeds, args.chart)


def write_chart(speeds: dict[str, float], path: str) -> None:
    """Bar chart of each path's speed on the same pairs relative to raw ``encode_batch``."""
    matplotlib = require("matplotlib", "--chart")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(8, 3.5))
    names = list(speeds)
    ax.barh(names, [speeds[n] for n in names], color="#4c72b0")
    ax.axvline(0.9, color="grey", linestyle="--", linewidth=1)
    ax.set_xlabel("speed on the same pairs, relative to raw encode_batch (higher is faster)")
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"chart: {path}")


if __name__ == "__main__":
    main()
