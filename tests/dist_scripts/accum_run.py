"""Run under ``torchrun``: gradient accumulation with ``num_items_in_batch`` from ``pipe.loader(accumulation_steps=K)``.

Usage: ``python -m torch.distributed.run --standalone --nproc_per_node=R accum_run.py OUT [--steps K] [--save-at N]``

For a padded and a packed pipeline every rank trains a tiny float64 model (an embedding and a
linear layer) over one epoch, window by window: each batch adds ``grad(sum-reduced loss /
num_items_in_batch)``, and after its window the gradients are summed over the ranks. Every rank
also gathers all ranks' batches of the window and computes the gradient of the mean loss over all
of their label tokens at once. With ``--save-at N`` each rank saves its loader state after batch
``N`` (inside a window), a fresh loader loads it (``torch.save``/``torch.load``) and yields the
rest, and the batches before the save plus those after it are checked the same way.
Each rank writes ``OUT/rank<R>.json``: per kind, per window, the count, the label tokens counted
here, the largest gradient difference, and whether the resumed batches equal the uninterrupted ones.
"""

from __future__ import annotations

import argparse
import io
import json
import os
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F

import padpipe as pp

VOCAB = 40


def rows(count: int) -> list[dict]:
    """Pre-tokenized rows of varied length; a prompt of each is masked from the loss (``-100``)."""
    out = []
    for i in range(count):
        n = 2 + (i * 7) % 11
        ids = [2 + (i * 3 + j * 5) % (VOCAB - 2) for j in range(n)]
        out.append({"input_ids": ids, "labels": [-100] * (i % 3) + ids[i % 3 :]})
    return out


def pipelines() -> dict[str, pp.Pipeline]:
    tokens = pp.from_iterable(rows(41)).tokens(pad_id=0)
    unmasked = pp.from_iterable([{"input_ids": r["input_ids"]} for r in rows(41)]).tokens(pad_id=0)
    return {"padded": tokens.batch(3).pad(), "packed": unmasked.pack(16, batch_size=2)}  # pack() builds its labels


def summed_loss(model: torch.nn.Module, batch: dict) -> torch.Tensor:
    """The causal-LM loss of a batch, summed over its label tokens (HF's shift: logits ``[:-1]`` predict labels ``[1:]``)."""
    logits = model(batch["input_ids"])[:, :-1]
    labels = batch["labels"][:, 1:]
    return F.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1), ignore_index=-100, reduction="sum")


def gradient(model: torch.nn.Module) -> torch.Tensor:
    grad = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    model.zero_grad()
    return grad


def check_windows(model: torch.nn.Module, batches: list[dict], steps: int) -> list[dict]:
    """Per window: accumulated, rank-summed gradient of loss / num_items_in_batch vs the all-at-once mean's."""
    out = []
    for start in range(0, len(batches), steps):
        window = batches[start : start + steps]
        for batch in window:
            (summed_loss(model, batch) / batch["num_items_in_batch"]).backward()
        accumulated = gradient(model)
        dist.all_reduce(accumulated, op=dist.ReduceOp.SUM)  # = DDP's average over ranks x world size
        everyone: list = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, [{k: b[k] for k in ("input_ids", "labels")} for b in window])
        every = [b for part in everyone for b in part]
        tokens = sum(int(b["labels"][:, 1:].ne(-100).sum()) for b in every)
        (sum(summed_loss(model, b) for b in every) / tokens).backward()  # the mean over all tokens at once
        reference = gradient(model)
        out.append(
            {
                "items": sorted({int(b["num_items_in_batch"]) for b in window}),
                "tokens": tokens,
                "batches": [len(part) for part in everyone],
                "diff": float((accumulated - reference).abs().max()),
                "scale": float(reference.abs().max()),
            }
        )
    return out


def same(a: list[dict], b: list[dict]) -> bool:
    """Whether two runs' batches are equal, every key and value (tensors exactly)."""

    def equal(x: object, y: object) -> bool:
        return torch.equal(x, y) if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) else x == y

    return len(a) == len(b) and all(x.keys() == y.keys() and all(equal(x[k], y[k]) for k in x) for x, y in zip(a, b))


def run(pipe: pp.Pipeline, args: argparse.Namespace) -> dict:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(VOCAB, 6), torch.nn.Linear(6, VOCAB)).double()
    loader = pipe.loader(accumulation_steps=args.steps)
    record: dict = {}
    batches, buffer = [], None
    for i, batch in enumerate(loader):
        batches.append(batch)
        if i + 1 == args.save_at:
            buffer = io.BytesIO()
            torch.save(loader.state_dict(), buffer)
    record["windows"] = check_windows(model, batches, args.steps)
    if buffer is not None:
        buffer.seek(0)
        again = pipe.loader(accumulation_steps=args.steps)
        again.load_state_dict(torch.load(buffer, weights_only=True))
        rest = list(again)
        record["resumed_same"] = same(rest, batches[args.save_at :])
        record["resumed_windows"] = check_windows(model, batches[: args.save_at] + rest, args.steps)
    try:
        next(iter(pipe.loader(accumulation_steps=args.steps, equal_steps="off")))
    except ValueError as error:
        record["off_refused"] = str(error)
    return record


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--save-at", type=int, default=0)
    args = parser.parse_args()
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    result = {kind: run(pipe, args) for kind, pipe in pipelines().items()}
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
