"""Under torchrun x2: Lightning DDP trains two epochs on ``LightningLoader(pipe.loader(...))``, then resumes.

``main(DATA, OUT, WORKERS)``, run by lightning_ddp_run.py (``Classifier`` also serves the one-device tests).
The first fit saves a checkpoint every 10 steps; a second fit resumes from step 30 (inside the second epoch)
with Lightning's default ``training_step(batch, batch_idx)``. Each rank writes ``OUT/rank<R>.json``: every
training step (epoch, row ids, batch fingerprint) of both fits. tests/integrations/test_lightning_ddp.py checks them.
"""

from __future__ import annotations

import json

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from transformers import BertForSequenceClassification

import padpipe as pp
from padpipe.integrations.lightning import ExactResume, LightningLoader
from padpipe.recipes.glue import glue
from tests.integrations.tiny import bert_config, digest

SAVE_EVERY, RESUME_AT = 10, 30


class Classifier(L.LightningModule):
    def __init__(self, pipe: pp.Pipeline, workers: int) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.pipe, self.workers = pipe, workers
        self.model = BertForSequenceClassification(bert_config())
        self.steps: list[dict] = []

    def train_dataloader(self) -> LightningLoader:
        return LightningLoader(self.pipe.loader(num_workers=self.workers))

    def training_step(self, batch, batch_idx):
        idx = batch.pop("idx")
        self.steps.append(
            {
                "epoch": self.current_epoch,
                "idx": idx.tolist(),
                "batch": digest(batch["input_ids"], batch["attention_mask"]),
            }
        )
        return self.model(**batch).loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def trainer(out: str) -> L.Trainer:
    checkpoints = ModelCheckpoint(
        dirpath=f"{out}/checkpoints", filename="{step}", every_n_train_steps=SAVE_EVERY, save_top_k=-1
    )
    return L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_epochs=2,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=out,
        callbacks=[ExactResume(), checkpoints],
    )


def main(data: str, out: str, workers: int) -> None:
    pipe = glue("mrpc", "train", pp.examples.tokenizer(), data=data, max_tokens=2048)
    full = Classifier(pipe, workers)
    trainer(f"{out}/full").fit(full)
    resumed = Classifier(pipe, workers)
    # Lightning's default weights_only: the checkpoint's loader states are plain data
    checkpoint = f"{out}/full/checkpoints/step={RESUME_AT}.ckpt"
    trainer(f"{out}/resumed").fit(resumed, ckpt_path=checkpoint)
    with open(f"{out}/rank{torch.distributed.get_rank()}.json", "w") as f:
        json.dump({"steps": full.steps, "resumed_steps": resumed.steps}, f)
