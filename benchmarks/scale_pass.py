"""A full pass over gigabytes of distinct Parquet shards, and over 1,000+ shards on a local S3 server.

Unlike ``scale.py`` (one file linked many times), every shard here holds its own documents: one
stream of random words of the shipped tokenizer's vocabulary is made once, and each shard takes its
64 KiB blocks in an order of its own (seeded) and cuts them into documents of its own (log-normal
lengths, mean about 1.9 kB), uncompressed (logical size = bytes on disk); the S3 shards are each
made of words of their own. Each measured run is a fresh subprocess running
``read_parquet(columns=["text"]) -> tokenize(max_length=512) -> batch(64) -> pad`` under
``loader(num_workers=2)`` and sampling, every ``--sample`` seconds, rows and tokens so far and the
RSS of itself and its worker processes (``/proc``). Reported:

1. time to first batch (listing and worker start included) over the first 0.5 GB, 1 GB, ... of the
   shards (folders of links to a growing prefix of the distinct shards), median of ``--ttfb-runs``
   fresh runs;
2. the full pass (or ``--seconds`` of it): rows/s and tokens/s per interval, peak RSS of the main
   process and of each worker, the loader state's size;
3. the same pipeline on ``--s3-shards`` shards served by moto on 127.0.0.1 (``tests/s3_server.py``,
   started and stopped here), with the ListObjects pages served;
4. a PNG chart of throughput and RSS over time (``--chart``).

Usage (from the repository root; data under --workdir, deleted afterwards unless --keep):
    nice -n 10 python benchmarks/scale_pass.py --gb 5 --workdir /work/scale_data --seconds 1500 \\
        --chart benchmarks/scale_pass.png
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
MAX_LENGTH, BATCH, ROW_GROUP_ROWS, BLOCK = 512, 64, 8192, 64 << 10


def word_bytes(megabytes: float, seed: int) -> np.ndarray:
    """About ``megabytes`` MB of random vocabulary words, space-separated, as bytes (no Python loop per word)."""
    flat, starts, lengths = _vocabulary()
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(lengths), max(1, int(megabytes * 2**20 / lengths.mean())))
    word_ends = np.cumsum(lengths[picks], dtype=np.int32)
    positions = np.repeat(starts[picks] - np.concatenate([[0], word_ends[:-1]]).astype(np.int32), lengths[picks])
    return flat[positions + np.arange(int(word_ends[-1]), dtype=np.int32)]


def documents(data: np.ndarray, seed: int) -> pa.Table:
    """``data`` cut into documents of log-normal length (mean about 1.9 kB), ids distinct per ``seed``."""
    rng = np.random.default_rng([seed, 1])
    cuts = np.cumsum(np.clip(rng.lognormal(7.2, 0.9, len(data) // 300 + 2), 40, 30_000).astype(np.int64))
    offsets = np.concatenate([[0], cuts[cuts < len(data)], [len(data)]])
    text = pa.LargeStringArray.from_buffers(len(offsets) - 1, pa.py_buffer(offsets), pa.py_buffer(data.tobytes()))
    return pa.table({"id": np.arange(len(text)) + seed * 10_000_000, "text": text.cast(pa.string())})


def shard_table(megabytes: float, seed: int) -> pa.Table:
    """About ``megabytes`` MB of documents of random vocabulary words of their own (seeded)."""
    return documents(word_bytes(megabytes, seed), seed)


def permuted_table(base: np.ndarray, seed: int) -> pa.Table:
    """A distinct shard made fast: ``base``'s 64 KiB blocks in an order of its own, cut into documents of its own."""
    blocks = len(base) // BLOCK
    order = np.random.default_rng([seed, 2]).permutation(blocks)
    return documents(base[: blocks * BLOCK].reshape(blocks, BLOCK)[order].ravel(), seed)


@functools.cache
def _vocabulary() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The shipped tokenizer's ASCII alphabetic words, each with a space: their bytes end to end, starts and lengths."""
    import padpipe as pp

    vocab = sorted(pp.examples.tokenizer().get_vocab())
    words = [(w + " ").encode() for w in vocab if w.isascii() and w.isalpha()]  # ASCII: cut anywhere, still UTF-8
    lengths = np.array([len(w) for w in words], dtype=np.int32)  # int32 positions: shards under 2 GB
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int32)
    return np.frombuffer(b"".join(words), dtype=np.uint8), starts, lengths


def write_shards(folder: Path, count: int, megabytes: float, first_seed: int = 0) -> list[Path]:
    """``count`` distinct shards of about ``megabytes`` MB each (kept when already there)."""
    folder.mkdir(parents=True, exist_ok=True)
    base = word_bytes(megabytes, first_seed)
    paths = []
    for i in range(count):
        path = folder / f"part-{i:05d}.parquet"
        if not path.exists():
            table = permuted_table(base, first_seed + i)
            pq.write_table(table, path, row_group_size=ROW_GROUP_ROWS, compression="none")
        paths.append(path)
    return paths


