"""Plain PyTorch DDP on padpipe batches: each rank reads its share, all ranks take equal steps.

    torchrun --standalone --nproc_per_node=2 examples/train_ddp.py [PARQUET]    # or: python examples/train_ddp.py

Trains a tiny BERT for two epochs on MRPC-style Parquet files (default: the shipped sample, 20,000
sentence pairs) and prints the steps and rows of every rank and epoch. To resume mid-epoch, save each
rank's ``loader.state_dict()`` with the model and ``loader.load_state_dict(state)`` on restart.
"""

from __future__ import annotations

import gc
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from transformers import BertConfig, BertForSequenceClassification

import padpipe as pp


def main() -> None:
    distributed = "WORLD_SIZE" in os.environ  # set by torchrun
    if distributed:
        dist.init_process_group("gloo")  # "nccl" on GPUs
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)

    pipe = (pp.read_parquet(sys.argv[1] if len(sys.argv) > 1 else pp.examples.SAMPLE_PARQUET)
              .shuffle(buffer_size=2000, seed=0)
              .tokenize(pp.examples.tokenizer(), fields=("sentence1", "sentence2"), max_length=128)
              .bucket(max_tokens=8192)
              .pad(pad_to_multiple_of=8))
    loader = pipe.loader(num_workers=2)  # this rank's share, tokenized in 2 worker processes

    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(vocab_size=8000, hidden_size=32, num_hidden_layers=2,
                                                     num_attention_heads=2, intermediate_size=64))
    if distributed:
        model = DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    for epoch in range(2):  # each pass over the loader is the next epoch, reshuffled
        steps = rows = 0
        for batch in loader:  # the same number of steps on every rank: DDP never waits on a finished rank
            batch.pop("idx")
            model(**batch).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            steps, rows = steps + 1, rows + len(batch["input_ids"])
        print(f"rank {rank}/{world} epoch {epoch}: {steps} steps, {rows:,} rows")


if __name__ == "__main__":
    main()
    gc.collect()  # free the DDP model (it holds the process group) before the group is destroyed
    if dist.is_initialized():
        dist.destroy_process_group()
