"""Under torchrun: a framework run checkpointed on one number of ranks resumes on another.

Usage: ``torchrun --standalone --nproc_per_node=N elastic_frameworks_run.py PHASE DATA OUT WORKERS FRAMEWORKS``
with PHASE ``save`` (train ``SAVE_AT`` steps and checkpoint there) or ``resume`` (resume from that
checkpoint and train past the end of its epoch) and FRAMEWORKS a comma-separated list of ``hf``
(``padpipe.hf.Trainer``) and ``lightning`` (``LightningLoader`` + ``ExactResume``), run one after the other
in the same processes (imports and process start paid once a launch). Each rank writes
``OUT/<FRAMEWORK>-<PHASE>-rank<R>.json``: every training step's epoch and row ids.
tests/integrations/test_elastic_frameworks.py checks that the saved epoch has every row once.
"""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist

import padpipe as pp
from padpipe.recipes.glue import glue
from tests.integrations.tiny import bert_config, finish, recording_bert

SAVE_AT, MORE = 6, 16  # steps before the checkpoint; after it: the saved epoch's last 12 on 3 ranks, 4 of the next


def run_hf(pipe: pp.Pipeline, phase: str, out: str, workers: int) -> list[dict]:
    from transformers import TrainerCallback, TrainingArguments

    from padpipe.hf import Trainer

    class Epochs(TrainerCallback):
        def on_epoch_begin(self, args, state, control, model=None, **kwargs):
            model.epoch += 1

    model = recording_bert()
    model.epoch = -1
    steps = SAVE_AT if phase == "save" else SAVE_AT + MORE
    args = TrainingArguments(
        f"{out}/hf",
        max_steps=steps,
        save_steps=SAVE_AT,
        learning_rate=1e-3,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        dataloader_num_workers=workers,
        seed=0,
    )
    trainer = Trainer(model=model, args=args, train_dataset=pipe, callbacks=[Epochs()])
    trainer.train(resume_from_checkpoint=f"{out}/hf/checkpoint-{SAVE_AT}" if phase == "resume" else None)
    return [{"epoch": s["epoch"], "idx": s["idx"]} for s in model.steps]


def run_lightning(pipe: pp.Pipeline, phase: str, out: str, workers: int) -> list[dict]:
    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint
    from transformers import BertForSequenceClassification

    from padpipe.integrations.lightning import ExactResume, LightningLoader

    class Classifier(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.model = BertForSequenceClassification(bert_config())
            self.steps: list[dict] = []

        def train_dataloader(self) -> LightningLoader:
            return LightningLoader(pipe.loader(num_workers=workers))

        def training_step(self, batch, batch_idx):
            self.steps.append({"epoch": self.current_epoch, "idx": batch.pop("idx").tolist()})
            return self.model(**batch).loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    checkpoints = ModelCheckpoint(
        dirpath=f"{out}/lightning", filename="{step}", every_n_train_steps=SAVE_AT, save_top_k=-1
    )
    trainer = L.Trainer(
        accelerator="cpu",
        devices=dist.get_world_size(),
        strategy="ddp",
        logger=False,
        max_steps=SAVE_AT if phase == "save" else SAVE_AT + MORE,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=out,
        callbacks=[ExactResume(), checkpoints],
    )
    module = Classifier()
    trainer.fit(module, ckpt_path=f"{out}/lightning/step={SAVE_AT}.ckpt" if phase == "resume" else None)
    return module.steps


def main(phase: str, data: str, out: str, workers: int, frameworks: list[str]) -> None:
    dist.init_process_group("gloo")
    pipe = glue("mrpc", "train", pp.examples.tokenizer(), data=data, max_tokens=2048)
    for framework in frameworks:
        run = run_hf if framework == "hf" else run_lightning
        steps = run(pipe, phase, out, workers)
        with open(f"{out}/{framework}-{phase}-rank{dist.get_rank()}.json", "w") as f:
            json.dump(steps, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5].split(","))
    finish()
