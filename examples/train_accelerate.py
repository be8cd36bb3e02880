"""Accelerate on padpipe batches: ``accelerator.prepare(model, optimizer, pipe.loader(...))``.

    torchrun --standalone --nproc_per_node=2 examples/train_accelerate.py [PARQUET] [--epochs N] [--max-steps N]
    python examples/train_accelerate.py                          # one process; or: accelerate launch ...

Needs Accelerate and ``transformers``: ``pip install 'padpipe[hf,accelerate]'``. Accelerate passes padpipe's loader
through untouched: padpipe shards the data by rank and worker and
keeps steps equal across ranks. (``prepare(DataLoader(pipe))`` would shard it a second time; padpipe
raises an error saying so.) Trains a tiny BERT for ``--epochs`` epochs (default: one) on MRPC-style
Parquet files (default: the shipped sample), prints the loss every ``--log-every`` steps (main
process) and each rank's steps and rows.
"""

from __future__ import annotations

import argparse
import gc

import torch
from accelerate import Accelerator
from transformers import BertConfig, BertForSequenceClassification

import padpipe as pp


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Accelerate on padpipe batches.")
    parser.add_argument(
        "data",
        nargs="?",
        default=pp.examples.SAMPLE_PARQUET,
        help="MRPC-style Parquet file(s), folder or glob (default: the shipped sample)",
    )
    parser.add_argument("--epochs", type=int, default=1, help="passes over the data (default: 1)")
    parser.add_argument("--max-steps", type=int, help="stop after N steps in all (default: --epochs epochs)")
    parser.add_argument("--log-every", type=int, default=50, help="print the loss every N steps (default: 50)")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    accelerator = Accelerator()
    pipe = (
        pp.read_parquet(args.data)
        .shuffle(buffer_size=2000, seed=0)
        .tokenize(pp.examples.tokenizer(), fields=("sentence1", "sentence2"), max_length=128)
        .bucket(max_tokens=8192)
        .pad(pad_to_multiple_of=8)
    )  # add .to_cuda() to copy batches to the GPU ahead of use
    model = BertForSequenceClassification(
        BertConfig(vocab_size=8000, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer, loader = accelerator.prepare(model, optimizer, pipe.loader(num_workers=2))

    steps = rows = 0
    for _ in range(args.epochs):  # each pass over the loader is the next epoch, reshuffled
        for batch in loader:
            batch.pop("idx")
            weight = pp.loss_weight(batch)  # 0.0 for equal steps' filler (its mark popped): it trains nothing
            loss = model(**batch).loss * weight
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            steps, rows = steps + 1, rows + int(weight) * len(batch["input_ids"])
            if steps % args.log_every == 0:
                accelerator.print(f"step {steps}: loss {loss.item():.4f} (main process)", flush=True)
            if steps == args.max_steps:
                break
        if steps == args.max_steps:
            break
    print(f"rank {accelerator.process_index}/{accelerator.num_processes}: {steps} steps, {rows:,} rows")
    # resume: torch.save(loader.state_dict(), f"loader_{accelerator.process_index}.pt") next to accelerator.save_state()


if __name__ == "__main__":
    main()
    gc.collect()  # free the prepared DDP model (it holds the process group) before the group is destroyed
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
