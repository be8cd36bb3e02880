"""Memory stays bounded by buffers, not corpus size: stream 1 GB, 10 GB and 100 GB corpora.

One real Parquet file of about 200 MB (random words of the shipped tokenizer's vocabulary,
documents of log-normal length, no compression so logical size = bytes on disk) is linked N
times into a folder per corpus size (symlinks: the real disk use stays ~200 MB). Each size runs in
a fresh subprocess:

1. listing alone: a ``ParquetReader`` over the folder lists every file and reads every footer
   (8 threads), the cost any reader pays before its first row (once per pipeline);
2. the pipeline ``read_parquet -> shuffle(10_000) -> tokenize -> bucket(max_tokens=16384) -> pad``
   read until ``--text-gb`` of text went through or ``--seconds`` passed.

Reported: time to first batch (listing included; median of ``--ttfb-runs`` fresh runs, as the
machine's load makes single runs noisy), listing alone (median), peak RSS of the subprocess
(``resource.getrusage(RUSAGE_SELF).ru_maxrss``: imports, buffers and all; the source file is
written by another subprocess, since a child starts with its parent's ``ru_maxrss``), rows/s and
text MB/s after the first batch. Targets: peak RSS < 1.5 GiB and within +-10% across sizes; time to first
batch flat in corpus size.

Usage:
    python benchmarks/scale.py [--sizes 1,10,100] [--text-gb 0.5] [--seconds 40] [--ttfb-runs 3]
                               [--workdir DIR]

``--workdir`` keeps the generated source (and the corpus folders of links) for the next run; by
default a new private folder is made in the temp folder (``mkdtemp``) and the source written again.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

FILE_MB = 200
ROW_GROUP_ROWS = 8192
MAX_LENGTH = 2048


def make_file(path: Path, megabytes: int = FILE_MB, seed: int = 0) -> None:
    """Write one uncompressed Parquet file of about ``megabytes`` MB of text documents."""
    import padpipe as pp

    rng = np.random.default_rng(seed)
    vocab = [w for w in pp.examples.tokenizer().get_vocab() if w.isalpha()]
    words = np.array(vocab)[rng.integers(0, len(vocab), 4_000_000)]
    pool = " ".join(words.tolist())  # ~25 MB of words; documents are random slices of it
    docs, total = [], 0
    while total < megabytes << 20:
        lengths = np.clip(rng.lognormal(6.8, 0.9, 10_000), 50, 20_000).astype(int)
        starts = rng.integers(0, len(pool) - 20_001, 10_000)
        batch = [pool[s : s + n] for s, n in zip(starts.tolist(), lengths.tolist())]
        docs += batch
        total += int(lengths.sum())
    table = pa.table({"id": np.arange(len(docs)), "text": docs})
    pq.write_table(table, path, row_group_size=ROW_GROUP_ROWS, compression="none")


def make_corpus(workdir: Path, gigabytes: int, source: Path) -> Path:
    """A folder of symlinks to ``source`` adding up to about ``gigabytes`` GB."""
    folder = workdir / f"corpus-{gigabytes}gb"
    copies = max(1, round(gigabytes * 1024 / (source.stat().st_size / 2**20)))
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(copies):
        link = folder / f"part-{i:05d}.parquet"
        if not link.exists():
            link.symlink_to(source)
    return folder


def child(folder: str, text_gb: float, seconds: float, row_bytes: float) -> dict:
    """Run in a fresh process: listing alone, then the pipeline until the text or time cap."""
    import padpipe as pp
    from padpipe import Consumer
    from padpipe.readers.parquet import ParquetReader

    start = time.perf_counter()
    reader = ParquetReader(paths=folder, columns=["text"], consumer=Consumer())
    reader.reset()
    listing_s, units = time.perf_counter() - start, len(reader._units)
    del reader

    pipe = (
        pp.read_parquet(folder, columns=["text"])
        .shuffle(10_000, seed=0)
        .tokenize(pp.examples.tokenizer(), max_length=MAX_LENGTH, num_threads=2)
        .bucket(max_tokens=16_384)
        .pad()
    )
    start = time.perf_counter()
    batches = iter(pipe.loader())
    batch = next(batches)
    first = time.perf_counter()
    rows, tokens = batch["input_ids"].shape[0], int(batch["attention_mask"].sum())
    cap = text_gb * 2**30 / row_bytes
    while rows < cap and time.perf_counter() - first < seconds:
        batch = next(batches)
        rows += batch["input_ids"].shape[0]
        tokens += int(batch["attention_mask"].sum())
    steady = time.perf_counter() - first
    return {
        "listing_s": listing_s,
        "units": units,
        "ttfb_s": first - start,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "vm_hwm_mib": _vm_hwm_mib(),
        "rows": rows,
        "rows_per_s": rows / steady,
        "text_mb_per_s": rows * row_bytes / 2**20 / steady,
        "tokens_per_s": tokens / steady,
        "seconds": steady,
    }


def _vm_hwm_mib() -> float | None:
    """This process's own peak RSS from ``/proc`` (Linux), to cross-check ``ru_maxrss``."""
    try:
        with open("/proc/self/status") as f:
            line = next(line for line in f if line.startswith("VmHWM:"))
        return int(line.split()[1]) / 1024
    except (OSError, StopIteration):
        return None


