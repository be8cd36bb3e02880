"""Under torchrun x2: Accelerate with ``prepare(model, opt, pipe.loader(num_workers=2))``, and the misuse.

Usage: ``torchrun --standalone --nproc_per_node=2 accelerate_run.py DATA OUT``. Each rank writes
``OUT/rank<R>.json``: the row ids it trained on per epoch, its steps, whether ``prepare`` passed the loader
through, a resume check, the errors ``prepare(DataLoader(pipe))`` raised, and what ``save_state`` raised for a
registered loader.
tests/integrations/test_accelerate.py checks them.
"""

from __future__ import annotations

import json
import sys

import torch
from accelerate import Accelerator, DataLoaderConfiguration
from torch.utils.data import DataLoader

import padpipe as pp
from tests.integrations.tiny import bert_config, digest, finish


def pipeline(data: str) -> pp.Pipeline:
    return (
        pp.read_parquet(data)
        .shuffle(buffer_size=1000, seed=0)
        .tokenize(pp.examples.tokenizer(), fields=("sentence1", "sentence2"), max_length=128)
        .bucket(max_tokens=1024)
        .pad(pad_to_multiple_of=8)
    )


def train(accelerator: Accelerator, pipe: pp.Pipeline) -> tuple[bool, list[dict]]:
    from transformers import BertForSequenceClassification

    torch.manual_seed(0)
    model = BertForSequenceClassification(bert_config())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = pipe.loader(num_workers=2)
    model, optimizer, prepared = accelerator.prepare(model, optimizer, loader)
    epochs = []
    for _ in range(2):
        ids, steps = [], 0
        for batch in prepared:
            ids += batch.pop("idx").tolist()
            accelerator.backward(model(**batch).loss)
            optimizer.step()
            optimizer.zero_grad()
            steps += 1
        epochs.append({"ids": ids, "steps": steps})
    return prepared is loader, epochs


def resume(pipe: pp.Pipeline, path: str) -> bool:
    """This rank's loader state saved after 5 batches, loaded by a new loader: the rest is tensor-equal."""
    loader = pipe.loader(num_workers=2)
    batches = iter(loader)
    for _ in range(5):
        next(batches)
    torch.save(loader.state_dict(), path)
    rest = [digest(b["input_ids"], b["attention_mask"]) for b in batches]
    again = pipe.loader(num_workers=2)
    again.load_state_dict(torch.load(path, weights_only=True))
    return rest == [digest(b["input_ids"], b["attention_mask"]) for b in again]


def misuse(pipe: pp.Pipeline) -> dict[str, str]:
    """What iterating ``accelerator.prepare(DataLoader(pipe))`` raises under 2 processes."""
    cases = {
        "dispatch": ({}, {"batch_size": None}),
        "shard": ({"dispatch_batches": False}, {"batch_size": 1, "collate_fn": lambda rows: rows[0]}),
        "shard_in_workers": (
            {"dispatch_batches": False},
            {"batch_size": 1, "collate_fn": lambda rows: rows[0], "num_workers": 2},
        ),
    }
    errors = {}
    for name, (config, options) in cases.items():
        accelerator = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(**config))
        try:
            next(iter(accelerator.prepare(DataLoader(pipe, **options))))
            errors[name] = "no error"
        except RuntimeError as exc:
            errors[name] = str(exc)
    return errors


def registered(accelerator: Accelerator, pipe: pp.Pipeline, out: str) -> str:
    """What ``save_state`` raises for a ``pipe.loader()`` given to ``register_for_checkpointing`` (2 processes)."""
    loader = pipe.loader()
    next(iter(loader))
    accelerator.register_for_checkpointing(loader)
    try:
        accelerator.save_state(f"{out}/saved")
        return "no error"
    except RuntimeError as exc:
        return str(exc)


def main(data: str, out: str) -> None:
    accelerator = Accelerator(cpu=True)
    pipe = pipeline(data)
    passed_through, epochs = train(accelerator, pipe)
    rank = accelerator.process_index
    result = {
        "passed_through": passed_through,
        "epochs": epochs,
        "resumed": resume(pipe, f"{out}/state{rank}.pt"),
        "errors": misuse(pipe),
        "registered": registered(accelerator, pipe, out),
    }
    with open(f"{out}/rank{rank}.json", "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
    finish()
