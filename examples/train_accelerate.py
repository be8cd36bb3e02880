"""Accelerate on padpipe batches: ``accelerator.prepare(model, optimizer, pipe.loader(...))``.

    torchrun --standalone --nproc_per_node=2 examples/train_accelerate.py [PARQUET]   # or: accelerate launch ...
    python examples/train_accelerate.py

Accelerate passes padpipe's loader through untouched: padpipe shards the data by rank and worker and
keeps steps equal across ranks. (``prepare(DataLoader(pipe))`` would shard it a second time; padpipe
raises an error saying so.) Trains a tiny BERT for one epoch on MRPC-style Parquet files (default: the
shipped sample) and prints each rank's steps and rows.
"""

from __future__ import annotations

import gc
import sys

import torch
from accelerate import Accelerator
from transformers import BertConfig, BertForSequenceClassification

import padpipe as pp


def main() -> None:
    accelerator = Accelerator()
    pipe = (pp.read_parquet(sys.argv[1] if len(sys.argv) > 1 else pp.examples.SAMPLE_PARQUET)
              .shuffle(buffer_size=2000, seed=0)
              .tokenize(pp.examples.tokenizer(), fields=("sentence1", "sentence2"), max_length=128)
              .bucket(max_tokens=8192)
              .pad(pad_to_multiple_of=8))  # add .to_cuda() to copy batches to the GPU ahead of use
    model = BertForSequenceClassification(BertConfig(vocab_size=8000, hidden_size=32, num_hidden_layers=2,
                                                     num_attention_heads=2, intermediate_size=64))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer, loader = accelerator.prepare(model, optimizer, pipe.loader(num_workers=2))

    steps = rows = 0
    for batch in loader:
        batch.pop("idx")
        accelerator.backward(model(**batch).loss)
        optimizer.step()
        optimizer.zero_grad()
        steps, rows = steps + 1, rows + len(batch["input_ids"])
    print(f"rank {accelerator.process_index}/{accelerator.num_processes}: {steps} steps, {rows:,} rows")
    # resume: torch.save(loader.state_dict(), f"loader_{accelerator.process_index}.pt") next to accelerator.save_state()


if __name__ == "__main__":
    main()
    gc.collect()  # free the prepared DDP model (it holds the process group) before the group is destroyed
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
