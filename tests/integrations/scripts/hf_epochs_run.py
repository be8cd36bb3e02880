"""Under torchrun x2: padpipe.hf.Trainer trains 2 epochs (num_train_epochs, gradient accumulation 2), resumes.

``main(DATA, OUT)``, run by hf_ddp_run.py. Each rank writes
``OUT/rank<R>.json``: its batches of the first epoch counted by a plain pass, the steps taken, the
rows of every training step, and a fingerprint of the final weights of the full run and of a run
resumed from a checkpoint inside the second epoch. tests/integrations/test_hf_trainer.py checks them.
"""

from __future__ import annotations

import json
import math

import torch.distributed as dist
from transformers import TrainerCallback, TrainingArguments

import padpipe as pp
from padpipe.hf import Trainer
from padpipe.recipes.glue import glue
from tests.integrations.tiny import digest, recording_bert


class Epochs(TrainerCallback):
    def on_epoch_begin(self, args, state, control, model=None, **kwargs):
        model.epoch += 1


def arguments(out: str, **options) -> TrainingArguments:
    return TrainingArguments(
        out,
        num_train_epochs=2,
        gradient_accumulation_steps=2,
        learning_rate=1e-3,
        logging_steps=1000,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        seed=0,
        **options,
    )


def main(data: str, out: str) -> None:
    train = glue("mrpc", "train", pp.examples.tokenizer(), data=data, max_tokens=2048)
    batches = sum(1 for _ in train.loader())  # this rank's first epoch (equal steps on both ranks)
    save = math.ceil(batches / 2) + 3  # inside the second epoch
    model = recording_bert()
    model.epoch = -1
    trainer = Trainer(
        model=model,
        args=arguments(f"{out}/run", save_strategy="steps", save_steps=save),
        train_dataset=train,
        callbacks=[Epochs()],
    )
    steps = trainer.train().global_step
    resumed_model = recording_bert(seed=1)
    resumed_model.epoch = 0  # Epochs() adds one as the resumed (second) epoch begins
    resumed = Trainer(model=resumed_model, args=arguments(f"{out}/resumed"), train_dataset=train, callbacks=[Epochs()])
    resumed.train(resume_from_checkpoint=f"{out}/run/checkpoint-{save}")
    with open(f"{out}/rank{dist.get_rank()}.json", "w") as f:
        json.dump(
            {
                "batches": batches,
                "global_step": steps,
                "max_steps": trainer.state.max_steps,
                "steps": model.steps,
                "resumed_steps": resumed_model.steps,
                "weights": digest(*model.state_dict().values()),
                "resumed_weights": digest(*resumed_model.state_dict().values()),
            },
            f,
        )
