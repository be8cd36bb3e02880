"""Run under ``torchrun --nproc_per_node=2``: every way to load padpipe under DDP, recording what each rank saw.

Usage: ``python -m torch.distributed.run --standalone --nproc_per_node=2 loaders_run.py MODE DATA_DIR OUT_DIR``

* ``MODE=matrix``: ``pipe.loader(num_workers=2)`` with a real DDP step for 2 epochs of the uneven file and
  1 of the shipped sample;
  ``DataLoader(pipe, num_workers=2)`` + ``pp.equal_steps`` for every policy with persistent and
  non-persistent workers for 2 epochs; a plain ``DataLoader`` (which must warn); and a state saved
  mid-epoch with ``torch.save`` plus the batches that followed it.
* ``MODE=resume``: a fresh process loads that state with ``torch.load(weights_only=True)`` and
  records the batches that follow.

Each rank writes ``OUT_DIR/<mode>-rank<R>.json``; tests/test_distributed.py checks them.
"""

from __future__ import annotations

import faulthandler
import hashlib
import json
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

import padpipe as pp

EPOCHS = 2
SAVE_AT = 5
STALL = 150  # seconds without a batch on a rank: it prints every thread's stack (before gloo's 200 s timeout)


def pipeline(path: str) -> pp.Pipeline:
    return (
        pp.read_parquet(path)
        .shuffle(buffer_size=1000, seed=0)
        .tokenize(pp.examples.TOKENIZER_JSON, fields=("sentence1", "sentence2"), max_length=128, num_threads=1)
        .bucket(max_tokens=4096)
        .pad(pad_to_multiple_of=8)
    )


def summary(batch: dict) -> list:
    """A batch as comparable plain data: row ids, repeat flag, and a digest of its tensors."""
    faulthandler.dump_traceback_later(STALL)  # re-armed at each batch: a rank that stalls says where
    digest = hashlib.sha1(batch["input_ids"].numpy().tobytes() + batch["attention_mask"].numpy().tobytes())
    return [batch["idx"].tolist(), bool(batch.get("is_repeat", False)), digest.hexdigest()]


def epoch_record(batches: list[list], stats: pp.StatsSnapshot | None = None) -> dict:
    rids = [r for ids, repeat, _ in batches if not repeat for r in ids]
    out = {"rids": rids, "steps": len(batches), "repeats": sum(1 for b in batches if b[1])}
    if stats is not None:
        out["skipped"], out["counters"] = stats.skipped, stats.counters
    return out


def run_loader_ddp(path: str, epochs: int = EPOCHS) -> list[dict]:
    """``pipe.loader(num_workers=2)`` driving a real DistributedDataParallel step for ``epochs`` epochs."""
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.EmbeddingBag(8000, 4, mode="mean"))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = pipeline(path).loader(num_workers=2)
    out = []
    for _ in range(epochs):
        batches = []
        for batch in loader:
            loss = model(batch["input_ids"]).square().mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            batches.append(summary(batch))
        out.append(epoch_record(batches, loader.stats()))
    return out


def run_dataloader(path: str, policy: str, persistent: bool, epochs: int = EPOCHS) -> list[dict]:
    pipe = pipeline(path)
    loader = DataLoader(pipe, batch_size=None, num_workers=2, persistent_workers=persistent)
    out = []
    for epoch in range(epochs):
        if not persistent:
            pipe.set_epoch(epoch)  # non-persistent workers start from the main process's epoch
        stats = pp.PipelineStats()
        batches = [summary(b) for b in pp.equal_steps(loader, policy, stats=stats)]
        out.append(epoch_record(batches, stats.snapshot()))
    return out


def run_plain_dataloader(path: str) -> int:
    """A plain DataLoader under 2 ranks: must warn (in rank 0's first worker) about the DDP hang."""
    loader = DataLoader(pipeline(path), batch_size=None, num_workers=2)
    return len(next(iter(loader))["idx"])


def save_mid_epoch(path: str, state_file: str) -> list[list]:
    """Take SAVE_AT batches, torch.save the state, and return the batches that follow (2 epochs in all)."""
    loader = pipeline(path).loader(num_workers=2)
    it, after = iter(loader), []
    for _ in range(SAVE_AT):
        next(it)
    torch.save({"loader": loader.state_dict()}, state_file)
    after.append([summary(b) for b in it])
    after.append([summary(b) for b in loader])
    return after


def resume(path: str, state_file: str) -> list[list]:
    loader = pipeline(path).loader(num_workers=2)
    loader.load_state_dict(torch.load(state_file, weights_only=True)["loader"])
    return [[summary(b) for b in loader], [summary(b) for b in loader]]


def main() -> None:
    mode, data, out_dir = sys.argv[1:4]
    dist.init_process_group("gloo", timeout=timedelta(seconds=200))
    faulthandler.dump_traceback_later(STALL)
    rank = dist.get_rank()
    uneven, sample = f"{data}/uneven.parquet", pp.examples.SAMPLE_PARQUET
    state_file = f"{out_dir}/state-rank{rank}.pt"
    if mode == "matrix":
        result = {
            "loader_ddp": {"uneven": run_loader_ddp(uneven), "sample": run_loader_ddp(sample, epochs=1)},
            "dataloader": {
                f"{policy}-{'persistent' if p else 'fresh'}": run_dataloader(uneven, policy, p)
                for policy in ("balance", "repeat", "drop", "off")
                for p in (True, False)
            },
            "plain_rows": run_plain_dataloader(uneven),
            "saved": save_mid_epoch(uneven, state_file),
        }
    else:
        result = {"resumed": resume(uneven, state_file)}
    with open(f"{out_dir}/{mode}-rank{rank}.json", "w") as f:
        json.dump(result, f)
    dist.barrier()
    faulthandler.cancel_dump_traceback_later()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
