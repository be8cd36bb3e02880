"""Speed and fill of the packer alone, on prepared token chunks (no reading or tokenizing).

Documents: lognormal lengths (median 300, sigma 1.0, clipped to [2, 10000]) with random ids, in
chunks of 1,024 rows, packed into ``seq_len`` rows; prints docs/s, tokens/s and padding efficiency
for each setting, and the cost of one ``state_dict()`` mid-epoch (median of 5).

Usage:
    python benchmarks/pack_speed.py [--docs 50000] [--seq-len 2048] [--batch-size 8]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from torchdata.nodes import IterableWrapper

from padpipe.chunks import TokenChunk
from padpipe.pipes.pack import Packer
from padpipe.stats import PipelineStats


def make_chunks(num_docs: int, chunk_rows: int = 1024) -> list[TokenChunk]:
    rng = np.random.default_rng(0)
    lengths = np.clip(np.round(rng.lognormal(np.log(300), 1.0, num_docs)), 2, 10_000).astype(np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    ids = rng.integers(5, 30_000, size=int(offsets[-1]), dtype=np.int32)
    bounds = [offsets[i : i + chunk_rows + 1] for i in range(0, num_docs, chunk_rows)]
    return [TokenChunk(ids[o[0] : o[-1]], o - o[0]) for o in bounds]


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=50_000)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--batch-size", type=int, default=8)
    args = parser.parse_args()
    chunks = make_chunks(args.docs)
    tokens = sum(c.num_tokens for c in chunks)
    print(f"{args.docs} docs, {tokens} tokens, seq_len {args.seq_len}, batch_size {args.batch_size}")
    for buffer_size, block_mask in ((64, False), (256, False), (1024, False), (256, True)):
        stats = PipelineStats()
        node = Packer(
            IterableWrapper(chunks),
            seq_len=args.seq_len,
            batch_size=args.batch_size,
            buffer_size=buffer_size,
            block_mask=block_mask,
            pad_id=0,
            stats=stats,
        )
        start = time.perf_counter()
        for i, _ in enumerate(node):
            if i == 50:  # median of 5 calls: a lone call may absorb one of Python's full GC passes
                t = time.perf_counter()
                state_ms = float(np.median([_timed(node.state_dict) for _ in range(5)])) * 1e3
                start += time.perf_counter() - t
        seconds = time.perf_counter() - start
        snap = stats.snapshot()
        print(
            f"buffer {buffer_size:5d} block_mask {block_mask!s:5}: {args.docs / seconds:10,.0f} docs/s "
            f"{tokens / seconds:13,.0f} tokens/s  efficiency {snap.padding_efficiency:.4f}  "
            f"state_dict {state_ms:.2f} ms"
        )


if __name__ == "__main__":
    main()
