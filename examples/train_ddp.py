"""Plain PyTorch DDP on padpipe batches: each rank reads its share, all ranks take equal steps.

    torchrun --standalone --nproc_per_node=2 examples/train_ddp.py [PARQUET] [--epochs N] [--max-steps N]
    python examples/train_ddp.py                                     # one process; --log-every N too

Needs ``transformers`` for the model: ``pip install 'padpipe[hf]'``. Trains a tiny BERT for ``--epochs``
epochs (default: two) on MRPC-style Parquet files (default: the shipped sample, 20,000 sentence
pairs), prints the loss every ``--log-every`` steps and, after each epoch, the steps and rows of
every rank (rank 0 prints them all, so lines never interleave). To resume mid-epoch, save each rank's
``loader.state_dict()`` with the model and ``loader.load_state_dict(state)`` on restart.
"""

from __future__ import annotations

import argparse
import gc
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from transformers import BertConfig, BertForSequenceClassification

import padpipe as pp


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Plain PyTorch DDP on padpipe batches.")
    parser.add_argument(
        "data",
        nargs="?",
        default=pp.examples.SAMPLE_PARQUET,
        help="MRPC-style Parquet file(s), folder or glob (default: the shipped sample)",
    )
    parser.add_argument("--epochs", type=int, default=2, help="passes over the data (default: 2)")
    parser.add_argument("--max-steps", type=int, help="stop after N steps in all (default: --epochs epochs)")
    parser.add_argument("--log-every", type=int, default=50, help="print the loss every N steps (default: 50)")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    distributed = "WORLD_SIZE" in os.environ  # set by torchrun
    if distributed:
        dist.init_process_group("gloo")  # "nccl" on GPUs
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)

    pipe = (
        pp.read_parquet(args.data)
        .shuffle(buffer_size=2000, seed=0)
        .tokenize(pp.examples.tokenizer(), fields=("sentence1", "sentence2"), max_length=128)
        .bucket(max_tokens=8192)
        .pad(pad_to_multiple_of=8)
    )
    loader = pipe.loader(num_workers=2)  # this rank's share, tokenized in 2 worker processes

    torch.manual_seed(0)
    model = BertForSequenceClassification(
        BertConfig(vocab_size=8000, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
    )
    if distributed:
        model = DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    total = 0
    for epoch in range(args.epochs):  # each pass over the loader is the next epoch, reshuffled
        steps = rows = 0
        for batch in loader:  # the same number of steps on every rank: DDP never waits on a finished rank
            batch.pop("idx")
            weight = pp.loss_weight(batch)  # 0.0 for equal steps' filler (its mark popped): it trains nothing
            loss = model(**batch).loss * weight
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            steps, rows, total = steps + 1, rows + int(weight) * len(batch["input_ids"]), total + 1
            if rank == 0 and total % args.log_every == 0:
                print(f"epoch {epoch} step {steps}: loss {loss.item():.4f} (rank 0)", flush=True)
            if total == args.max_steps:
                break
        counts = [(steps, rows)] * world
        if distributed:
            dist.all_gather_object(counts, (steps, rows))
        if rank == 0:
            for r, (n, m) in enumerate(counts):
                print(f"rank {r}/{world} epoch {epoch}: {n} steps, {m:,} rows", flush=True)
        if total == args.max_steps:
            break


if __name__ == "__main__":
    main()
    gc.collect()  # free the DDP model (it holds the process group) before the group is destroyed
    if dist.is_initialized():
        dist.destroy_process_group()
