"""Run under ``torchrun`` (gloo, CPU): PadpipeDataLoader checkpointed by torchtitan's CheckpointManager (DCP).

Usage: ``python -m torch.distributed.run --standalone --nproc_per_node=N titan_run.py DATA OUT TAG --dp D
[--workers W] [--load DIR] [--take S --save DIR] [--then TAG --dp D ...]``: each ``--then`` starts another
phase in the same processes (imports paid once), run after the one before it.

The ``N`` processes are a ``D`` x ``N/D`` mesh in row-major order, as torchtitan lays out data and
tensor parallelism: process ``r`` is DP rank ``r // (N/D)``, and its tensor-parallel peers read the
same batches. For each kind (``pack``: the loader reads the Parquet files itself; ``mix``: a padpipe
mix of two corpora, packed, given as ``pipeline``) every process builds the loader through its
config as torchtitan's trainer does (global batch 12 of 2 rows: 3 batches per optimizer step on 2
DP ranks, 2 on 3) and a ``CheckpointManager`` for it. With ``--load`` the manager loads the latest
checkpoint of ``DIR/<kind>`` (saved on any DP degree). It takes ``S`` optimizer steps and saves
(``--save``), or reads to the end of the data (two epochs). Each process writes
``OUT/TAG-rank<R>.json``: per kind, each batch's epoch, input tokens of rows that train (not filled,
not equal steps' fillers) and label tokens, and label errors found (a label that is not the next
token of its document); tests/integrations/test_torchtitan_torchrun.py checks them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn
from torchtitan.components.checkpoint import CheckpointManager
from torchtitan.components.optimizer import LRSchedulersContainer, default_adamw
from torchtitan.components.tokenizer import HuggingFaceTokenizer

import padpipe as pp
from padpipe.integrations.torchtitan import PadpipeDataLoader

SEQ_LEN, ROWS, GLOBAL = 64, 2, 12


def mix_pipeline(data: str):
    def make(tokenizer, seq_len: int, batch_size: int) -> pp.Pipeline:
        tok = pp.examples.tokenizer()
        parts = {
            name: pp.read_parquet(f"{data}/{name}.parquet", chunk_rows=40).tokenize(tok, truncation=False)
            for name in ("a", "b")
        }
        mix = pp.mix(parts, weights={"a": 3, "b": 1}, seed=4)
        return mix.pack(seq_len, batch_size=batch_size, buffer_size=30)

    return make


def loader(kind: str, args: argparse.Namespace, dp_rank: int) -> PadpipeDataLoader:
    common = {"num_workers": args.workers, "epochs": 2, "global_batch_size": GLOBAL}
    if kind == "pack":
        config = PadpipeDataLoader.Config(dataset_path=f"{args.data}/a.parquet", shuffle_buffer=50, seed=2, **common)
    else:
        config = PadpipeDataLoader.Config(pipeline=mix_pipeline(args.data), **common)
    return config.build(
        dp_world_size=args.dp,
        dp_rank=dp_rank,
        tokenizer=HuggingFaceTokenizer(tokenizer_path=pp.examples.TOKENIZER_DIR),
        seq_len=SEQ_LEN,
        local_batch_size=ROWS,
        snapshot_every_n_steps=None,
    )


def checkpointer(dataloader: PadpipeDataLoader, folder: str) -> CheckpointManager:
    model = nn.Linear(2, 2)
    optimizers = default_adamw(lr=1e-3).build(model_parts=[model])
    schedulers = LRSchedulersContainer.Config(warmup_steps=1).build(optimizers=optimizers, training_steps=100)
    config = CheckpointManager.Config(enable=True, folder="ckpt", interval=1, keep_latest_k=0)
    return config.build(
        dataloader=dataloader,
        model_parts=[model],
        optimizers=optimizers,
        lr_schedulers=schedulers,
        states={},
        sd_adapter=None,
        base_folder=folder,
    )


def record(batch, dataloader: PadpipeDataLoader, fillers_before: int) -> dict:
    inputs, labels = batch
    ids, positions = inputs["input"], inputs["positions"]
    filler = dataloader.counts["filler_batches"] > fillers_before  # equal steps' filler: one row again, untrained
    trained = [] if filler else ids.flatten().tolist()
    errors = 0
    for row in range(len(ids)):  # a label is -100 or the next token, and -100 where the next starts a document
        nxt = torch.cat([ids[row, 1:], ids.new_tensor([-1])])
        starts = torch.cat([positions[row, 1:] == 0, torch.tensor([True])])
        errors += int(((labels[row] != -100) & ((labels[row] != nxt) | starts)).sum())
    return {
        "epoch": dataloader.loader.epoch,
        "tokens": [t for t in trained if t != 0],  # the pad id (0) fills padding runs and filled rows
        "labels": labels[labels.ne(-100)].tolist(),
        "shape": list(ids.shape),
        "errors": errors,
    }


def taken(it, dataloader: PadpipeDataLoader) -> dict:
    """The next batch's record, made at once (``loader.epoch`` is the epoch of the batch taken last)."""
    fillers = dataloader.counts["filler_batches"]
    return record(next(it), dataloader, fillers)


def run(kind: str, args: argparse.Namespace, dp_rank: int) -> dict:
    dataloader = loader(kind, args, dp_rank)
    manager = checkpointer(dataloader, os.path.join(args.save or args.load or args.out, kind))
    if args.load:
        assert manager.load(), f"no checkpoint in {args.load}/{kind}"
    it, out = iter(dataloader), {"batches": [], "k": dataloader.batches_per_step}
    steps = 0
    while args.take is None or steps < args.take:
        try:
            step = [taken(it, dataloader) for _ in range(dataloader.batches_per_step)]  # as torchtitan's train_step
        except StopIteration:
            break
        out["batches"] += step
        steps += 1
        dist.barrier()
    if args.take is not None:
        manager.save(steps)
        manager.close()
    out["counts"] = dataloader.counts
    out["group"] = dist.get_world_size(dataloader.group)
    return out


def phase(data: str, out: str, options: list[str]) -> argparse.Namespace:
    """One phase's arguments: ``TAG --dp D [...]`` of the command line, with its ``DATA`` and ``OUT``."""
    parser = argparse.ArgumentParser()
    parser.add_argument("data")
    parser.add_argument("out")
    parser.add_argument("tag")
    parser.add_argument("--dp", type=int, required=True)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--load")
    parser.add_argument("--take", type=int, help="optimizer steps before the save (with --save)")
    parser.add_argument("--save")
    parser.add_argument("--kinds", default="pack,mix")
    return parser.parse_args([data, out, *options])


def main() -> None:
    data, out, *options = sys.argv[1:]
    phases: list[list[str]] = [[]]
    for option in options:
        if option == "--then":
            phases.append([])
        else:
            phases[-1].append(option)
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    for options_of_phase in phases:
        args = phase(data, out, options_of_phase)
        dp_rank = rank // (world // args.dp)
        result = {kind: run(kind, args, dp_rank) for kind in args.kinds.split(",")}
        result["dp_rank"] = dp_rank
        with open(os.path.join(args.out, f"{args.tag}-rank{rank}.json"), "w") as f:
            json.dump(result, f)
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
