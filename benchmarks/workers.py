"""What DataLoader worker processes cost: CPU seconds and wall time of one epoch per ``num_workers``.

The README's pipeline (``read_parquet -> shuffle(1000) -> tokenize(max_length=128) -> bucket -> pad``) over
the shipped sample, one epoch per setting, through ``pipe.loader(num_workers=N)`` for N = 0, 1, 2 and two token
budgets (1,024: small batches, many steps; 4,096). CPU is the main process's plus its workers' (reaped at the
epoch's end), counted from ``iter(loader)``: with N workers the stages run in them, and what they add over
N = 0 is the price of moving batches and states between processes. Each setting runs ``--repeat`` times; the
table shows the fastest.

Usage:
    python benchmarks/workers.py [--repeat 3] [--shuffle 10000] [--chart benchmarks/out/workers.png]
"""

from __future__ import annotations

import argparse
import os
import resource
import time
from collections.abc import Sequence

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # the workers' own threads only: CPU comparable per N

import padpipe as pp  # noqa: E402

WORKERS = (0, 1, 2)
BUDGETS = (1024, 4096)


def cpu_seconds() -> float:
    """CPU seconds of this process and its reaped children (user + system)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def one_epoch(workers: int, max_tokens: int, shuffle: int) -> dict[str, float]:
    """CPU seconds, wall seconds and batches of one epoch read with ``workers`` worker processes."""
    pipe = (
        pp.read_parquet(pp.examples.SAMPLE_PARQUET)
        .shuffle(buffer_size=shuffle, seed=0)
        .tokenize(pp.examples.tokenizer(), fields=("sentence1", "sentence2"), max_length=128)
        .bucket(max_tokens=max_tokens)
        .pad(pad_to_multiple_of=8)
    )
    loader = pipe.loader(num_workers=workers)
    cpu, wall = cpu_seconds(), time.perf_counter()
    batches = sum(1 for _ in loader)  # the workers stop (and are reaped) when the epoch ends
    return {"cpu": cpu_seconds() - cpu, "wall": time.perf_counter() - wall, "batches": batches}


def main(argv: Sequence[str] | None = None) -> list[dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs of each setting (the fastest is shown)")
    parser.add_argument("--budgets", type=int, nargs="+", default=list(BUDGETS), help="bucket(max_tokens=...)")
    parser.add_argument("--shuffle", type=int, default=1000, help="shuffle(buffer_size=...): rows in every state")
    parser.add_argument("--chart", help="write a PNG bar chart of CPU seconds per setting here")
    args = parser.parse_args(argv)
    one_epoch(0, args.budgets[0], args.shuffle)  # warm: the tokenizer and file read once, outside the table
    rows = []
    for max_tokens in args.budgets:
        for workers in WORKERS:
            runs = [one_epoch(workers, max_tokens, args.shuffle) for _ in range(args.repeat)]
            best = min(runs, key=lambda r: r["cpu"])
            rows.append({"max_tokens": max_tokens, "workers": workers, **best, "wall": min(r["wall"] for r in runs)})
    base = {r["max_tokens"]: r for r in rows if r["workers"] == 0}
    print(f"{'max_tokens':>10} {'num_workers':>11} {'batches':>7} {'CPU s':>6} {'vs 0':>6} {'wall s':>6}")
    for r in rows:
        ratio = r["cpu"] / base[r["max_tokens"]]["cpu"]
        print(
            f"{r['max_tokens']:>10} {r['workers']:>11} {r['batches']:>7.0f} {r['cpu']:>6.2f} {ratio:>5.2f}x"
            f" {r['wall']:>6.2f}"
        )
    if args.chart:
        _chart(rows, args.chart)
    return rows


def _chart(rows: list[dict[str, float]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    labels = [f"{r['max_tokens']:.0f} tok\n{r['workers']:.0f} workers" for r in rows]
    ax.bar(range(len(rows)), [r["cpu"] for r in rows])
    ax.set_xticks(range(len(rows)), labels, fontsize=7)
    ax.set_ylabel("CPU seconds, one epoch")
    ax.set_title("pipe.loader(num_workers=N) on the shipped sample")
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"chart: {path}")


if __name__ == "__main__":
    main()