def linked_prefix(workdir: Path, shards: list[Path], gigabytes: float) -> Path:
    """A folder of links to the first shards adding up to ``gigabytes`` GB."""
    folder = workdir / f"first-{gigabytes:g}gb"
    folder.mkdir(exist_ok=True)
    total = 0
    for shard in shards:
        if total >= gigabytes * 2**30:
            break
        link = folder / shard.name
        if not link.exists():
            link.symlink_to(shard)
        total += shard.stat().st_size
    return folder


# -- the measured run (a fresh subprocess) ---------------------------------------------------------------
def rss_mib(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024
    except (OSError, StopIteration):
        return 0.0


def children(pid: int) -> list[int]:
    out = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return out


def child_pass(paths: str, fmt: str, options: dict | None, seconds: float, sample: float) -> dict[str, Any]:
    """One pass (or ``seconds`` of it) with 2 workers; a sample of rows, tokens and RSS every ``sample`` s."""
    import io

    import torch

    import padpipe as pp

    read = pp.read_parquet if fmt == "parquet" else pp.read_jsonl
    pipe = (
        read(paths, columns=["text"], storage_options=options)
        .tokenize(pp.examples.tokenizer(), max_length=MAX_LENGTH)
        .batch(BATCH)
        .pad()
    )
    loader = pipe.loader(num_workers=2)
    start = time.perf_counter()
    batches = iter(loader)
    batch = next(batches)
    ttfb = time.perf_counter() - start
    rows, tokens, timeline, peaks = 0, 0, [], {}
    last = first = time.perf_counter()
    done = False
    while not done:
        rows += batch["input_ids"].shape[0]
        tokens += int(batch["attention_mask"].sum())
        now = time.perf_counter()
        if now - last >= sample:
            pids = [os.getpid(), *children(os.getpid())]
            rss = {str(p): rss_mib(p) for p in pids}
            for p, value in rss.items():
                peaks[p] = max(peaks.get(p, 0.0), value)
            timeline.append({"t": now - first, "rows": rows, "tokens": tokens, "rss_mib": sum(rss.values())})
            last = now
        if now - first >= seconds:
            break
        batch = next(batches, None)
        done = batch is None
    elapsed = time.perf_counter() - first
    buffer, state = io.BytesIO(), loader.state_dict()
    torch.save(state, buffer)
    worker_peaks = sorted((v for p, v in peaks.items() if p != str(os.getpid())), reverse=True)
    return {
        "ttfb_s": ttfb,
        "rows": rows,
        "tokens": tokens,
        "seconds": elapsed,
        "finished": done,
        "rows_per_s": rows / elapsed,
        "tokens_per_s": tokens / elapsed,
        "main_peak_rss_mib": peaks.get(str(os.getpid()), rss_mib(os.getpid())),
        "worker_peak_rss_mib": worker_peaks[:2],
        "total_peak_rss_mib": max((s["rss_mib"] for s in timeline), default=0.0),
        "state_bytes": len(buffer.getvalue()),
        "reader_state_bytes": [len(json.dumps(r)) for r in reader_states(state)],
        "timeline": timeline,
    }


def reader_states(state: Any) -> list[dict]:
    """The file reader states in a loader state (the dicts with a listing digest under ``"files"``)."""
    if isinstance(state, dict):
        found = [state] if isinstance(state.get("files"), dict) else []
        return found + [r for value in state.values() for r in reader_states(value)]
    if isinstance(state, list):
        return [r for value in state for r in reader_states(value)]
    return []


def run_child(paths: str, fmt: str, *, options: dict | None = None, seconds: float, sample: float = 5.0) -> dict:
    """:func:`child_pass` in a fresh interpreter; its result."""
    command = [sys.executable, __file__, "--child", json.dumps([paths, fmt, options, seconds, sample])]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(command, capture_output=True, text=True, env=env)
    if out.returncode:
        raise RuntimeError(f"the measured run failed (exit status {out.returncode}):\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.splitlines()[-1])


def chart(runs: dict[str, dict], path: str) -> None:
    """Tokens/s per interval and total RSS over time, one line per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    for name, run in runs.items():
        points = [{"t": 0.0, "tokens": 0, "rows": 0, "rss_mib": 0.0}, *run["timeline"]]
        t = [p["t"] for p in points[1:]]
        rate = [(b["tokens"] - a["tokens"]) / (b["t"] - a["t"]) / 1e3 for a, b in zip(points, points[1:])]
        top.plot(t, rate, label=name)
        bottom.plot(t, [p["rss_mib"] for p in points[1:]], label=name)
    top.set_ylabel("k tokens/s")
    bottom.set_ylabel("RSS, main + 2 workers (MiB)")
    bottom.set_xlabel("seconds after the first batch")
    bottom.axhline(1536, color="grey", linestyle=":", label="1.5 GiB")
    top.legend()
    bottom.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def summary(name: str, run: dict) -> str:
    workers = " / ".join(f"{v:.0f}" for v in run["worker_peak_rss_mib"])
    return (
        f"| {name} | {run['ttfb_s']:.1f} | {run['rows']:,} | {run['seconds']:.0f}{'' if run['finished'] else ' (cut)'} "
        f"| {run['rows_per_s']:,.0f} | {run['tokens_per_s']:,.0f} | {run['main_peak_rss_mib']:.0f} | {workers} "
        f"| {run['total_peak_rss_mib']:.0f} | {run['state_bytes']:,} |"
    )


HEADER = (
    "| run | first batch (s) | rows | seconds | rows/s | tokens/s | main peak RSS (MiB) | workers' peak RSS (MiB) "
    "| total peak RSS (MiB) | state (bytes) |\n|---|---|---|---|---|---|---|---|---|---|"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=5.0, help="distinct Parquet data to generate (GB)")
    parser.add_argument("--shard-mb", type=float, default=50.0, help="size of one local shard (MB)")
    parser.add_argument("--workdir", default="/work/scale_data", help="where the shards go (deleted unless --keep)")
    parser.add_argument("--ttfb-gb", default="0.5,1,2,5", help="corpus prefixes for the time to first batch (GB)")
    parser.add_argument("--ttfb-runs", type=int, default=3, help="fresh runs per prefix (the median is shown)")
    parser.add_argument("--seconds", type=float, default=1500.0, help="cut the full pass after this long")
    parser.add_argument("--s3-shards", type=int, default=1000, help="shards on the local S3 server (0: none)")
    parser.add_argument("--s3-shard-mb", type=float, default=0.5, help="size of one S3 shard (MB)")
    parser.add_argument("--s3-seconds", type=float, default=300.0, help="cut the S3 pass after this long")
    parser.add_argument("--sample", type=float, default=5.0, help="seconds between samples")
    parser.add_argument("--chart", default="benchmarks/scale_pass.png", help="PNG chart to write")
    parser.add_argument("--keep", action="store_true", help="keep the generated shards")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child_pass(*json.loads(args.child))))
        return

    workdir = Path(args.workdir)
    started = time.perf_counter()
    shards = write_shards(workdir / "shards", max(1, round(args.gb * 1024 / args.shard_mb)), args.shard_mb)
    size = sum(p.stat().st_size for p in shards)
    print(f"{len(shards)} distinct shards, {size / 2**30:.2f} GB, in {time.perf_counter() - started:.0f} s", flush=True)
    try:
        print("\n| corpus | shards | time to first batch (s): median (runs) |\n|---|---|---|")
        for gigabytes in [float(g) for g in args.ttfb_gb.split(",")]:
            folder = linked_prefix(workdir, shards, gigabytes)
            times = [run_child(str(folder), "parquet", seconds=0.0)["ttfb_s"] for _ in range(args.ttfb_runs)]
            shown = f"{statistics.median(times):.1f} ({', '.join(f'{t:.1f}' for t in times)})"
            print(f"| {gigabytes:g} GB | {len(os.listdir(folder))} | {shown} |", flush=True)
        runs = {
            f"local, {size / 2**30:.1f} GB, {len(shards)} shards": run_child(
                str(workdir / "shards"), "parquet", seconds=args.seconds, sample=args.sample
            )
        }
        if args.s3_shards:
            runs.update(s3_run(args))
        print("\n" + HEADER)
        for name, run in runs.items():
            print(summary(name, run), flush=True)
        chart(runs, args.chart)
        print(f"\nchart: {args.chart}")
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)


def s3_run(args: argparse.Namespace) -> dict[str, dict]:
    """The pass over ``--s3-shards`` distinct shards served by moto on 127.0.0.1 (started and stopped here)."""
    import io

    sys.path.insert(0, str(ROOT))
    from tests.s3_server import LocalS3

    objects = {}
    for i in range(args.s3_shards):
        buffer = io.BytesIO()
        pq.write_table(shard_table(args.s3_shard_mb, 100_000 + i), buffer, row_group_size=ROW_GROUP_ROWS)
        objects[f"bucket/scale/part-{i:05d}.parquet"] = buffer.getvalue()
    total = sum(len(v) for v in objects.values())
    with LocalS3() as s3:
        s3.put_many(objects)
        del objects
        run = run_child(
            "s3://bucket/scale/", "parquet", options=s3.options, seconds=args.s3_seconds, sample=args.sample
        )
        run["requests"] = s3.requests()
    print(f"\nS3: {args.s3_shards} shards, {total / 2**30:.2f} GB; requests served: {run['requests']}", flush=True)
    return {f"local S3 (moto), {total / 2**30:.2f} GB, {args.s3_shards} shards": run}


if __name__ == "__main__":
    main()
