"""Data, models, token counting and the held-out loss shared by every arm of ``trainer.py``.

Each arm runs in its own process; what it shares with the others is built here the same way in
each: the seeded tiny models, the corpora (written once by the parent), the tokenizer, the
counting of real tokens and slots in whatever batch layout an arm feeds, and the loss on a fixed
held-out set after training.
"""

from __future__ import annotations

import gzip
import json
import re
import time
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

import padpipe as pp

FIELDS = ("sentence1", "sentence2")


def write_pairs(train: str, held_out: str, rows: int, eval_rows: int) -> None:
    """The shipped sentence pairs: the first ``eval_rows`` held out, the next ``rows`` (0: all) to train."""
    table = pq.read_table(pp.examples.SAMPLE_PARQUET, columns=[*FIELDS, "label"])
    pq.write_table(table.slice(0, eval_rows), held_out)
    rest = table.slice(eval_rows)
    pq.write_table(rest.slice(0, rows) if rows else rest, train, row_group_size=2048)


def documents(n: int, median_sentences: float, sigma: float, seed: int) -> list[str]:
    """``n`` documents of log-normal sentence counts, sentences drawn from the shipped corpus.

    Example:
        >>> len(documents(3, 4, 1.0, seed=0))
        3
    """
    with gzip.open(pp.examples.SAMPLE_JSONL, "rt") as f:
        texts = [json.loads(line)["text"] for line in f]
    sentences = np.array([s for t in texts for s in re.split(r"(?<=[.!?])\s+", t) if len(s) > 1], dtype=object)
    rng = np.random.default_rng(seed)
    counts = np.maximum(rng.lognormal(np.log(median_sentences), sigma, n).astype(int), 1)
    picks = sentences[rng.integers(0, len(sentences), int(counts.sum()))]
    ends = np.cumsum(counts)
    return [" ".join(picks[e - k : e]) for e, k in zip(ends, counts)]


def write_docs(path: str, n: int, median_sentences: float, sigma: float, seed: int) -> None:
    """The documents as a Parquet file with one ``text`` column (row groups of 1,024)."""
    texts = documents(n, median_sentences, sigma, seed)
    pq.write_table(pa.table({"text": texts}), path, row_group_size=1024)


def tokenizer(task: str) -> Any:
    """The shipped tokenizer (HF fast); for the causal LM its ``[SEP]`` is also the EOS token."""
    tok = pp.examples.hf_tokenizer()
    if task == "lm":
        tok.eos_token = tok.sep_token
    return tok


def model(task: str, vocab: int, seed: int) -> Any:
    """A tiny seeded model: a BERT pair classifier (``cls``) or a Llama-style causal LM (``lm``)."""
    import transformers as tf

    torch.manual_seed(seed)
    if task == "cls":
        config = tf.BertConfig(
            vocab_size=vocab,
            hidden_size=128,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=512,
            num_labels=2,
        )
        return tf.BertForSequenceClassification(config)
    config = tf.LlamaConfig(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        pad_token_id=0,
        bos_token_id=2,
        eos_token_id=3,
        attn_implementation="sdpa",
    )
    return tf.LlamaForCausalLM(config)


def count(inputs: Any, pad_id: int = 0) -> tuple[int, int, int]:
    """``(rows, real tokens, token slots)`` of one batch, padded, flattened or packed.

    Rows are documents (pairs): in packed and flattened batches every segment that starts at
    position 0 with a non-pad token. Real tokens: a padpipe batch's own count, else the
    attention mask's sum, else every slot (flattened batches have no padding).

    Example:
        >>> count({"input_ids": torch.ones(2, 4), "attention_mask": torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])})
        (2, 5, 8)
    """
    ids = inputs["input_ids"]
    mask = inputs.get("attention_mask")
    real = getattr(inputs, "tokens", None)  # a padpipe batch's count (a BatchEncoding's is a method)
    if not isinstance(real, int):
        real = int(mask.sum()) if mask is not None and mask.dim() == 2 else ids.numel()
    positions = inputs.get("position_ids")
    rows = int(((positions == 0) & (ids != pad_id)).sum()) if positions is not None else ids.shape[0]
    return rows, int(real), ids.numel()