def work_folder(given: str | None) -> Path:
    """``--workdir`` (made if missing), or a new private folder in the temp folder: never a fixed shared name."""
    if given is None:
        return Path(tempfile.mkdtemp(prefix="padpipe-scale-"))
    folder = Path(given)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,10,100", help="corpus sizes in GB, comma-separated")
    parser.add_argument("--text-gb", type=float, default=0.5, help="stop after this much text went through")
    parser.add_argument("--seconds", type=float, default=40.0, help="or after this long (after the first batch)")
    parser.add_argument(
        "--ttfb-runs", type=int, default=3, help="fresh runs per size for the median time to first batch"
    )
    parser.add_argument(
        "--workdir",
        help="a folder of yours to keep the source in between runs (default: a new private temp folder, mkdtemp)",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--generate", help=argparse.SUPPRESS)
    parser.add_argument("--row-bytes", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.text_gb, args.seconds, args.row_bytes)))
        return
    if args.generate:
        make_file(Path(args.generate))
        return

    workdir = work_folder(args.workdir)
    print(f"workdir: {workdir}")
    source = workdir / "source.parquet"
    if not source.exists():  # written by a subprocess: the peak RSS a child inherits stays that of this process
        started = time.perf_counter()
        subprocess.run([sys.executable, __file__, "--generate", str(source)], check=True)
        print(f"wrote {source} ({source.stat().st_size / 2**20:.0f} MB) in {time.perf_counter() - started:.0f} s")
    meta = pq.ParquetFile(source).metadata
    row_bytes = source.stat().st_size / meta.num_rows
    print(f"source: {meta.num_rows} rows, {meta.num_row_groups} row groups, {row_bytes:.0f} bytes/row\n")

    print(
        "| corpus | files | row groups | listing (s) | time to first batch (s) | peak RSS (MiB) | rows/s | text MB/s "
        "| tokens/s | rows read |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for size in [int(s) for s in args.sizes.split(",")]:
        folder = make_corpus(workdir, size, source)
        runs = [_run(folder, args.text_gb, args.seconds, row_bytes)]
        runs += [_run(folder, args.text_gb, 0.0, row_bytes) for _ in range(args.ttfb_runs - 1)]
        out = runs[0]
        ttfb = statistics.median(run["ttfb_s"] for run in runs)
        listing = statistics.median(run["listing_s"] for run in runs)
        files = len(os.listdir(folder))
        logical = files * source.stat().st_size / 2**30
        print(
            f"| {logical:.1f} GB | {files} | {out['units']} | {listing:.2f} | {ttfb:.2f} | "
            f"{out['peak_rss_mib']:.0f} | {out['rows_per_s']:,.0f} | {out['text_mb_per_s']:.1f} | "
            f"{out['tokens_per_s']:,.0f} | {out['rows']:,} |",
            flush=True,
        )


def _run(folder: Path, text_gb: float, seconds: float, row_bytes: float) -> dict:
    """One fresh subprocess running :func:`child`; its JSON result."""
    command = [
        sys.executable,
        __file__,
        "--child",
        str(folder),
        "--text-gb",
        str(text_gb),
        "--seconds",
        str(seconds),
        "--row-bytes",
        str(row_bytes),
    ]
    return json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout.splitlines()[-1])


if __name__ == "__main__":
    main()
