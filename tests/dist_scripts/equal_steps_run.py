"""Run under ``torchrun --nproc_per_node=2``: read one Parquet dataset on every rank, write what each saw.

Usage: ``python -m torch.distributed.run --standalone --nproc_per_node=2 equal_steps_run.py DATA OUT_DIR``.
Each rank writes ``OUT_DIR/rank<R>.json``: per run, the row ids of every epoch, step counts, repeats
and the dropped batches counted in stats. tests/test_distributed.py checks them.
"""

from __future__ import annotations

import json
import pickle
import sys
from datetime import timedelta

import torch.distributed as dist
from torch.utils.data import DataLoader

import padpipe as pp
from padpipe.stats import PipelineStats

EPOCHS = 2


def pipeline(path: str) -> pp.Pipeline:
    return (pp.read_parquet(path, chunk_rows=5)
            .tokenize(pp.examples.TOKENIZER_JSON, fields="text", max_length=64, num_threads=1)
            .bucket(max_tokens=256, buffer_size=20)
            .pad())


def record(batches) -> dict:
    rids, repeats = [], 0
    for batch in batches:
        if bool(batch.get("is_repeat", False)):
            repeats += 1
        else:
            rids.extend(batch["rid"].tolist())
    return {"rids": rids, "repeats": repeats}


def run_loader(pipe: pp.Pipeline, policy: str) -> list[dict]:
    loader = pipe.loader(equal_steps=policy)
    out, dropped_before = [], 0
    for _ in range(EPOCHS):
        batches = list(loader)
        dropped = loader.stats().skipped.get("equal_steps.dropped_batches", 0)
        out.append({**record(batches), "steps": len(batches), "dropped": dropped - dropped_before})
        dropped_before = dropped
    return out


def check_resume(pipe: pp.Pipeline, policy: str) -> list[bool]:
    """Resume a fresh loader from states saved at a few steps (the same on every rank: steps are equal)."""
    summary = lambda b: (b["rid"].tolist(), bool(b.get("is_repeat", False)))  # noqa: E731
    loader = pipe.loader(equal_steps=policy)
    reference, states = [], []
    for _ in range(EPOCHS):
        for batch in loader:
            reference.append(summary(batch))
            states.append(pickle.dumps(loader.state_dict()))
    results = []
    for k in sorted({0, len(reference) // 4, len(reference) // 2 - 1, len(reference) - 2}):
        fresh = pipe.loader(equal_steps=policy)
        fresh.load_state_dict(pickle.loads(states[k]))
        rest: list = []
        while len(rest) < len(reference) - k - 1:
            got = [summary(b) for b in fresh]
            if not got:
                break
            rest.extend(got)
        results.append(rest == reference[k + 1 :])
    return results


def run_dataloader(pipe: pp.Pipeline, policy: str | None, epochs: int = EPOCHS) -> list[dict]:
    out = []
    for epoch in range(epochs):
        pipe.set_epoch(epoch)
        stats = PipelineStats()
        loader = DataLoader(pipe, batch_size=None, num_workers=2)
        batches = list(loader) if policy is None else list(pp.equal_steps(loader, policy, stats=stats))
        out.append({**record(batches), "steps": len(batches),
                    "dropped": stats.snapshot().skipped.get("equal_steps.dropped_batches", 0)})
    return out


def main() -> None:
    path, out_dir = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    pipe = pipeline(path)
    result = {
        "dataloader_off": run_dataloader(pipe, None),
        "dataloader_stop_first": run_dataloader(pipe, "stop_first"),
        "dataloader_repeat": run_dataloader(pipe, "repeat", epochs=1),
        "loader_off": run_loader(pipe, "off"),
        "loader_stop_first": run_loader(pipe, "stop_first"),
        "loader_repeat": run_loader(pipe, "repeat"),
        "resume": {policy: check_resume(pipe, policy) for policy in ("stop_first", "repeat")},
    }
    with open(f"{out_dir}/rank{rank}.json", "w") as f:
        json.dump(result, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
