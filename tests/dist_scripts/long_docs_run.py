"""Under ``torchrun``: long documents of very uneven length, packed, read by every loader kind on real ranks.

Run by workloads_run.py (``long_docs=DATA``) on every rank. ``DATA`` holds ``docs.jsonl`` (whose first
half by bytes has few tokens per byte, so a byte-balanced share holds far fewer tokens on rank 0) and ``docs.parquet`` (longest documents first, so a
row-balanced share holds far more tokens on rank 0). Each is tokenized whole (``[CLS]``/``[SEP]``
around every document, no truncation) and packed into rows of 256, 4 a batch, then read through
the loaders users build: the default, with 2 worker processes, ``equal_steps="repeat"``,
``accumulation_steps=3`` and ``equal_steps="drop"``. Every rank records: per format and loader, per epoch, its
steps, the histograms of the token ids it read (the pad id 0 is no text token) and of the predictions it trained
(the labels other than -100 of ``labels[:, 1:]``, as a causal LM shifts them), repeats and fillers left out, its
stats' rows, skips and counters (equal steps', and the context tokens ``pack()`` repeats at its cuts), and the
windows' ``num_items_in_batch`` with the label tokens it counted itself.
"""

from __future__ import annotations

import collections
import os

import torch.distributed as dist

import padpipe as pp

LOADERS = {
    "default": {},
    "workers": {"num_workers": 2},
    "repeat": {"equal_steps": "repeat"},
    "accum": {"accumulation_steps": 3},
    "drop": {"equal_steps": "drop"},
}
EPOCHS = 2


def pipeline(path: str) -> pp.Pipeline:
    read = pp.read_jsonl if path.endswith(".jsonl") else pp.read_parquet
    tokens = read(path).tokenize(pp.examples.tokenizer(), truncation=False, num_threads=1)
    return tokens.pack(256, batch_size=4)


def trains(batch: dict) -> bool:
    return not any(bool(batch.get(key, False)) for key in ("is_repeat", "is_filler"))


def epoch(loader: pp.PipelineLoader) -> dict:
    histogram: collections.Counter = collections.Counter()
    predicted: collections.Counter = collections.Counter()
    steps, windows = 0, []
    for batch in loader:
        dist.barrier()  # a DDP step: every rank must be here
        steps += 1
        if trains(batch):
            ids, labels = batch["input_ids"], batch["labels"][:, 1:]
            histogram.update(ids[ids != 0].tolist())
            predicted.update(labels[labels != -100].tolist())
        if "num_items_in_batch" in batch:
            mine = 0 if not trains(batch) else int(batch["labels"][:, 1:].ne(-100).sum())
            windows.append([int(batch["num_items_in_batch"]), mine])
    stats = loader.stats()
    return {
        "steps": steps,
        "histogram": dict(histogram),
        "predicted": dict(predicted),
        "rows": stats.rows,
        "skipped": stats.skipped,
        "counters": {
            k: v for k, v in stats.counters.items() if k.startswith("equal_steps.") or k == "pack.context_tokens"
        },
        "windows": windows,
    }


def result(data: str) -> dict:
    """This rank's record (see above)."""
    out = {}
    for name in ("docs.jsonl", "docs.parquet"):
        pipe = pipeline(os.path.join(data, name))
        for kind, options in LOADERS.items():
            loader = pipe.loader(**options)
            out[f"{name}/{kind}"] = [epoch(loader) for _ in range(EPOCHS)]
    return out
