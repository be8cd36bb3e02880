"""Run under ``torchrun``: preference pairs over ranks and DataLoader workers, padded and packed.

Usage: ``python -m torch.distributed.run --standalone --nproc_per_node=2 preference_run.py DATA OUT``

Every rank reads two epochs of the pairs in ``DATA`` (JSON Lines files) through ``pipe.loader(num_workers=2,
accumulation_steps=2)`` padded in TRL's layout and packed, and records per step: the pairs whose members it got
(checked to sit together: a padded batch's chosen row ``k`` and rejected row ``half + k`` are one pair's, a packed
row's chosen sequence is followed by its rejected one), whether the batch is a filler, and ``num_items_in_batch``.
It also saves its loader after step 1, resumes a fresh loader from that state and records the rest. Each rank
writes ``OUT/rank<R>.json``.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
from datetime import timedelta

import torch.distributed as dist

import padpipe as pp


def pipelines(data: str) -> dict[str, pp.Pipeline]:
    tok = pp.examples.chat_tokenizer()
    pairs = pp.read_jsonl(sorted(glob.glob(os.path.join(data, "*.jsonl")))).shuffle(32, seed=7)
    pairs = pairs.preference(tok, max_length=256, num_threads=1)
    return {
        "padded": pairs.bucket(batch_size=4, buffer_size=16).pad(),
        "packed": pairs.pack(512, batch_size=2, keep=("id",)),
    }


def step(batch: dict) -> dict:
    if bool(batch.get("is_filler", False)):
        return {"filler": True, "pairs": [], "items": int(batch["num_items_in_batch"])}
    if batch["chosen"].dim() == 1:  # TRL's layout: chosen rows, then rejected rows, pair k at k and half + k
        half = len(batch["chosen"]) // 2
        assert batch["chosen"].tolist() == [True] * half + [False] * half
        assert batch["id"][:half].tolist() == batch["id"][half:].tolist()
        pairs = batch["id"][:half].tolist()
    else:  # packed: each pair's chosen sequence, then its rejected one, in its row
        flat, bounds = batch["chosen"].reshape(-1), batch["cu_seq_lens_q"].tolist()
        starts = [a for a in bounds[:-1] if bool(flat[a])]
        assert all(not bool(flat[bounds[bounds.index(a) + 1]]) for a in starts), "a chosen sequence, then its rejected"
        pairs = [i for row in batch["id"] for i in row]
        assert len(pairs) == len(starts)
    return {"filler": False, "pairs": pairs, "items": int(batch["num_items_in_batch"])}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("data")
    parser.add_argument("out")
    args = parser.parse_args()
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    record = {}
    for kind, pipe in pipelines(args.data).items():
        loader = pipe.loader(num_workers=2, accumulation_steps=2)
        epochs = [[step(b) for b in loader] for _ in range(2)]
        counters = {k: v for k, v in loader.stats().counters.items() if k.startswith("equal_steps.")}
        loader = pipe.loader(num_workers=2, accumulation_steps=2)
        it = iter(loader)
        first = [step(next(it)) for _ in range(2)]
        state = loader.state_dict()
        del it
        fresh = pipe.loader(num_workers=2, accumulation_steps=2)
        fresh.load_state_dict(state)
        rest = [step(b) for b in fresh]
        record[kind] = {"epochs": epochs, "resumed": first + rest, "equal_steps": counters}
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
        json.dump(record, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
