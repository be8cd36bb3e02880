"""padpipe.hf.Trainer with num_train_epochs on a pipeline: steps counted, epochs ended by the data, exact resume.

Its DDP case (steps per rank, exact resume on two ranks) is in test_hf_trainer.py, whose one torchrun launch
runs every DDP case of the Trainer.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

import padpipe as pp  # noqa: E402
from padpipe.hf import Trainer  # noqa: E402
from padpipe.integrations.hf_epochs import PLAN_FILE  # noqa: E402
from padpipe.recipes.glue import glue  # noqa: E402
from tests.integrations.tiny import TRAIN_ROWS, recording_bert, texts, tiny_llama, write_mrpc  # noqa: E402

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def mrpc(tmp_path_factory) -> Path:
    return write_mrpc(tmp_path_factory.mktemp("hf") / "mrpc")


def arguments(out: Path, **changes) -> transformers.TrainingArguments:
    options = dict(
        num_train_epochs=1,
        learning_rate=1e-3,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        save_strategy="no",
        logging_steps=1000,
        seed=0,
    )
    return transformers.TrainingArguments(str(out), **{**options, **changes})


class Rates(transformers.TrainerCallback):
    """Each optimizer step's learning rate and the epoch it was taken in."""

    def __init__(self) -> None:
        self.steps: list[tuple[int, float]] = []

    def on_step_end(self, args, state, control, lr_scheduler=None, **kwargs):
        self.steps.append((state.global_step, lr_scheduler.get_last_lr()[0]))


class Epochs(transformers.TrainerCallback):
    def on_epoch_begin(self, args, state, control, model=None, **kwargs):
        model.epoch += 1


def recorder() -> torch.nn.Module:
    model = recording_bert()
    model.epoch = -1
    return model


def rows_by_epoch(model) -> dict[int, list[int]]:
    epochs: dict[int, list[int]] = {}
    for step in model.steps:
        epochs.setdefault(step["epoch"], []).extend(step["idx"])
    return epochs


