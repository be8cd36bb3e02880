"""Under torchrun x2: padpipe.hf.Trainer trains past two epochs, checkpoints, resumes, evaluates, predicts.

``main(DATA, OUT, WORKERS)``, run by hf_ddp_run.py (WORKERS is ``dataloader_num_workers``). Each rank writes
``OUT/rank<R>.json``: the rows and batch fingerprints of every training step and the logged losses of
the full run and of a run resumed from its step-30 checkpoint, the metrics, and predictions with a
reference computed here.
tests/integrations/test_hf_trainer.py checks them.
"""

from __future__ import annotations

import json

import numpy as np
import torch
import torch.distributed as dist
from transformers import TrainerCallback, TrainingArguments

import padpipe as pp
from padpipe.hf import Trainer
from padpipe.recipes.glue import glue
from tests.integrations.tiny import recording_bert

MAX_STEPS, SAVE_STEPS, RESUME_AT = 60, 15, 30


class Epochs(TrainerCallback):
    def on_epoch_begin(self, args, state, control, model=None, **kwargs):
        model.epoch += 1


def arguments(out: str, workers: int, **options) -> TrainingArguments:
    return TrainingArguments(
        out,
        max_steps=MAX_STEPS,
        save_steps=SAVE_STEPS,
        logging_steps=10,
        learning_rate=1e-3,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        dataloader_num_workers=workers,
        seed=0,
        **options,
    )


def accuracy(p) -> dict:
    return {"accuracy": float((p.predictions.argmax(-1) == p.label_ids).mean())}


def reference(model, val: pp.Pipeline) -> list:
    """Logits of every validation row by a plain loop over the whole split, in row order."""
    logits = {}
    model.eval()
    with torch.no_grad():
        for batch in val.loader(consumer=pp.Consumer(), equal_steps="off"):
            out = model(
                input_ids=batch["input_ids"],
                attention_mask=batch["attention_mask"],
                token_type_ids=batch["token_type_ids"],
            ).logits
            logits.update(zip(batch["row_index"].tolist(), out.tolist()))
    return [logits[i] for i in range(len(logits))]


def main(data: str, out: str, workers: int) -> None:
    tok = pp.examples.tokenizer()
    train = glue("mrpc", "train", tok, data=data, max_tokens=2048)
    val = glue("mrpc", "validation", tok, data=data, batch_size=30)  # 151 and 150 rows: ranks take 6 and 5 steps

    model = recording_bert()
    model.epoch = -1
    during = arguments(f"{out}/run", workers, eval_strategy="steps", eval_steps=25)  # evaluates inside train()
    trainer = Trainer(
        model=model, args=during, train_dataset=train, eval_dataset=val, compute_metrics=accuracy, callbacks=[Epochs()]
    )
    train_metrics = trainer.train().metrics
    dropped = trainer._padpipe_train.loader.stats().skipped.get("equal_steps.dropped_batches", 0)
    eval_metrics = trainer.evaluate()
    prediction = trainer.predict(val)
    expected = reference(model, val)
    eval_steps = sum(1 for _ in val.loader(equal_steps="off"))  # this rank's share, as evaluate() reads it

    resumed_model = recording_bert(seed=1)
    resumed_model.epoch = -1
    resumed = Trainer(
        model=resumed_model, args=arguments(f"{out}/resumed", workers), train_dataset=train, callbacks=[Epochs()]
    )
    resumed.train(resume_from_checkpoint=f"{out}/run/checkpoint-{RESUME_AT}")
    losses = [[(e["step"], e["loss"]) for e in t.state.log_history if "loss" in e] for t in (trainer, resumed)]

    with open(f"{out}/rank{dist.get_rank()}.json", "w") as f:
        json.dump(
            {
                "steps": model.steps,
                "resumed_steps": resumed_model.steps,
                "dropped": dropped,
                "eval_steps": eval_steps,
                "losses": losses[0],
                "resumed_losses": losses[1],
                "train_metrics": train_metrics,
                "eval_metrics": eval_metrics,
                "test_metrics": prediction.metrics,
                "predictions": np.asarray(prediction.predictions).tolist(),
                "reference": expected,
                "label_ids": np.asarray(prediction.label_ids).tolist(),
            },
            f,
        )
