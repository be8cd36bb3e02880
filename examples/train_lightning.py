"""Lightning on padpipe batches: DDP, equal steps, and an exact resume with the default training loop.

    torchrun --standalone --nproc_per_node=2 examples/train_lightning.py [PARQUET [OUTPUT_DIR]] [--epochs N]
    python examples/train_lightning.py                               # one process; --max-steps N and --log-every N too

Needs Lightning and ``transformers``: ``pip install 'padpipe[hf,lightning]'``. PARQUET: MRPC-style files
(default: the shipped sample). ``train_dataloader()`` returns ``pipe.loader(...)`` and the ``ExactResume()``
callback makes its state in Lightning's checkpoints every rank's position after the batches trained, so a run
resumed from a mid-epoch checkpoint continues with exactly the next batch.
Trains a tiny BERT for ``--epochs`` epochs (default: two) with a checkpoint every 50 steps in
OUTPUT_DIR (default ``runs/lightning``), printing the loss every ``--log-every`` steps (rank 0);
rerun with the same OUTPUT_DIR to resume from the last one.
"""

from __future__ import annotations

import argparse
import gc
import os

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from transformers import BertConfig, BertForSequenceClassification

import padpipe as pp
from padpipe.integrations.lightning import ExactResume


class Classifier(L.LightningModule):
    def __init__(self, pipe: pp.Pipeline, log_every: int) -> None:
        super().__init__()
        self.pipe, self.log_every = pipe, log_every
        self.model = BertForSequenceClassification(
            BertConfig(
                vocab_size=8000, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64
            )
        )

    def train_dataloader(self) -> pp.PipelineLoader:
        return self.pipe.loader(num_workers=2)  # with ExactResume(), Lightning's checkpoints resume it exactly

    def training_step(self, batch, batch_idx):
        batch.pop("idx")
        weight = pp.loss_weight(batch)  # 0.0 for equal steps' filler (its mark popped): it trains nothing
        loss = self.model(**batch).loss * weight
        self.log("loss", loss, prog_bar=True)
        if self.trainer.is_global_zero and (self.global_step + 1) % self.log_every == 0:
            print(
                f"epoch {self.current_epoch} step {self.global_step + 1}: loss {loss.item():.4f} (rank 0)", flush=True
            )
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Lightning on padpipe batches.")
    parser.add_argument(
        "data",
        nargs="?",
        default=pp.examples.SAMPLE_PARQUET,
        help="MRPC-style Parquet file(s), folder or glob (default: the shipped sample)",
    )
    parser.add_argument("output_dir", nargs="?", default="runs/lightning", help="checkpoints (default: runs/lightning)")
    parser.add_argument("--epochs", type=int, default=2, help="passes over the data (default: 2)")
    parser.add_argument("--max-steps", type=int, default=-1, help="stop after N steps (default: --epochs epochs)")
    parser.add_argument("--log-every", type=int, default=50, help="print the loss every N steps (default: 50)")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    pipe = (
        pp.read_parquet(args.data)
        .shuffle(buffer_size=2000, seed=0)
        .tokenize(pp.examples.tokenizer(), fields=("sentence1", "sentence2"), max_length=128)
        .bucket(max_tokens=8192)
        .pad(pad_to_multiple_of=8)
    )
    output_dir = args.output_dir
    devices = int(os.environ.get("WORLD_SIZE", 1))  # torchrun sets it; Lightning joins torchrun's processes
    checkpoints = ModelCheckpoint(dirpath=output_dir, filename="{step}", every_n_train_steps=50, save_last=True)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=devices,
        strategy="ddp" if devices > 1 else "auto",
        max_epochs=args.epochs,
        max_steps=args.max_steps,
        callbacks=[ExactResume(), checkpoints],
        logger=False,
        enable_progress_bar=False,
    )
    last = os.path.join(output_dir, "last.ckpt")
    trainer.fit(Classifier(pipe, args.log_every), ckpt_path=last if os.path.exists(last) else None)
    rank = f"rank {trainer.global_rank}/{trainer.world_size}"
    print(f"{rank}: {trainer.global_step} steps, {trainer.current_epoch} epochs")


if __name__ == "__main__":
    main()
    gc.collect()  # free the DDP model (it holds the process group) before the group is destroyed
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
