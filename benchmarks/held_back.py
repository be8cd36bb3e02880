"""Rows held back per epoch under DDP: 2 ranks x 2 DataLoader workers on the shipped sample.

Run: ``python benchmarks/held_back.py`` (launches itself under ``torch.distributed.run`` with 2
gloo ranks). For each way of loading, over 2 epochs: steps per rank, rows each rank read, batches
split to keep ranks in step, and rows held back (never read in the epoch). The pipeline is the one
from the frameworks study: shuffle -> tokenize pairs (max_length=128) -> bucket(max_tokens=4096)
-> pad(8). Before balanced shares (commit bfd51a5) ``pp.equal_steps(DataLoader)`` held back 18%
(3,622 of 20,000 rows) of every epoch here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from datetime import timedelta

EPOCHS = 2
ROWS = 20_000


def pipeline():
    import padpipe as pp

    return (
        pp.read_parquet(pp.examples.SAMPLE_PARQUET)
        .shuffle(buffer_size=1000, seed=0)
        .tokenize(pp.examples.TOKENIZER_JSON, fields=("sentence1", "sentence2"), max_length=128, num_threads=1)
        .bucket(max_tokens=4096)
        .pad(pad_to_multiple_of=8)
    )


def measure(name: str, make_epochs) -> list[dict]:
    """Per epoch: steps, row ids read (not repeats), splits and drops counted on this rank."""
    out = []
    for batches, stats in make_epochs():
        steps, rids = 0, []
        for batch in batches:
            steps += 1
            if not bool(batch.get("is_repeat", False)):
                rids += batch["idx"].tolist()
        snap = stats()
        out.append(
            {
                "name": name,
                "steps": steps,
                "rids": rids,
                "split": snap.counters.get("equal_steps.split_batches", 0),
                "repeated": snap.counters.get("equal_steps.repeated_batches", 0),
            }
        )
    return out


def rank_main(out_dir: str) -> None:
    import torch.distributed as dist
    from torch.utils.data import DataLoader

    import padpipe as pp

    dist.init_process_group("gloo", timeout=timedelta(seconds=300))

    def loader_epochs(policy):
        def run():
            loader = pipeline().loader(num_workers=2, equal_steps=policy)
            before = {}
            for _ in range(EPOCHS):
                yield loader, lambda: _delta(loader.stats(), before)

        return run

    def dataloader_epochs(policy):
        def run():
            dl = DataLoader(pipeline(), batch_size=None, num_workers=2, persistent_workers=True)
            for _ in range(EPOCHS):
                stats = pp.PipelineStats()
                yield pp.equal_steps(dl, policy, stats=stats), stats.snapshot

        return run

    results = []
    for name, run in [
        ("pipe.loader(num_workers=2)", loader_epochs("stop_first")),
        ("pp.equal_steps(DataLoader), stop_first", dataloader_epochs("stop_first")),
        ("pp.equal_steps(DataLoader), repeat", dataloader_epochs("repeat")),
    ]:
        results.append(measure(name, run))
    with open(os.path.join(out_dir, f"rank{dist.get_rank()}.json"), "w") as f:
        json.dump(results, f)
    dist.barrier()
    dist.destroy_process_group()


def _delta(snapshot, before: dict):
    """The counters since the last call (the loader's stats accumulate over epochs)."""
    counters = {k: v - before.get(k, 0) for k, v in snapshot.counters.items()}
    before.update(snapshot.counters)
    return type("Delta", (), {"counters": counters})()


def main() -> None:
    if "LOCAL_RANK" in os.environ:
        rank_main(sys.argv[1])
        return
    with tempfile.TemporaryDirectory() as out:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", __file__, out]
        subprocess.run(command, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        ranks = [json.load(open(os.path.join(out, f"rank{r}.json"))) for r in range(2)]
    print(f"2 ranks x 2 workers, shipped sample ({ROWS:,} rows), bucket(max_tokens=4096), {EPOCHS} epochs\n")
    print(
        f"{'loading':42} {'epoch':>5} {'steps r0/r1':>12} {'rows r0/r1':>13} {'split':>6} {'repeated':>8} "
        f"{'held back':>10}"
    )
    for run in range(len(ranks[0])):
        for epoch in range(EPOCHS):
            r0, r1 = ranks[0][run][epoch], ranks[1][run][epoch]
            held = ROWS - len(set(r0["rids"]) | set(r1["rids"]))
            print(
                f"{r0['name']:42} {epoch:>5} {r0['steps']:>5}/{r1['steps']:<6} "
                f"{len(r0['rids']):>6}/{len(r1['rids']):<6}"
                f" {r0['split'] + r1['split']:>6} {r0['repeated'] + r1['repeated']:>8} {held:>5} ({held / ROWS:.2%})"
            )


if __name__ == "__main__":
    main()
