"""``num_train_epochs`` for ``padpipe.hf.Trainer`` on a pipeline: steps per epoch counted, each epoch ended by the data.

With ``max_steps`` unset, the first epoch is read once before training to size the schedule; :class:`EpochPlan`
rebuilds it at each epoch's end and saves it in each checkpoint (docs/training.md, "Epochs").
"""

from __future__ import annotations

import json
import math
import os
import warnings
from typing import Any

from transformers import TrainerCallback
from transformers.trainer_utils import IntervalStrategy, SaveStrategy

from padpipe.integrations.hf_train import TrainBatches

PLAN_FILE = "padpipe_epochs.json"
"""The epoch plan in a Trainer checkpoint folder."""


def epochs_of(args: Any) -> int:
    """The whole number of epochs to train a pipeline for, or raise for a fraction.

    Example:
        >>> from types import SimpleNamespace
        >>> epochs_of(SimpleNamespace(num_train_epochs=2.0))
        2
        >>> epochs_of(SimpleNamespace(num_train_epochs=0.5))
        Traceback (most recent call last):
        ...
        ValueError: `num_train_epochs` must be a whole number of epochs to train a padpipe pipeline ...
    """
    epochs = args.num_train_epochs
    if epochs <= 0 or epochs != int(epochs):
        raise ValueError(
            "`num_train_epochs` must be a whole number of epochs to train a padpipe pipeline (each epoch ends "
            f"when its data ends), but is {epochs!r} instead: pass `max_steps` to train part of an epoch."
        )
    return int(epochs)


class EpochBatches(TrainBatches):
    """:class:`TrainBatches` with a length: the counted batches of the first epoch on this rank."""

    def __init__(self, *args: Any, length: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.length = length

    def __len__(self) -> int:
        return self.length


class EpochPlan(TrainerCallback):
    """The schedule's total optimizer steps for ``epochs`` epochs, refined at each epoch's end.

    Args:
        trainer: The ``padpipe.hf.Trainer`` (its ``lr_scheduler`` is rebuilt on a new total).
        epochs: Epochs to train.
        batches: Batches of the first epoch on this rank, counted before training.
    """

    def __init__(self, trainer: Any, epochs: int, batches: int) -> None:
        if batches == 0:
            raise ValueError(
                "`train_dataset` must make batches for num_train_epochs, but its first epoch, counted before "
                "training, made 0 batches instead: check that its source has rows."
            )
        self.trainer, self.epochs, self.counted = trainer, epochs, batches
        self.total = epochs * self.steps(batches, trainer.args.gradient_accumulation_steps)

    @staticmethod
    def steps(batches: int, accumulation: int) -> int:
        """Optimizer steps of an epoch of ``batches`` (the last window may be short), as HF counts a length.

        Example:
            >>> EpochPlan.steps(7, 2), EpochPlan.steps(0, 2)
            (4, 1)
        """
        return max(math.ceil(batches / accumulation), 1)

    def save(self, folder: str) -> None:
        with open(os.path.join(folder, PLAN_FILE), "w") as f:
            json.dump({"epochs": self.epochs, "total": self.total}, f)

    def load(self, folder: str) -> None:
        """The plan a checkpoint was saved with (none: the one counted, for a checkpoint of ``max_steps`` training)."""
        path = os.path.join(folder, PLAN_FILE)
        if os.path.isfile(path):
            with open(path) as f:
                self.total = int(json.load(f)["total"])

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Keep ``state.max_steps`` past the coming step unless it ends the last epoch: the data ends each epoch."""
        batches: EpochBatches = self.trainer._padpipe_train
        last = batches.epoch + 1 == self.epochs
        if state.global_step + 1 >= state.max_steps and not (last and batches.peek()):
            state.max_steps = state.global_step + 2

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Plan the epochs left on this epoch's steps and rebuild the schedule on a new total; after the last
        epoch, end training as HF does at ``max_steps`` (a final evaluation and checkpoint for ``"steps"``)."""
        batches: TrainBatches = self.trainer._padpipe_train
        if not batches.ended:  # training stopped inside the pass
            return
        made = batches.offset + batches.read
        if batches.epoch == 0 and made != self.counted:
            raise RuntimeError(
                f"The first epoch of `train_dataset` must make the {self.counted} batches counted before training "
                f"(num_train_epochs), but made {made} instead: its source gives other rows when read again (a "
                "generator, read once?). Pass a source that reads the same rows each time (a list, files) or max_steps."
            )
        left = self.epochs - (batches.epoch + 1)
        if left == 0:
            if state.global_step < state.max_steps:  # the last epoch ended before the planned steps
                state.max_steps = state.global_step
                end_training(args, state, control)
            return
        total = state.global_step + left * self.steps(made, args.gradient_accumulation_steps)
        state.max_steps = total
        if total != self.total:
            self.total = total
            rebuild_scheduler(self.trainer, total, state.global_step)


def end_training(args: Any, state: Any, control: Any) -> None:
    """What ``DefaultFlowCallback`` does at ``max_steps``: stop, evaluate and save for ``"steps"`` strategies
    (unless this step already did)."""
    control.should_training_stop = True
    step = state.global_step
    if args.eval_strategy == IntervalStrategy.STEPS and step % state.eval_steps and args.eval_delay <= step:
        control.should_evaluate = True
    if args.save_strategy == SaveStrategy.STEPS and not (state.save_steps > 0 and step % state.save_steps == 0):
        control.should_save = True


def rebuild_scheduler(trainer: Any, total: int, step: int) -> None:
    """Replace ``trainer.lr_scheduler`` by one built on ``total`` steps, set to ``step`` (that step's learning rate)."""
    trainer.lr_scheduler = None
    with warnings.catch_warnings():  # "lr_scheduler.step() before optimizer.step()": this step sets the position
        warnings.simplefilter("ignore", UserWarning)
        scheduler = trainer.create_scheduler(total, optimizer=trainer.optimizer)
        scheduler.last_epoch = step - 1
        scheduler.step()
    trainer.callback_handler.lr_scheduler = scheduler
