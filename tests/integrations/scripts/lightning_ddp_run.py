"""Under torchrun x2: the Lightning DDP runs of this folder one after another in one launch (process start and the
lightning and transformers imports paid once, as tests/dist_scripts/workloads_run.py does for the runtime's).

Usage: ``torchrun --standalone --nproc_per_node=2 lightning_ddp_run.py DATA OUT``:

1. ``lightning_bare_run.py`` on a bare ``pipe.loader()`` with 0 and then 2 workers: writes
   ``OUT/bare<W>/rank<R>.json`` (its checkpoints in ``OUT/bare<W>/checkpoints``);
2. ``lightning_run.py`` on ``LightningLoader(pipe.loader(num_workers=2))``: writes ``OUT/loader/rank<R>.json``;
3. without ``ExactResume``, fits that refuse at their first batch (:func:`fail_fast`): ``OUT/fail_fast/rank<R>.json``.

Each run builds its own modules and Trainers; tests/integrations/test_lightning_ddp.py checks them.
"""

from __future__ import annotations

import json
import os
import sys

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

import padpipe as pp
from padpipe.recipes.glue import glue
from tests.integrations.scripts import lightning_bare_run, lightning_run
from tests.integrations.tiny import finish


def fail_fast(data: str, out: str) -> None:
    """Fits without ``ExactResume`` that will save the loader: Lightning's default checkpointing and a ``ModelCheckpoint``
    every 12 steps on a bare ``pipe.loader()``, and a ``LightningLoader``. Each rank records each fit's error and the
    training steps it ran."""
    pipe = glue("mrpc", "train", pp.examples.tokenizer(), data=data, max_tokens=2048)
    explicit = ModelCheckpoint(dirpath=f"{out}/checkpoints", every_n_train_steps=lightning_bare_run.SAVE_EVERY)
    fits = {
        "default": (lightning_bare_run.Bare(pipe, 0), {}),
        "every_n_train_steps": (lightning_bare_run.Bare(pipe, 0), {"callbacks": [explicit]}),
        "lightning_loader": (lightning_run.Classifier(pipe, 0), {}),
    }
    records = {}
    for name, (model, options) in fits.items():
        fit = L.Trainer(
            accelerator="cpu", devices=2, strategy="ddp", max_epochs=1, logger=False, default_root_dir=out, **options
        )
        try:
            fit.fit(model)
            error = "no error"
        except RuntimeError as exc:
            error = str(exc)
        records[name] = {"error": error, "steps": len(model.steps), "global_step": fit.global_step}
    with open(f"{out}/rank{torch.distributed.get_rank()}.json", "w") as f:
        json.dump(records, f)


def main(data: str, out: str) -> None:
    for name in ("bare0", "bare2", "loader", "fail_fast"):
        os.makedirs(f"{out}/{name}", exist_ok=True)
    for workers in (0, 2):
        lightning_bare_run.main(data, f"{out}/bare{workers}", workers)
    lightning_run.main(data, f"{out}/loader", 2)
    fail_fast(data, f"{out}/fail_fast")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
    finish()
