"""Under ``torchrun``: the epoch's uneven tail of the three workloads, in a loop that knows nothing of fillers.

Run by workloads_run.py (``fillers=DATA``) on every rank. ``DATA`` holds ``pairs.parquet`` (sentence
pairs with one label a row, bucketed), ``docs.jsonl`` (pretraining documents packed with
``pack(256, batch_size=1)``, and again keeping their ``idx``), ``one_doc.jsonl`` (one document, one packed row for every rank) and
``chats.jsonl`` (conversations, packed with ``pack(1024, batch_size=1)``). Each rank reads every
workload for two epochs in a plain loop and records: per workload and epoch, its steps, its fillers,
the labels a loop that knows nothing of fillers trains on (the causal shift for packed rows: ``labels[:, 1:]``)
and those a loop with the docs' line (``loss * pp.loss_weight(batch)``) trains, and the stats' split
and filler counters; with a kept ``idx``, each document segment of its batches: its ``idx``, its tokens and the
labels it trains.
"""

from __future__ import annotations

import collections
import os
import sys
from pathlib import Path

import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: tests.chat_fixtures

import padpipe as pp  # noqa: E402
from tests import chat_fixtures  # noqa: E402

EPOCHS = 2


def pipelines(data: str) -> dict[str, pp.Pipeline]:
    pairs = pp.read_parquet(os.path.join(data, "pairs.parquet")).tokenize(
        pp.examples.tokenizer(), fields=("sentence1", "sentence2"), max_length=64
    )
    docs = pp.read_jsonl(os.path.join(data, "docs.jsonl")).tokenize(pp.examples.tokenizer(), truncation=False)
    one_doc = pp.read_jsonl(os.path.join(data, "one_doc.jsonl")).tokenize(pp.examples.tokenizer(), max_length=250)
    chats = pp.read_jsonl(os.path.join(data, "chats.jsonl")).chat(chat_fixtures.tokenizer(), max_length=1024)
    return {
        "pairs": pairs.bucket(max_tokens=4 * 64).pad(),
        "docs": docs.pack(256, batch_size=1, long_docs="split"),
        "docs_idx": docs.pack(256, batch_size=1, long_docs="split", keep=("idx",)),  # no filler either
        "chats": chats.pack(1024, batch_size=1),
        "one_doc": one_doc.pack(256, batch_size=1),  # one row for all ranks: its document is cut
    }


def trained(batch: dict, packed: bool) -> list[int]:
    """The labels a loss over ``batch`` trains (packed rows: a causal LM's ``labels[:, 1:]``)."""
    labels = batch["labels"][:, 1:] if packed else batch["labels"]
    return labels[labels != -100].tolist()


def documents(batch: dict) -> list[list]:
    """Each document segment of a one-row batch with a kept ``idx``: ``[idx, its tokens, the labels it trains]``."""
    edges, ids, labels = batch["cu_seq_lens_q"].tolist(), batch["input_ids"][0].tolist(), batch["labels"][0].tolist()
    return [
        [idx, ids[a:b], [label for label in labels[a:b] if label != -100]]
        for idx, a, b in zip(batch["idx"][0], edges, edges[1:])  # the padding, last, has no idx
    ]


def epoch(loader: pp.PipelineLoader, packed: bool) -> dict:
    plain: collections.Counter = collections.Counter()
    real: collections.Counter = collections.Counter()
    steps = fillers = 0
    segments = []
    for batch in loader:
        dist.barrier()  # a DDP step: every rank must be here
        steps += 1
        labels = trained(batch, packed)
        plain.update(labels)  # a loop that knows nothing of fillers
        fillers += int(bool(batch.get("is_filler", False)))
        if pp.loss_weight(batch):  # the docs' one line: a filler's loss times 0
            real.update(labels)
            segments += documents(batch) if "idx" in batch and "cu_seq_lens_q" in batch else []
    counters = loader.stats().counters
    return {
        "steps": steps,
        "fillers": fillers,
        "plain": dict(plain),
        "real": dict(real),
        "counters": {k: v for k, v in counters.items() if k.startswith("equal_steps.")},
        "documents": segments,
    }


def result(data: str) -> dict:
    """This rank's record (see above)."""
    out = {}
    for name, pipe in pipelines(data).items():
        loader = pipe.loader()
        out[name] = [epoch(loader, name != "pairs") for _ in range(EPOCHS)]
    return out
