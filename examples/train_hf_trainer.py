"""transformers' Trainer on padpipe batches with ``padpipe.hf.Trainer``, on one process or several.

    torchrun --standalone --nproc_per_node=2 examples/train_hf_trainer.py [MRPC_FOLDER [OUTPUT_DIR]] [--max-steps N]
    python examples/train_hf_trainer.py                              # one process; --log-every N too

Needs ``transformers`` and ``datasets``: ``pip install 'padpipe[hf]'``. MRPC_FOLDER holds ``train-*.parquet`` and
``validation-*.parquet`` (default: the shipped sample, its first
1,000 rows as validation). Trains a tiny BERT for 60 steps (``--max-steps``), logging the loss every
``--log-every`` steps, with checkpoints in OUTPUT_DIR (default ``runs/hf_trainer``), evaluates, and predicts the
validation split in its row order. Rerun with the
same OUTPUT_DIR to resume from the last checkpoint: the data stream continues exactly.
"""

from __future__ import annotations

import argparse
import os

import datasets
import pyarrow.parquet as pq
from transformers import BertConfig, BertForSequenceClassification, TrainingArguments
from transformers.trainer_utils import get_last_checkpoint

import padpipe as pp
from padpipe.hf import Trainer
from padpipe.recipes.glue import glue


def sample_mrpc() -> datasets.DatasetDict:
    table = pq.read_table(pp.examples.SAMPLE_PARQUET)
    return datasets.DatasetDict(
        train=datasets.Dataset(table.slice(1000)), validation=datasets.Dataset(table.slice(0, 1000))
    )


def accuracy(prediction) -> dict:
    return {"accuracy": float((prediction.predictions.argmax(-1) == prediction.label_ids).mean())}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="transformers' Trainer on padpipe batches.")
    parser.add_argument("data", nargs="?", help="a folder of MRPC Parquet files by split (default: the shipped sample)")
    parser.add_argument(
        "output_dir", nargs="?", default="runs/hf_trainer", help="checkpoints (default: runs/hf_trainer)"
    )
    parser.add_argument("--max-steps", type=int, default=60, help="steps to train (default: 60)")
    parser.add_argument("--log-every", type=int, default=10, help="log the loss every N steps (default: 10)")
    return parser.parse_args()


def main() -> None:
    options = parse_args()
    data = options.data or sample_mrpc()
    output_dir = options.output_dir
    tokenizer = pp.examples.tokenizer()
    train = glue("mrpc", "train", tokenizer, data=data, max_tokens=4096)  # shuffled, length-bucketed, padded
    val = glue("mrpc", "validation", tokenizer, data=data, batch_size=64)  # sorted by length, with row_index

    model = BertForSequenceClassification(
        BertConfig(vocab_size=8000, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
    )
    args = TrainingArguments(
        output_dir,
        max_steps=options.max_steps,
        save_steps=30,
        logging_steps=options.log_every,
        learning_rate=1e-3,
        dataloader_num_workers=2,
        use_cpu=True,
        report_to=[],
        disable_tqdm=True,
    )
    trainer = Trainer(model=model, args=args, train_dataset=train, eval_dataset=val, compute_metrics=accuracy)
    last = get_last_checkpoint(output_dir) if os.path.isdir(output_dir) else None
    trainer.train(resume_from_checkpoint=last)  # the pipeline's batches as they are; equal steps on every rank

    metrics = trainer.evaluate()
    prediction = trainer.predict(val)  # every validation row once, in the split's order, from all ranks
    if trainer.is_world_process_zero():
        print(
            f"eval: {metrics['eval_samples']} rows, loss {metrics['eval_loss']:.4f}, "
            f"accuracy {metrics['eval_accuracy']:.3f}"
        )
        print(f"predict: {prediction.predictions.shape[0]} rows in split order, labels {prediction.label_ids[:8]}")


if __name__ == "__main__":
    main()
