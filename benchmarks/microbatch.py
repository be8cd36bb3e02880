"""Forward and backward slots/s of ``trainer.py``'s tiny LM by micro-batch shape: does size or row length cost?

The LM arms of ``trainer.py`` differ in how a step's ~1,500 token slots are cut: one micro-batch
of three 504-token rows (``bucket(max_tokens=1,511)``), three of one row
(``padpipe_bucket_accum``), four of two 232-token rows (``batch_rebalance``). This times one
optimizer step (forward, backward over every micro-batch, AdamW) of the same seeded model on
random ids for each shape, interleaved over ``--rounds`` rounds (median), torch ``--threads``
threads, so the cost of micro-batch size and of row length can be told apart.

Usage:
    python benchmarks/microbatch.py [--threads 1] [--rounds 10] [--chart benchmarks/out/microbatch.png]
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Sequence

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import trainer_setup as setup  # noqa: E402

# (rows, row length, micro-batches a step): about 1,500-1,850 slots a step each
SHAPES = ((3, 504, 1), (1, 504, 3), (8, 200, 1), (2, 232, 4), (1, 464, 4), (4, 116, 4), (4, 96, 4))


def step_seconds(net: torch.nn.Module, opt: torch.optim.Optimizer, shape: tuple[int, int, int]) -> float:
    """Seconds of one optimizer step over ``micro`` micro-batches of ``rows x length`` random ids."""
    rows, length, micro = shape
    ids = torch.randint(5, 1000, (rows, length))
    start = time.perf_counter()
    for _ in range(micro):
        net(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    opt.zero_grad()
    return time.perf_counter() - start


def measure(threads: int, rounds: int) -> list[tuple[tuple[int, int, int], float]]:
    """Median slots/s of each shape over ``rounds`` interleaved rounds (after one warm-up round).

    Example:
        >>> [shape for shape, _ in measure(1, 1)][:1]
        [(3, 504, 1)]
    """
    torch.set_num_threads(threads)
    tok = setup.tokenizer("lm")
    net = setup.model("lm", len(tok), seed=0)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    times: dict[tuple[int, int, int], list[float]] = {shape: [] for shape in SHAPES}
    for _ in range(rounds + 1):
        for shape in SHAPES:
            times[shape].append(step_seconds(net, opt, shape))
    return [(s, s[0] * s[1] * s[2] / float(np.median(t[1:] or t))) for s, t in times.items()]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: a rank of trainer.py --ranks 2)")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--chart", help="write a PNG bar chart here")
    args = parser.parse_args(argv)
    results = measure(args.threads, args.rounds)
    print(f"torch threads={args.threads}, median of {args.rounds} interleaved rounds\n")
    print("| micro-batch (rows x length) | micro-batches a step | slots a micro-batch | slots/s |")
    print("|---|---|---|---|")
    for (rows, length, micro), rate in results:
        print(f"| {rows} x {length} | {micro} | {rows * length:,} | {rate:,.0f} |")
    if args.chart:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 3.2))
        ax.barh([f"{r} x {n} ({m} a step)" for (r, n, m), _ in results], [rate for _, rate in results])
        ax.set_xlabel("forward + backward slots/s")
        ax.invert_yaxis()
        fig.tight_layout()
        os.makedirs(os.path.dirname(os.path.abspath(args.chart)), exist_ok=True)
        fig.savefig(args.chart, dpi=110)
        print(f"chart: {args.chart}")


if __name__ == "__main__":
    main()