def weights(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_num_train_epochs_counts_the_steps_trains_every_row_once_and_ends_the_schedule(mrpc, tmp_path):
    """Failed before in HF's own check: 'The train_dataset does not implement __len__ ... max_steps has to be specified'."""
    train = glue("mrpc", "train", pp.examples.tokenizer(), data=mrpc, max_tokens=4096)
    batches = sum(1 for _ in train.loader())
    model, rates = recorder(), Rates()
    trainer = Trainer(
        model=model,
        args=arguments(tmp_path, num_train_epochs=2, gradient_accumulation_steps=3),
        train_dataset=train,
        callbacks=[Epochs(), rates],
    )
    out = trainer.train()
    steps = math.ceil(batches / 3)  # optimizer steps per epoch: the last window of a pass is short
    assert out.global_step == trainer.state.max_steps == 2 * steps
    assert len(model.steps) == 2 * batches
    epochs = rows_by_epoch(model)
    assert sorted(epochs) == [0, 1] and all(sorted(rows) == list(range(TRAIN_ROWS)) for rows in epochs.values())
    assert epochs[0] != epochs[1]  # reshuffled
    assert [s for s, _ in rates.steps] == list(range(1, 2 * steps + 1))
    assert rates.steps[-1][1] == 0.0 and rates.steps[steps - 1][1] == pytest.approx(1e-3 / 2)  # linear decay
    assert out.metrics["epoch"] == 2 and out.metrics["train_samples"] == 2 * TRAIN_ROWS


def test_num_train_epochs_must_be_whole_for_a_pipeline(mrpc, tmp_path):
    train = glue("mrpc", "train", pp.examples.tokenizer(), data=mrpc, max_tokens=4096)
    with pytest.raises(
        ValueError,
        match=r"^`num_train_epochs` must be a whole number of epochs to train a padpipe pipeline \(each epoch ends "
        r"when its data ends\), but is 1\.5 instead: pass `max_steps` to train part of an epoch\.$",
    ):
        Trainer(model=recorder(), args=arguments(tmp_path, num_train_epochs=1.5), train_dataset=train)


@pytest.mark.parametrize("epochs", [1, 2])
def test_num_train_epochs_resumes_mid_epoch_with_every_row_once_and_the_same_weights(mrpc, tmp_path, epochs):
    train = glue("mrpc", "train", pp.examples.tokenizer(), data=mrpc, max_tokens=4096)
    batches = sum(1 for _ in train.loader())
    per_epoch = math.ceil(batches / 2)
    save = per_epoch * epochs - per_epoch // 2  # inside the last epoch
    full = recorder()
    Trainer(
        model=full,
        args=arguments(
            tmp_path / "run",
            num_train_epochs=epochs,
            gradient_accumulation_steps=2,
            save_strategy="steps",
            save_steps=save,
        ),
        train_dataset=train,
        callbacks=[Epochs()],
    ).train()
    checkpoint = tmp_path / "run" / f"checkpoint-{save}"
    assert (checkpoint / PLAN_FILE).is_file()
    resumed = recorder()
    resumed.epoch = epochs - 2  # Epochs() adds one as the resumed epoch begins
    out = Trainer(
        model=resumed,
        args=arguments(tmp_path / "resumed", num_train_epochs=epochs, gradient_accumulation_steps=2),
        train_dataset=train,
        callbacks=[Epochs()],
    ).train(resume_from_checkpoint=str(checkpoint))
    assert out.global_step == per_epoch * epochs
    done = (epochs - 1) * batches + 2 * (save - (epochs - 1) * per_epoch)  # batches trained before the checkpoint
    before = full.steps[:done]
    assert [(s["idx"], s["batch"]) for s in resumed.steps] == [(s["idx"], s["batch"]) for s in full.steps[done:]]
    last = [i for s in before + resumed.steps if s["epoch"] == epochs - 1 for i in s["idx"]]
    assert sorted(last) == list(range(TRAIN_ROWS))  # the last epoch: every row once across the resume
    for name, value in weights(full).items():
        assert torch.equal(value, resumed.state_dict()[name]), name


def uneven_packs() -> pp.Pipeline:
    """Documents packed one row of 96 per batch from a buffer of four: its epochs make 37, 36, then 37 batches."""
    return (
        pp.from_iterable(texts(20))
        .shuffle(64, seed=8)
        .tokenize(pp.examples.tokenizer())
        .pack(96, batch_size=1, buffer_size=4)
    )


def test_epochs_of_other_lengths_end_with_their_data_and_the_schedule_is_refined(tmp_path):
    loader = uneven_packs().loader()
    counts = [sum(1 for _ in loader) for _ in range(3)]
    assert counts == [37, 36, 37]  # the premise: a reshuffled epoch makes another number of batches
    rates = Rates()
    trainer = Trainer(model=tiny_llama(), args=arguments(tmp_path, num_train_epochs=3), train_dataset=uneven_packs())
    trainer.add_callback(rates)
    out = trainer.train()
    assert out.global_step == sum(counts) and trainer.state.max_steps == sum(counts)
    assert out.metrics["epoch"] == pytest.approx(3, abs=0.1)
    # planned on 3 x 37 = 111 steps; after epoch 1 (36 batches) on 37 + 36 + 36 = 109: linear to 0 at step 109,
    # and the last epoch's 37th batch still trains (at the schedule's end)
    lrs = [lr for _, lr in rates.steps]
    assert lrs[:73] == pytest.approx([1e-3 * (111 - s) / 111 for s in range(1, 74)])
    assert lrs[73:] == pytest.approx([1e-3 * max(109 - s, 0) / 109 for s in range(74, 111)])


def test_a_resume_after_the_schedule_was_refined_keeps_the_refined_schedule(tmp_path):
    def run(out: Path, **changes) -> Trainer:
        return Trainer(
            model=tiny_llama(), args=arguments(out, num_train_epochs=3, **changes), train_dataset=uneven_packs()
        )

    full = run(tmp_path / "run", save_strategy="steps", save_steps=40)
    full.train()
    resumed = run(tmp_path / "resumed")
    out = resumed.train(resume_from_checkpoint=str(tmp_path / "run" / "checkpoint-40"))
    assert out.global_step == 110
    assert resumed.lr_scheduler.get_last_lr() == full.lr_scheduler.get_last_lr()
    for name, value in full.model.state_dict().items():
        assert torch.equal(value, resumed.model.state_dict()[name]), name


@pytest.mark.parametrize(("epochs", "steps"), [(2, 73), (3, 110)])  # the last epoch: shorter, longer than planned
def test_the_last_epoch_ends_training_with_hf_final_checkpoint(tmp_path, epochs, steps):
    """HF saves (and evaluates) at max_steps for "steps" strategies: the data's end does the same."""
    args = arguments(tmp_path, num_train_epochs=epochs, save_strategy="steps", save_steps=1000)
    trainer = Trainer(model=tiny_llama(), args=args, train_dataset=uneven_packs())
    assert trainer.train().global_step == trainer.state.max_steps == steps
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == [f"checkpoint-{steps}"]


def test_a_source_read_once_is_refused_rather_than_trained_on_nothing(tmp_path):
    """A generator is read by the count: the first epoch then makes no batches (HF would stop at step 0)."""
    rows = iter(texts(8))
    pipe = pp.from_iterable(rows).tokenize(pp.examples.tokenizer()).pack(64, batch_size=2)
    trainer = Trainer(model=tiny_llama(), args=arguments(tmp_path), train_dataset=pipe)
    with pytest.raises(
        RuntimeError,
        match=r"^The first epoch of `train_dataset` must make the \d+ batches counted before training "
        r"\(num_train_epochs\), but made 0 instead: its source gives other rows when read again",
    ):
        trainer.train()
    with pytest.raises(ValueError, match=r"^`train_dataset` must make batches for num_train_epochs, but its first"):
        trainer.train()  # counted again: the generator is spent
