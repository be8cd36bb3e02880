"""Every transformers.Trainer method padpipe.hf.Trainer overrides is pinned: its parameters, and the role padpipe
relies on (each failure names the hook); test_hf_hooks.py pins the training-loop hooks' roles."""

from __future__ import annotations

import inspect
import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from padpipe.hf import Trainer  # noqa: E402
from padpipe.integrations.hf_hooks import HOOKS, OVERRIDDEN  # noqa: E402
from tests.integrations.tiny import packed, tiny_llama  # noqa: E402

pytestmark = pytest.mark.timeout(300)
PASSED_THROUGH = {"__init__"}  # Trainer(*args, **kwargs): whatever transformers takes


def arguments(out, **changes) -> transformers.TrainingArguments:
    options = dict(report_to=[], use_cpu=True, disable_tqdm=True, save_strategy="no", logging_steps=100, seed=0)
    return transformers.TrainingArguments(str(out), **{**options, **changes})


def test_every_override_is_in_the_hook_table():
    overrides = {
        name
        for name, value in vars(Trainer).items()
        if callable(value) and hasattr(transformers.Trainer, name) and name not in PASSED_THROUGH
    }
    assert overrides == OVERRIDDEN, "padpipe.hf.Trainer's overrides and hf_hooks.OVERRIDDEN differ"
    assert OVERRIDDEN <= set(HOOKS), f"overrides missing from hf_hooks.HOOKS: {sorted(OVERRIDDEN - set(HOOKS))}"


@pytest.mark.parametrize("hook", sorted(OVERRIDDEN))
def test_each_override_takes_the_parameters_of_the_hook_it_overrides(hook):
    ours = tuple(inspect.signature(vars(Trainer)[hook]).parameters)[1:]
    assert ours in (HOOKS[hook], ("kwargs",)), f"padpipe.hf.Trainer.{hook}{ours} does not match HOOKS: {HOOKS[hook]}"
    theirs = tuple(inspect.signature(getattr(transformers.Trainer, hook)).parameters)[1:]
    assert theirs == HOOKS[hook], f"transformers.Trainer.{hook} changed its parameters: {theirs}"


def test_validate_args_is_where_an_iterable_dataset_is_asked_for_max_steps(tmp_path):
    class Rows(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter([])

    with pytest.raises(ValueError, match="does not implement __len__"):
        transformers.Trainer(model=tiny_llama(), args=arguments(tmp_path), train_dataset=Rows())

    class Unchecked(transformers.Trainer):
        def _validate_args(self):
            pass

    Unchecked(model=tiny_llama(), args=arguments(tmp_path), train_dataset=Rows())  # else padpipe's bypass is moot


def test_set_initial_training_values_plans_epochs_from_a_loader_length(tmp_path):
    """padpipe's training batches get a length (the counted first epoch): HF plans the epochs on it."""

    class Sized(list):
        pass

    trainer = transformers.Trainer(model=tiny_llama(), args=arguments(tmp_path))
    args = arguments(tmp_path, num_train_epochs=3, gradient_accumulation_steps=2)
    epochs, per_epoch, _, _, _, in_epoch, max_steps = trainer.set_initial_training_values(args, Sized(range(7)))
    assert (epochs, per_epoch, in_epoch, max_steps) == (3, 4, 7, 12), (
        "transformers.Trainer.set_initial_training_values no longer plans "
        "max_steps = epochs * ceil(len / gradient_accumulation_steps) for a loader with a length"
    )


def test_epoch_hooks_schedule_end_each_epoch_with_its_data_and_refine_before_the_epoch_checkpoint(tmp_path):
    """``create_scheduler`` gets the planned steps; a pass's end (an empty ``get_batch_samples``) ends
    ``_run_epoch``; ``on_epoch_end`` runs before the epoch's ``_save_checkpoint``; the loaders are padpipe's."""
    events: list = []

    class Spy(Trainer):
        def get_train_dataloader(self):
            events.append("get_train_dataloader")
            return super().get_train_dataloader()

        def create_scheduler(self, num_training_steps, optimizer=None):
            events.append(("create_scheduler", self._epochs.total))
            return super().create_scheduler(num_training_steps, optimizer)

        def get_batch_samples(self, epoch_iterator, num_batches, device):
            batches, items = super().get_batch_samples(epoch_iterator, num_batches, device)
            events.append(("window", len(batches)))
            return batches, items

        def _save_checkpoint(self, model, trial):
            events.append("save")
            super()._save_checkpoint(model, trial)

    class Ends(transformers.TrainerCallback):
        def on_epoch_end(self, args, state, control, **kwargs):
            events.append("epoch_end")

    args = arguments(tmp_path, num_train_epochs=2, gradient_accumulation_steps=2, save_strategy="epoch")
    trainer = Spy(model=tiny_llama(), args=args, train_dataset=packed(6), callbacks=[Ends()])  # 3 batches a pass
    trainer.train()
    first = [("window", 2), ("window", 1), ("window", 0), "epoch_end", "save"]  # the data ends it
    last = [("window", 2), ("window", 1), "epoch_end", "save"]  # max_steps ends it: the pass ended at its last step
    assert events == ["get_train_dataloader", ("create_scheduler", 4), *first, *last], (
        "transformers.Trainer: get_train_dataloader, create_scheduler(max_steps), _run_epoch's end at an empty "
        "get_batch_samples (control.should_epoch_stop) or on_epoch_end before _save_checkpoint changed"
    )


def test_the_loader_hooks_give_evaluate_and_predict_their_batches(tmp_path):
    called = []

    class Spy(Trainer):
        def get_eval_dataloader(self, eval_dataset=None):
            called.append("get_eval_dataloader")
            return super().get_eval_dataloader(eval_dataset)

        def get_test_dataloader(self, test_dataset):
            called.append("get_test_dataloader")
            return super().get_test_dataloader(test_dataset)

    trainer = Spy(model=tiny_llama(), args=arguments(tmp_path), eval_dataset=packed(6))
    trainer.evaluate()
    with pytest.warns(UserWarning, match="no `row_index` column"):
        trainer.predict(packed(6))
    assert called == ["get_eval_dataloader", "get_test_dataloader"], (
        "transformers.Trainer.evaluate/predict no longer read their batches through get_eval_dataloader/"
        "get_test_dataloader"
    )


def test_training_step_passes_a_filler_mark_to_compute_loss_which_zeroes_its_loss(tmp_path):
    """Equal steps' filler (one real row, marked) must train nothing: HF's training_step hands the marked batch to
    compute_loss, whose loss padpipe multiplies by 0 (a finite loss, so no NaN reaches DDP's all-reduce)."""
    trainer = Trainer(model=tiny_llama(), args=arguments(tmp_path), train_dataset=packed(6))
    batch = next(iter(packed(6).loader()))
    model, trainer.current_gradient_accumulation_steps = trainer.model, 1  # set by train() for each window
    real = trainer.training_step(model, dict(batch))
    assert float(real) > 0 and any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
    model.zero_grad()
    zero = trainer.training_step(model, {**batch, "is_filler": torch.tensor(True)})
    assert float(zero) == 0.0
    assert all(p.grad is None or not p.grad.any() for p in model.parameters()), "a filler batch trained"
