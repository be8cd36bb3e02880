"""Pair truncation on long documents: the Rust tokenizer's own vs padpipe's (same ids, checked).

The Rust tokenizer's ``longest_first`` pair truncation also builds every overflow window of both
texts and their combinations, which explodes on long pairs with a short ``max_length``; padpipe
encodes whole pairs and cuts them with numpy (``padpipe/tokenizer/truncate.py``).

Usage:
    python benchmarks/pair_truncation.py [--pairs 50] [--max-lengths 32 128 512]
"""

from __future__ import annotations

import argparse
import gzip
import json
import time

import padpipe as pp
from padpipe.tokenizer import TextEncoder


def main() -> None:
    """Time both on the longest documents of the shipped corpus, paired up, and check the ids."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=50, help="pairs of long documents (memory grows fast)")
    parser.add_argument("--max-lengths", type=int, nargs="+", default=[32, 128, 512])
    args = parser.parse_args()
    with gzip.open(pp.examples.SAMPLE_JSONL, "rt") as f:
        docs = sorted((json.loads(line)["text"] for line in f), key=len)[-20 * args.pairs :: 10]
    firsts, seconds = docs[::2], docs[1::2]
    print(f"{len(firsts)} pairs of the corpus's longest documents\n")
    print(f"{'max_length':>10} {'rust (s)':>9} {'padpipe (s)':>11} {'speed-up':>8} {'same ids':>8}")
    for max_length in args.max_lengths:
        rust = pp.examples.tokenizer()
        rust.no_padding()
        rust.enable_truncation(max_length)
        start = time.perf_counter()
        expected = rust.encode_batch(list(zip(firsts, seconds)))
        rust_s = time.perf_counter() - start
        encoder = TextEncoder.load(
            pp.examples.tokenizer(), max_length=max_length, truncation=True, add_special_tokens=True
        )
        start = time.perf_counter()
        chunk = encoder.encode(firsts, seconds)
        ours_s = time.perf_counter() - start
        same = all(chunk.row(i).tolist() == e.ids for i, e in enumerate(expected))
        print(f"{max_length:>10} {rust_s:>9.2f} {ours_s:>11.2f} {rust_s / ours_s:>7.0f}x {str(same):>8}")


if __name__ == "__main__":
    main()
