"""Run under ``torchrun``: elastic resume with real ranks, as a training job resized between runs does it.

Usage: ``python -m torch.distributed.run --standalone --nproc_per_node=R elastic_run.py DATA OUT TAG
[--workers W] [--load DIR] [--take K --save DIR] [--epochs N] [--kinds bucket,batch,pack,mix,accum,repeat]
[--then TAG [options] ...]``

Each ``--then`` starts a further phase in the same launch (one process group, imports paid once), with
its own tag and options, after the one before it: several layouts of the same world size share a launch.

For each pipeline kind every rank builds ``pipe.loader(num_workers=W)`` (``accum``: with
``accumulation_steps=3``, whose windows do not divide its 5 batches a rank; ``repeat``: with
``equal_steps="repeat"`` over short rows on rank 0 and long ones on rank 1, so rank 0 replays from
its 8th step); ``--take kind=K`` sets one kind's steps before the save. With ``--load`` it loads the
states of *every* saved rank (``torch.load(weights_only=True)`` of the sorted files), as
docs/elastic.md says. Then it takes ``K`` steps (a ``dist.barrier()`` per step, as a DDP step would)
and saves its state to ``--save``, and (unless ``--epochs -1``) runs the rest of the epoch and ``N``
more epochs.
Each rank writes ``OUT/TAG-rank<R>.json``: per kind, the rows before the save or per epoch, the
steps, the rows equal steps dropped and the loader's layout; and torchrun's rank variables. tests/runtime/test_elastic_torchrun.py checks them.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

import padpipe as pp

MAX_TOKENS = 512
ENV_NAMES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK")  # what torchrun set


def pipelines(data: str) -> dict[str, pp.Pipeline]:
    """The four kinds of pipeline the elastic matrix runs: bucketed, fixed batches, packed, a mix."""
    tok = pp.examples.tokenizer()

    def read(name: str, **options) -> pp.Pipeline:
        return pp.read_parquet(f"{data}/{name}.parquet", chunk_rows=50, **options)

    def tokens(pipe: pp.Pipeline) -> pp.Pipeline:
        return pipe.tokenize(tok, max_length=48, num_threads=1)

    mix = pp.mix({"a": tokens(read("a")), "b": tokens(read("b"))}, weights={"a": 3, "b": 1}, seed=4, chunk_rows=40)
    uneven = pp.read_parquet([f"{data}/short.parquet", f"{data}/long.parquet"], chunk_rows=50)
    return {
        "accum": pp.read_parquet(f"{data}/masked.parquet", chunk_rows=16)
        .tokens(pad_id=0)
        .bucket(max_tokens=96, buffer_size=32)
        .pad(),
        "repeat": tokens(uneven).bucket(max_tokens=MAX_TOKENS, buffer_size=64).pad(),
        "bucket": tokens(read("a").shuffle(buffer_size=200, seed=1))
        .bucket(max_tokens=MAX_TOKENS, buffer_size=150)
        .pad(),
        "batch": tokens(read("a").shuffle(buffer_size=200, seed=3)).batch(16).pad(),
        "pack": tokens(read("a").shuffle(buffer_size=200, seed=2)).pack(64, batch_size=4, buffer_size=40),
        "mix": mix.bucket(max_tokens=MAX_TOKENS, buffer_size=100).pad(),
    }


LOADER_OPTIONS = {"accum": {"accumulation_steps": 3}, "repeat": {"equal_steps": "repeat"}}


def rows_of(batch: dict) -> list:
    """A batch's rows: ``rid`` when it has one, else a packed batch's documents as token lists (none for a repeat
    or a filler, which train nothing)."""
    if bool(batch.get("is_repeat", False)) or bool(batch.get("is_filler", False)):
        return []
    if "rid" in batch:
        return batch["rid"].tolist()
    flat, bounds = batch["input_ids"].flatten().tolist(), batch["cu_seq_lens_q"].tolist()
    docs = [flat[a:b] for a, b in zip(bounds, bounds[1:])]
    return [d for d in docs if d[0] != 0]  # the padding run is made of the pad id (0)


def steps(it) -> list:
    """The rows of each step of ``it``, one DDP-like barrier per step."""
    out = []
    for batch in it:
        dist.barrier()
        out.append(rows_of(batch))
    return out


def run(kind: str, pipe: pp.Pipeline, args: argparse.Namespace, rank: int) -> dict:
    loader = pipe.loader(num_workers=args.workers, **LOADER_OPTIONS.get(kind, {}))
    if args.load:
        files = sorted(glob.glob(os.path.join(args.load, f"{kind}-rank*.pt")))
        loader.load_state_dict([torch.load(f, weights_only=True) for f in files])
    record: dict = {"before": []}
    it = iter(loader)
    takes = dict(kv.split("=") if "=" in kv else ("all", kv) for kv in args.take.split(",") if kv)
    if take := int(takes.get(kind, takes.get("all", 0))):
        for _ in range(take):
            record["before"].append(rows_of(next(it)))
            dist.barrier()
        state = loader.state_dict()
        torch.save(state, os.path.join(args.save, f"{kind}-rank{rank}.pt"))
        window = state["root"] if "window" in state["root"] else None  # LossTokens on top (accumulation)
        steps_state = (window["source"] if window else state["root"])["lockstep"]
        record["saved"] = {
            "window": len(window["window"]) if window else 0,
            "exhausted": steps_state["exhausted"],
            "stopped": steps_state["stopped"],
        }
    if args.epochs >= 0:  # the rest of the epoch (after the save, if any), then more epochs
        record["epochs"] = [steps(it)] + [steps(loader) for _ in range(args.epochs)]
    record["dropped"] = loader.stats().skipped.get("equal_steps.dropped_rows", 0)
    record["layout"] = loader.state_dict()["layout"]  # [rank, ranks, workers] the loader read as
    return record


def phases(argv: list[str]) -> tuple[str, str, list[argparse.Namespace]]:
    """``DATA OUT`` and the phases after them: ``TAG [options]``, one after another, split at ``--then``."""
    parser = argparse.ArgumentParser()
    parser.add_argument("tag")
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--load")
    parser.add_argument("--take", default="", help="steps before the save: K (every kind) or kind=K,...")
    parser.add_argument("--save")
    parser.add_argument("--epochs", type=int, default=1, help="epochs after the rest of this one; -1: stop at the save")
    parser.add_argument("--kinds", default="bucket,batch,pack,mix")
    data, out, *rest = argv
    groups: list[list[str]] = [[]]
    for arg in rest:
        if arg == "--then":
            groups.append([])
        else:
            groups[-1].append(arg)
    return data, out, [parser.parse_args(group) for group in groups]


def main() -> None:
    data, out, todo = phases(sys.argv[1:])
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    rank = dist.get_rank()
    saved = {args.save for args in todo if args.save}
    for args in todo:  # each phase builds fresh loaders
        if args.load in saved:
            raise SystemExit(f"{args.tag}: a state is loaded by a later launch, not by the one that saved it")
        pipes = pipelines(data)
        result = {kind: run(kind, pipes[kind], args, rank) for kind in args.kinds.split(",")}
        result["env"] = {name: os.environ.get(name) for name in ENV_NAMES}
        with open(os.path.join(out, f"{args.tag}-rank{rank}.json"), "w") as f:
            json.dump(result, f)
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
