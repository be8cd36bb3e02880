"""Under torchrun x2: Lightning DDP on ``pipe.loader(num_workers=W)`` with ``ExactResume``, resumed two ways.

``main(DATA, OUT, WORKERS)``, run by lightning_ddp_run.py. Four fits, each
with Lightning's default ``training_step(batch, batch_idx)`` and ``weights_only``:

1. ``full``: two epochs, a ``ModelCheckpoint`` every 12 steps;
2. ``resumed``: from the step-12 checkpoint (inside epoch 0) to the end of epoch 1;
3. ``stopped``: ``max_steps=12``, then ``trainer.save_checkpoint`` (Lightning counts epoch 0 as done);
4. ``after``: from that checkpoint to the end of epoch 1.

Each rank writes ``OUT/rank<R>.json``: every training step (epoch, row ids, batch fingerprint) of each fit.
tests/integrations/test_lightning_ddp.py checks them.
"""

from __future__ import annotations

import json

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

import padpipe as pp
from padpipe.integrations.lightning import ExactResume
from padpipe.recipes.glue import glue
from tests.integrations.scripts.lightning_run import Classifier

SAVE_EVERY = STOP_AT = 12


class Bare(Classifier):
    def train_dataloader(self):
        return self.pipe.loader(num_workers=self.workers)


def trainer(out: str, *callbacks: L.Callback, **limits: int) -> L.Trainer:
    return L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=bool(callbacks),
        default_root_dir=out,
        callbacks=[ExactResume(), *callbacks],
        **limits,
    )


def main(data: str, out: str, workers: int) -> None:
    pipe = glue("mrpc", "train", pp.examples.tokenizer(), data=data, max_tokens=2048)
    fits = {name: Bare(pipe, workers) for name in ("full", "resumed", "stopped", "after")}
    checkpoints = ModelCheckpoint(
        dirpath=f"{out}/checkpoints", filename="{step}", every_n_train_steps=SAVE_EVERY, save_top_k=-1
    )
    trainer(f"{out}/full", checkpoints, max_epochs=2).fit(fits["full"])
    trainer(f"{out}/resumed", max_epochs=2).fit(fits["resumed"], ckpt_path=f"{out}/checkpoints/step={SAVE_EVERY}.ckpt")
    stopped = trainer(f"{out}/stopped", max_steps=STOP_AT)
    stopped.fit(fits["stopped"])
    stopped.save_checkpoint(f"{out}/stopped.ckpt")  # on every rank, as Lightning asks
    trainer(f"{out}/after", max_epochs=2).fit(fits["after"], ckpt_path=f"{out}/stopped.ckpt")
    with open(f"{out}/rank{torch.distributed.get_rank()}.json", "w") as f:
        json.dump({name: fit.steps for name, fit in fits.items()}, f)
