"""Size of a loader state with the default buffers, and the cost of saving it.

A state holds the rows its buffers hold (so resume is exact), and little else: positions,
settings, generator states and checksums take a few kilobytes. This prints, for each buffering
stage at its default size and for a pipeline without buffers, the rows buffered mid-epoch, the
bytes of ``torch.save(state)``, the time of ``state_dict()`` and of ``torch.save``, and checks the
state loads with ``torch.load(..., weights_only=True)``.

Rows are synthetic token rows (random ids; the stages never look at the values), so the sizes are
exact for the given lengths: 4 bytes per token id plus 8 per row offset.

Usage:
    python benchmarks/state_size.py [--row-tokens 512] [--seq-len 2048]
"""

from __future__ import annotations

import argparse
import io
import time
from typing import Any

import numpy as np
import pyarrow as pa
import torch
from torchdata.nodes import IterableWrapper

import padpipe as pp
from padpipe.chunks import TokenChunk
from padpipe.pipes.bucket import Bucketizer
from padpipe.pipes.pack import Packer
from padpipe.pipes.shuffle import ShuffleBuffer


def token_chunks(rows: int, tokens: int, chunk_rows: int = 1024) -> list[TokenChunk]:
    rng = np.random.default_rng(0)
    out = []
    for start in range(0, rows, chunk_rows):
        n = min(chunk_rows, rows - start)
        ids = rng.integers(5, 30_000, size=n * tokens, dtype=np.int32)
        out.append(TokenChunk(ids, np.arange(n + 1, dtype=np.int64) * tokens))
    return out


def text_batches(rows: int, chars: int, chunk_rows: int = 1024) -> list[pa.RecordBatch]:
    text = "x" * chars
    return [
        pa.record_batch(
            {"text": [text] * min(chunk_rows, rows - s), "id": list(range(s, s + min(chunk_rows, rows - s)))}
        )
        for s in range(0, rows, chunk_rows)
    ]


def measure(name: str, node: Any, steps: int, buffered: str) -> None:
    node.reset(None)
    for _ in range(steps):
        next(node)
    start = time.perf_counter()
    state = node.state_dict()
    take = time.perf_counter() - start
    buffer = io.BytesIO()
    start = time.perf_counter()
    torch.save(state, buffer)
    save = time.perf_counter() - start
    buffer.seek(0)
    torch.load(buffer, weights_only=True)
    size = buffer.getbuffer().nbytes
    shown = f"{size / 1e6:.2f} MB" if size >= 100_000 else f"{size / 1e3:.1f} kB"
    print(f"{name:<46} {buffered:>22} {shown:>10} {take * 1e3:>9.1f} ms {save * 1e3:>9.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--row-tokens", type=int, default=512, help="tokens per row in the bucket buffer")
    parser.add_argument("--seq-len", type=int, default=2048, help="packed row length")
    args = parser.parse_args()
    print(
        f"{'stage (default buffer)':<46} {'buffered mid-epoch':>22} {'state':>10} {'state_dict':>12} {'torch.save':>12}"
    )
    bucket = Bucketizer(IterableWrapper(token_chunks(30_000, args.row_tokens)), batch_size=32)
    measure(
        f"bucket(32), buffer_size=10,000, {args.row_tokens}-token rows", bucket, 1, f"~10,000 rows x {args.row_tokens}"
    )
    shuffle = ShuffleBuffer(IterableWrapper(text_batches(30_000, 500)), buffer_size=10_000)
    measure("shuffle(), buffer_size=10,000, 500-char texts", shuffle, 1, "10,000 rows + 1 chunk")
    pack = Packer(IterableWrapper(token_chunks(5_000, args.seq_len // 3)), seq_len=args.seq_len, batch_size=8, pad_id=0)
    measure(f"pack({args.seq_len}, batch_size=8), buffer_size=256", pack, 2, f"256 pieces x {args.seq_len // 3}")
    plain = pp.read_parquet(pp.examples.SAMPLE_PARQUET).tokenize(pp.examples.tokenizer(), fields="sentence1").build()
    measure("read_parquet -> tokenize (no buffer)", plain, 3, "none")


if __name__ == "__main__":
    main()