class Meter:
    """Counts every batch an arm trains on and stops training once ``budget`` real tokens are in.

    ``start`` is set before the arm's data preparation; ``steps`` holds, per optimizer step,
    its end time and the rows, real tokens and slots counted so far (over all ranks under
    ``torchrun``, where every rank stops at the same step).
    """

    def __init__(self, budget: int) -> None:
        self.budget, self.start = budget, time.perf_counter()
        self.rows = self.real = self.slots = 0
        self.first_batch = 0.0
        self.steps: list[tuple[float, int, int, int]] = []

    def add(self, inputs: Any) -> None:
        rows, real, slots = count(inputs)
        self.first_batch = self.first_batch or time.perf_counter() - self.start
        self.rows, self.real, self.slots = self.rows + rows, self.real + real, self.slots + slots

    def totals(self) -> tuple[int, int, int]:
        """Rows, real tokens and slots counted so far: summed over the ranks under ``torchrun``."""
        if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
            return self.rows, self.real, self.slots
        sums = torch.tensor([self.rows, self.real, self.slots], dtype=torch.int64)
        torch.distributed.all_reduce(sums)
        rows, real, slots = (int(x) for x in sums)
        return rows, real, slots

    def callback(self) -> Any:
        """A ``TrainerCallback`` that records each optimizer step and stops at the budget."""
        from transformers import TrainerCallback

        meter = self

        class Steps(TrainerCallback):
            def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
                rows, real, slots = meter.totals()
                meter.steps.append((time.perf_counter(), rows, real, slots))
                if real >= meter.budget:  # the same sums on every rank: all stop at the same step
                    control.should_training_stop = True
                return control

        return Steps()

    def result(self) -> dict[str, float]:
        """First-batch and first-step seconds; steady real tokens/s and rows/s, the median over the steps after
        the first (robust to a shared machine's load spikes; the mean rate too); padding efficiency."""
        first = self.steps[0][0] - self.start
        marks = [(self.start + self.first_batch, 0, 0, 0), *self.steps]
        steady = marks[2:] if len(marks) > 2 else marks[1:]  # each entry vs the one before it: steps 2, 3, ...
        before = marks[len(marks) - len(steady) - 1 : -1]
        gaps = [(b[0] - a[0], b[1] - a[1], b[2] - a[2]) for a, b in zip(before, steady)]
        (t0, _, n0, _), (t1, _, n1, _) = before[0], marks[-1]
        return {
            "first_batch_s": self.first_batch,
            "first_step_s": first,
            "steps": len(self.steps),
            "rows": marks[-1][1],
            "tokens": marks[-1][2],
            "rows_per_s": float(np.median([r / max(t, 1e-9) for t, r, _ in gaps])),
            "tokens_per_s": float(np.median([n / max(t, 1e-9) for t, _, n in gaps])),
            "mean_tokens_per_s": (n1 - n0) / max(t1 - t0, 1e-9),
            "efficiency": marks[-1][2] / max(1, marks[-1][3]),
            "train_s": self.steps[-1][0] - self.start,
        }


def counting(trainer_class: type, meter: Meter) -> type:
    """``trainer_class`` with every training batch counted by ``meter`` before its step."""

    class Counting(trainer_class):  # type: ignore[misc, valid-type]
        def training_step(self, model: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
            meter.add(inputs)
            return super().training_step(model, inputs, *args, **kwargs)

    return Counting


@torch.no_grad()
def held_out_loss(net: Any, task: str, path: str, tok: Any, max_length: int) -> float:
    """Mean loss on the held-out file, the same batches for every arm: per pair (``cls``) or per token (``lm``)."""
    net.eval()
    table = pq.read_table(path)
    if task == "cls":
        enc = tok(*[table.column(f).to_pylist() for f in FIELDS], truncation=True, max_length=max_length)
        labels = table.column("label").to_pylist()
    else:
        enc = tok(table.column("text").to_pylist(), truncation=True, max_length=max_length)
        enc.pop("token_type_ids", None)
    total = weight = 0.0
    for i in range(0, table.num_rows, 32):
        batch = tok.pad({k: v[i : i + 32] for k, v in enc.items()}, return_tensors="pt")
        if task == "cls":
            batch["labels"] = torch.tensor(labels[i : i + 32])
            n = len(batch["labels"])
        else:
            batch["labels"] = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
            n = int((batch["labels"][:, 1:] != -100).sum())
        total += float(net(**batch).loss) * n
        weight += n
    return total / weight
