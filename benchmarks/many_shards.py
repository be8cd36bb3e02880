"""Thousands of small shards: a local S3 server (moto, 127.0.0.1) against the same files on local disk.

Writes ``--shards`` small Parquet and as many JSONL.zst shards (``--rows`` documents each) to a
local folder and to a moto S3 server started here (``tests/s3_server.py``; stopped at the end), then
runs, for each format and store, one fresh subprocess of ``benchmarks/scale_pass.py``'s measured
pass (``read -> tokenize(max_length=512) -> batch(64) -> pad`` under ``loader(num_workers=2)``, cut
after ``--seconds``). Reported: time to first batch (listing and worker start included), rows/s and
tokens/s after it, peak RSS (main process, each worker, all together), the size of the loader state
at the end (``torch.save``) and of each worker's reader state in it (JSON), and the ListObjects
pages the server served during the run (one listing for the pipeline, not one per worker).

Usage:
    nice -n 10 python benchmarks/many_shards.py [--shards 2000] [--rows 20] [--seconds 60] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import io
import json
import shutil
import sys
import tempfile
from pathlib import Path

import pyarrow.parquet as pq
import zstandard
from scale_pass import ROOT, run_child, shard_table

sys.path.insert(0, str(ROOT))
from tests.s3_server import LocalS3  # noqa: E402 - the repository root on the path first


def shards(count: int, rows: int) -> dict[str, dict[str, bytes]]:
    """``{format: {name: bytes}}``: ``count`` Parquet and ``count`` JSONL.zst shards of distinct documents."""
    out: dict[str, dict[str, bytes]] = {"parquet": {}, "jsonl.zst": {}}
    compressor = zstandard.ZstdCompressor()
    for i in range(count):
        table = shard_table(rows * 1.9 / 1024, 200_000 + i)  # about `rows` documents of ~1.9 kB
        buffer = io.BytesIO()
        pq.write_table(table, buffer)
        out["parquet"][f"part-{i:05d}.parquet"] = buffer.getvalue()
        lines = b"".join(json.dumps(r).encode() + b"\n" for r in table.to_pylist())
        out["jsonl.zst"][f"part-{i:05d}.jsonl.zst"] = compressor.compress(lines)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=2000, help="shards per format")
    parser.add_argument("--rows", type=int, default=20, help="about this many documents per shard")
    parser.add_argument("--seconds", type=float, default=60.0, help="cut each pass after this long")
    parser.add_argument("--workdir", help="where the local copies go (default: a new temp folder; deleted)")
    args = parser.parse_args()
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="padpipe-many-shards-"))
    data = shards(args.shards, args.rows)
    print(
        "| format | store | shards | first batch (s) | rows | rows/s | tokens/s | main / workers' peak RSS (MiB) "
        "| state (bytes) | reader states (bytes) | ListObjects pages |\n|---|---|---|---|---|---|---|---|---|---|---|",
        flush=True,
    )
    try:
        with LocalS3() as s3:
            for fmt, files in data.items():
                folder = workdir / fmt
                folder.mkdir(parents=True, exist_ok=True)
                for name, blob in files.items():
                    (folder / name).write_bytes(blob)
                s3.put_many({f"bucket/{fmt}/{name}": blob for name, blob in files.items()})
                read = "parquet" if fmt == "parquet" else "jsonl"
                for store, paths, options in [
                    ("local disk", str(folder), None),
                    ("local S3", f"s3://bucket/{fmt}/", s3.options),
                ]:
                    before = s3.requests().get("list", 0)
                    run = run_child(paths, read, options=options, seconds=args.seconds)
                    pages = s3.requests().get("list", 0) - before
                    workers = " / ".join(f"{v:.0f}" for v in run["worker_peak_rss_mib"])
                    print(
                        f"| {fmt} | {store} | {len(files)} | {run['ttfb_s']:.1f} | {run['rows']:,} "
                        f"| {run['rows_per_s']:,.0f} | {run['tokens_per_s']:,.0f} "
                        f"| {run['main_peak_rss_mib']:.0f} / {workers} | {run['state_bytes']:,} "
                        f"| {', '.join(map(str, run['reader_state_bytes']))} | {pages if options else '-'} |",
                        flush=True,
                    )
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
