"""Rows held back per epoch under DDP, per equal-steps policy: 2 ranks x 2 DataLoader workers.

Run: ``python benchmarks/held_back.py`` (launches itself under ``torch.distributed.run`` with 2
gloo ranks). For each way of loading, over 2 epochs: steps per rank, rows each rank read, batches
moved between ranks, split, filled, repeated and dropped, and rows held back (never read in the
epoch). Two workloads: the shipped sample through the frameworks study's pipeline (shuffle ->
tokenize pairs (max_length=128) -> bucket(max_tokens=4096) -> pad(8)), and the shipped documents
longest first (tokenized whole, ``pack(512, batch_size=8)``), whose row-balanced shares are very
uneven by tokens. Before balanced shares (commit bfd51a5) ``pp.equal_steps(DataLoader)`` held back
18% of every epoch of the sample; before ``"balance"`` (commit 13c5dc7) the default dropped 1.6-4.3%
of packed long documents.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from datetime import timedelta

EPOCHS = 2
ROWS = {"sample": 20_000, "docs": 5_000}
COUNTED = ("moved", "split", "filler", "repeated")


def pipeline(workload: str, docs: str):
    import padpipe as pp

    if workload == "docs":
        tokens = pp.read_parquet(docs).tokenize(pp.examples.TOKENIZER_JSON, truncation=False, num_threads=1)
        return tokens.pack(512, batch_size=8, keep=("id",))
    return (
        pp.read_parquet(pp.examples.SAMPLE_PARQUET)
        .shuffle(buffer_size=1000, seed=0)
        .tokenize(pp.examples.TOKENIZER_JSON, fields=("sentence1", "sentence2"), max_length=128, num_threads=1)
        .bucket(max_tokens=4096)
        .pad(pad_to_multiple_of=8)
    )


def measure(name: str, make_epochs) -> list[dict]:
    """Per epoch: steps, row ids read (not repeats or fillers), and what equal steps did on this rank."""
    out = []
    for batches, stats in make_epochs():
        steps, rids = 0, []
        for batch in batches:
            steps += 1
            if not bool(batch.get("is_repeat", False)) and not bool(batch.get("is_filler", False)):
                rids += row_ids(batch)
        snap = stats()
        out.append(
            {
                "name": name,
                "steps": steps,
                "rids": rids,
                **{key: snap.counters.get(f"equal_steps.{key}_batches", 0) for key in COUNTED},
                "dropped": snap.skipped.get("equal_steps.dropped_batches", 0),
            }
        )
    return out


def row_ids(batch) -> list[int]:
    """The rows of a batch: ``idx`` of a padded one, the documents' ``id`` of a packed one (each once)."""
    if "idx" in batch:
        return batch["idx"].tolist()
    return sorted({doc for row in batch["id"] for doc in row})


def rank_main(out_dir: str, docs: str) -> None:
    import torch.distributed as dist
    from torch.utils.data import DataLoader

    import padpipe as pp

    dist.init_process_group("gloo", timeout=timedelta(seconds=300))

    def loader_epochs(workload, policy):
        def run():
            loader = pipeline(workload, docs).loader(num_workers=2, equal_steps=policy)
            before: dict = {}
            for _ in range(EPOCHS):
                yield loader, lambda: _delta(loader.stats(), before)

        return run

    def dataloader_epochs(workload, policy):
        def run():
            dl = DataLoader(pipeline(workload, docs), batch_size=None, num_workers=2, persistent_workers=True)
            for _ in range(EPOCHS):
                stats = pp.PipelineStats()
                yield pp.equal_steps(dl, policy, stats=stats), stats.snapshot

        return run

    results = []
    for workload in ROWS:
        for policy in ("balance", "repeat", "drop"):
            results.append(measure(f"{workload}: loader(num_workers=2), {policy}", loader_epochs(workload, policy)))
        results.append(measure(f"{workload}: equal_steps(DataLoader), balance", dataloader_epochs(workload, "balance")))
    with open(os.path.join(out_dir, f"rank{dist.get_rank()}.json"), "w") as f:
        json.dump(results, f)
    dist.barrier()
    dist.destroy_process_group()


def _delta(snapshot, before: dict):
    """The counters since the last call (the loader's stats accumulate over epochs)."""
    now = {**snapshot.counters, **snapshot.skipped}
    delta = {k: v - before.get(k, 0) for k, v in now.items()}
    before.update(now)
    return type("Delta", (), {"counters": delta, "skipped": delta})()


def write_docs(folder: str) -> str:
    """The shipped documents as Parquet, longest first: a row-balanced share of 2 ranks is very uneven by tokens."""
    import gzip

    import pyarrow as pa
    import pyarrow.parquet as pq

    import padpipe as pp

    with gzip.open(os.path.join(pp.examples.DATA_DIR, "corpus.jsonl.gz"), "rt") as f:
        rows = sorted((json.loads(line) for line in f), key=lambda r: -len(r["text"]))
    path = os.path.join(folder, "docs.parquet")
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=250)
    return path


def main() -> None:
    if "LOCAL_RANK" in os.environ:
        rank_main(sys.argv[1], sys.argv[2])
        return
    with tempfile.TemporaryDirectory() as out:
        docs = write_docs(out)
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", __file__]
        subprocess.run([*command, out, docs], check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        ranks = [json.load(open(os.path.join(out, f"rank{r}.json"))) for r in range(2)]
    print(f"2 ranks x 2 workers, {EPOCHS} epochs: sample = the shipped sample ({ROWS['sample']:,} rows),")
    print(f"bucket(max_tokens=4096); docs = the shipped documents longest first ({ROWS['docs']:,}), pack(512, 8)\n")
    head = "".join(f" {key:>8}" for key in (*COUNTED, "dropped"))
    print(f"{'loading':45} {'epoch':>5} {'steps r0/r1':>12} {'rows r0/r1':>13}{head} {'held back':>14}")
    for run in range(len(ranks[0])):
        for epoch in range(EPOCHS):
            r0, r1 = ranks[0][run][epoch], ranks[1][run][epoch]
            rows = ROWS[r0["name"].split(":")[0]]
            held = rows - len(set(r0["rids"]) | set(r1["rids"]))
            counts = "".join(f" {r0[key] + r1[key]:>8}" for key in (*COUNTED, "dropped"))
            print(
                f"{r0['name']:45} {epoch:>5} {r0['steps']:>5}/{r1['steps']:<6} "
                f"{len(r0['rids']):>6}/{len(r1['rids']):<6}{counts} {held:>5} ({held / rows:.2%})"
            )


if __name__ == "__main__":
    main()
