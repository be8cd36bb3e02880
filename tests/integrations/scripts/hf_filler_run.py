"""Under torchrun x2: padpipe.hf.Trainer over one training row, so one rank trains on equal steps' filler each epoch.

``main(DATA, OUT)``, run by hf_ddp_run.py (DATA: an MRPC folder of one training row). Each rank writes
``OUT/rank<R>.json``: the loss ``compute_loss`` returned at each step (a filler's must be 0), whether each
step's batch was a filler, and the train metrics.
tests/integrations/test_hf_trainer.py checks them.
"""

from __future__ import annotations

import json

import torch.distributed as dist
from transformers import TrainingArguments

import padpipe as pp
from padpipe.hf import Trainer
from padpipe.recipes.glue import glue
from tests.integrations.tiny import recording_bert


class Recording(Trainer):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.seen: list[tuple[bool, float]] = []

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        filler = bool(inputs.get("is_filler", False))
        loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        self.seen.append((filler, float(loss[0] if isinstance(loss, tuple) else loss)))
        return loss


def main(data: str, out: str) -> None:
    train = glue("mrpc", "train", pp.examples.tokenizer(), data=data, max_tokens=2048)
    args = TrainingArguments(
        f"{out}/run", num_train_epochs=2, save_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True, seed=0
    )
    trainer = Recording(model=recording_bert(), args=args, train_dataset=train)
    metrics = trainer.train().metrics
    with open(f"{out}/rank{dist.get_rank()}.json", "w") as f:
        json.dump({"seen": trainer.seen, "train_metrics": metrics}, f)
