"""Time to first batch, padding efficiency and state size per shuffle and bucket buffer size, with and without eager
buckets.

The pipeline of ``epochs.py`` (``read_parquet -> shuffle -> tokenize(max_length=512) ->
bucket(max_tokens=16384) -> pad``) on the same generated long-tail documents. For each setting:
seconds from ``iter(loader)`` to the first batch (tokenizing from scratch), the epoch's padding
efficiency, the pickled size of a state taken halfway through the epoch without a cache and with
a full token cache (whose buffered rows are saved as references), and the seconds from
``load_state_dict`` of that cached state to the next batch.

Usage:
    python benchmarks/first_batch.py
    python benchmarks/first_batch.py --docs 300 --words 300 --buffers 64:64 256:1000    # quick
"""

from __future__ import annotations

import argparse
import os
import pickle
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")

import long_docs  # noqa: E402

import padpipe as pp  # noqa: E402

SETTINGS = ["1000:256", "1000:1000", "1000:10000", "10000:10000"]  # shuffle buffer : bucket buffer


def pipeline(
    args: argparse.Namespace, tokenizer: Any, shuffle: int, bucket: int, eager: bool, cache: str | None
) -> pp.Pipeline:
    return (
        pp.read_parquet(args.data, columns=[args.field])
        .shuffle(buffer_size=shuffle, seed=0)
        .tokenize(tokenizer, fields=args.field, max_length=args.max_length, cache=cache)
        .bucket(max_tokens=args.max_tokens, buffer_size=bucket, eager=eager)
        .pad(pad_to_multiple_of=8)
    )


def measure(
    args: argparse.Namespace, tokenizer: Any, shuffle: int, bucket: int, eager: bool, cache: str
) -> dict[str, float]:
    """One setting: first batch (no cache), efficiency, halfway state sizes, resume time (cache)."""
    loader = pipeline(args, tokenizer, shuffle, bucket, eager, None).loader()
    start = time.perf_counter()
    it = iter(loader)
    next(it)
    first = time.perf_counter() - start
    batches = 1 + sum(1 for _ in it)
    efficiency = loader.stats().padding_efficiency
    plain = _halfway(pipeline(args, tokenizer, shuffle, bucket, eager, None).loader(), batches)
    cached_loader = pipeline(args, tokenizer, shuffle, bucket, eager, cache).loader()
    cached = _halfway(cached_loader, batches)
    fresh = pipeline(args, tokenizer, shuffle, bucket, eager, cache).loader()
    start = time.perf_counter()
    fresh.load_state_dict(pickle.loads(cached))
    next(iter(fresh))
    return {
        "first": first,
        "efficiency": efficiency,
        "plain": len(plain),
        "cached": len(cached),
        "resume": time.perf_counter() - start,
        "hits": cached_loader.stats().counters.get("cache.hit_rows", 0),
    }


def _halfway(loader: Any, batches: int) -> bytes:
    for i, _ in enumerate(loader):
        if i + 1 == batches // 2:
            return pickle.dumps(loader.state_dict())
    return pickle.dumps(loader.state_dict())


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", help="Parquet file(s) (default: generate documents as epochs.py does)")
    parser.add_argument("--field", default="text")
    parser.add_argument("--tokenizer", help="tokenizer.json (default: the BERT-sized WordPiece of long_docs.py)")
    parser.add_argument("--docs", type=int, default=3183)
    parser.add_argument("--words", type=int, default=1200)
    parser.add_argument("--max-length", type=int, default=512)
    parser.add_argument("--max-tokens", type=int, default=16_384)
    parser.add_argument("--buffers", nargs="+", default=SETTINGS, help="shuffle:bucket buffer sizes")
    parser.add_argument("--workdir")
    args = parser.parse_args(argv)
    workdir = args.workdir or tempfile.mkdtemp(prefix="padpipe-first-batch-")
    os.makedirs(workdir, exist_ok=True)
    texts = None
    if args.data is None:
        texts = long_docs.documents(args.docs, args.words)
        args.data = long_docs.write_parquet(os.path.join(workdir, "docs.parquet"), texts)
    path = args.tokenizer or long_docs.bert_sized_tokenizer(workdir, (texts or [])[:600])
    tokenizer = long_docs.hf_tokenizer(path, args.max_length)
    cache = os.path.join(workdir, "token-cache")
    pp.cache.clear(cache)
    for _ in pipeline(
        args, tokenizer, 1000, 1000, True, cache
    ).loader():  # fill the cache once: it serves every setting
        pass
    print(
        f"data: {args.data}, tokenizer: {path}, max_length={args.max_length}, max_tokens={args.max_tokens}, "
        f"cores={os.cpu_count()}\n"
    )
    print(
        "| shuffle buffer | bucket buffer | eager | 1st batch | padding eff. | state, no cache | state, token cache | "
        "resume (cache) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    rows = []
    for setting in args.buffers:
        shuffle, bucket = (int(x) for x in setting.split(":"))
        for eager in (False, True):
            r = measure(args, tokenizer, shuffle, bucket, eager, cache)
            rows.append({"shuffle": shuffle, "bucket": bucket, "eager": eager, **r})
            print(
                f"| {shuffle:,} | {bucket:,} | {'yes' if eager else 'no'} | {r['first']:.2f} s | "
                f"{r['efficiency']:.3f} | "
                f"{r['plain'] / 1e6:.2f} MB | {r['cached'] / 1e6:.3f} MB | {r['resume']:.2f} s |",
                flush=True,
            )
    return rows


if __name__ == "__main__":
    main()
