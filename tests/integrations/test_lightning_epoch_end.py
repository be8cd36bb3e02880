"""Lightning resumed at an epoch's end: Lightning's epochs and padpipe's in step, every batch trained once.

Also: checkpoints saved at a validation's end after an epoch's last batch (``val_check_interval``,
``check_val_every_n_epoch``), epochs cut short by ``limit_train_batches`` (an epoch all the same: the next reads
padpipe's next epoch), and a second ``fit`` of the same ``Trainer``; each compared step by step with the
uninterrupted run, with ``stats().batches`` the batches trained.

A first fit stops at a step of interest — its ``training_step`` raises there (then ``trainer.save_checkpoint``), a
``ModelCheckpoint`` saves there, or ``max_steps`` ends it there (then ``trainer.save_checkpoint``) — and a second fit
resumes from that checkpoint with ``max_epochs=2``. On a bare ``pipe.loader()`` and on ``LightningLoader``, with
the default ``training_step(batch, batch_idx)`` (Lightning fetches a batch ahead) and ``training_step(dataloader_iter)``,
the steps of both fits, by row ids and tensor digest and each with Lightning's epoch, are exactly two epochs of the
data read outside Lightning: no batch trained twice or skipped, no third epoch.
"""

from __future__ import annotations

import pytest
import torch

L = pytest.importorskip("lightning")
pytest.importorskip("transformers")

from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

import padpipe as pp  # noqa: E402
from padpipe.integrations.lightning import ExactResume, LightningLoader  # noqa: E402
from padpipe.recipes.glue import glue  # noqa: E402
from tests.integrations.scripts.lightning_run import Classifier  # noqa: E402
from tests.integrations.test_lightning import trainer  # noqa: E402
from tests.integrations.tiny import digest, write_mrpc  # noqa: E402

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.filterwarnings("ignore:`isinstance\\(treespec, LeafSpec\\)` is deprecated"),
    pytest.mark.filterwarnings("ignore:Be aware that when using `ckpt_path`"),
    pytest.mark.filterwarnings("ignore:You are using the `dataloader_iter` step flavor"),
    pytest.mark.filterwarnings("ignore:Found `dataloader_iter` argument"),
]


class Crash(Exception):
    pass


class Run(Classifier):
    """A bare ``pipe.loader()`` or a ``LightningLoader`` of it; ``training_step`` raises at step ``fail_at`` (from 1)."""

    def __init__(self, pipe: pp.Pipeline, wrapped: bool, fail_at: int = 0) -> None:
        super().__init__(pipe, 0)
        self.wrapped, self.fail_at = wrapped, fail_at

    def train_dataloader(self):
        self.loader = self.pipe.loader()  # its stats() count the batches trained
        return LightningLoader(self.loader) if self.wrapped else self.loader

    def training_step(self, batch, batch_idx):
        if len(self.steps) + 1 == self.fail_at:
            raise Crash(f"step {self.fail_at} fails")
        return super().training_step(batch, batch_idx)


class RunIter(Run):
    """``training_step(dataloader_iter)``: Lightning fetches nothing ahead; the step fetches its batch."""

    def training_step(self, dataloader_iter):
        batch, batch_idx, _ = next(dataloader_iter)
        return super().training_step(batch, batch_idx)


class Validated(Run):
    """Validates (nothing) on a plain loader, so that Lightning saves checkpoints at a validation's end."""

    def val_dataloader(self):
        return DataLoader([torch.zeros(1)] * 2, batch_size=None)

    def validation_step(self, batch, batch_idx):
        return None


@pytest.fixture(scope="module")
def pipe(tmp_path_factory):
    data = write_mrpc(tmp_path_factory.mktemp("lightning_epoch_end") / "mrpc", train_rows=200, val_rows=10)
    return glue("mrpc", "train", pp.examples.tokenizer(), data=data, max_tokens=2048)


@pytest.fixture(scope="module")
def three_epochs(pipe) -> list[list[dict]]:
    """Three epochs read outside Lightning, as the steps ``Classifier`` records (Lightning's epoch, ids, digest)."""
    loader = pipe.loader()
    return [
        [
            {"epoch": epoch, "idx": b["idx"].tolist(), "batch": digest(b["input_ids"], b["attention_mask"])}
            for b in loader
        ]
        for epoch in range(3)
    ]


@pytest.fixture(scope="module")
def two_epochs(three_epochs) -> list[dict]:
    return three_epochs[0] + three_epochs[1]


def stop(pipe, folder, module, wrapped: bool, how: str, at: int) -> list[dict]:
    """The first fit, stopped at step ``at`` as ``how`` says; the steps it trained. Its checkpoint: ``folder/c.ckpt``."""
    first = module(pipe, wrapped, fail_at=at if how == "crash" else 0)
    if how == "crash":
        interrupted = trainer(folder, [ExactResume()], max_epochs=2)
        with pytest.raises(Crash):
            interrupted.fit(first)
        interrupted.save_checkpoint(folder / "c.ckpt")  # the failed batch (and the one fetched ahead) kept
    elif how == "saved":
        saves = ModelCheckpoint(dirpath=folder, filename="c", every_n_train_steps=at)
        trainer(folder, [ExactResume(), saves], max_steps=at).fit(first)  # saved inside the loop, at that step
    else:
        stopped = trainer(folder, [ExactResume()], max_steps=at)
        stopped.fit(first)
        stopped.save_checkpoint(folder / "c.ckpt")  # after fit: Lightning counts a finished epoch done
    return first.steps


PER_EPOCH = 8  # the pipeline's batches per epoch (checked below)


@pytest.mark.parametrize(
    "module, wrapped, how, at",
    [
        (Run, False, "crash", PER_EPOCH),  # the epoch's last batch fails: Lightning had fetched to the epoch's end
        (Run, False, "crash", 2 * PER_EPOCH),  # the last epoch's
        (Run, False, "crash", 1),  # the first batch fails: it was fetched before ExactResume's on_train_start
        (RunIter, False, "crash", PER_EPOCH),
        (Run, True, "crash", PER_EPOCH),  # LightningLoader: the failed batch is trained after the resume
        (Run, True, "crash", 1),
        (Run, False, "saved", PER_EPOCH),
        (Run, True, "saved", PER_EPOCH),
        (RunIter, True, "saved", PER_EPOCH),  # nothing of that epoch left: it ends, the next is Lightning's next
        (Run, True, "stopped", PER_EPOCH),  # LightningLoader's epochs follow Lightning's as a bare loader's do
    ],
    ids=lambda v: v.__name__ if isinstance(v, type) else str(v),
)
def test_a_run_resumed_at_an_epochs_end_trains_each_batch_once_in_lightnings_epochs(
    pipe, two_epochs, tmp_path, module, wrapped, how, at
):
    assert len(two_epochs) == 2 * PER_EPOCH
    first = stop(pipe, tmp_path, module, wrapped, how, at)
    assert first == two_epochs[: len(first)] and len(first) == (at - 1 if how == "crash" else at)
    resumed = module(pipe, wrapped)
    fit = trainer(tmp_path, [ExactResume()], max_epochs=2)
    fit.fit(resumed, ckpt_path=tmp_path / "c.ckpt")
    assert first + resumed.steps == two_epochs  # by ids, digests and Lightning's epoch of each step
    assert fit.current_epoch == 2


def test_a_resume_without_exact_resume_refuses_before_a_step(pipe, tmp_path):
    stop(pipe, tmp_path, Run, False, "crash", PER_EPOCH)
    resumed = Run(pipe, False)
    with pytest.raises(
        RuntimeError,
        match=r"^Lightning is resuming pipe\.loader\(\) from .*c\.ckpt without the padpipe\.integrations\.lightning\."
        r"ExactResume\(\) callback, so its epochs would not follow Lightning's: add `callbacks=\[",
    ):
        trainer(tmp_path, max_epochs=2).fit(resumed, ckpt_path=tmp_path / "c.ckpt")
    assert resumed.steps == []


def test_loaders_reloaded_each_epoch_train_each_batch_once_and_resume_exactly(pipe, two_epochs, tmp_path):
    """``reload_dataloaders_every_n_epochs``: a new ``pipe.loader()`` each epoch reads Lightning's epoch, and a
    checkpoint inside the second (its loader's first save) resumes exactly."""
    full = Run(pipe, False)
    saves = ModelCheckpoint(dirpath=tmp_path, filename="{step}", every_n_train_steps=4, save_top_k=-1)
    trainer(tmp_path, [ExactResume(), saves], max_epochs=2, reload_dataloaders_every_n_epochs=1).fit(full)
    assert full.steps == two_epochs
    resumed = Run(pipe, False)
    again = trainer(tmp_path, [ExactResume()], max_epochs=2, reload_dataloaders_every_n_epochs=1)
    again.fit(resumed, ckpt_path=tmp_path / f"step={PER_EPOCH + 4}.ckpt")
    assert full.steps[: PER_EPOCH + 4] + resumed.steps == two_epochs


@pytest.mark.parametrize(
    "wrapped, validation",
    [(False, {"val_check_interval": 4}), (True, {"val_check_interval": 4}), (False, {"check_val_every_n_epoch": 2})],
    ids=["bare-val_check_interval", "lightning_loader-val_check_interval", "bare-check_val_every_n_epoch"],
)
def test_a_checkpoint_saved_after_validating_an_epochs_end_resumes_with_the_next_epoch(
    pipe, three_epochs, tmp_path, wrapped, validation
):
    """Saved at a validation's end after an epoch's last batch (before Lightning counts the epoch done): Lightning's
    next epoch reads padpipe's next, not the one after; ``stats().batches`` counts the batches trained."""
    epochs = 3 if "check_val_every_n_epoch" in validation else 2
    expected = [step for epoch in three_epochs[:epochs] for step in epoch]
    full = Validated(pipe, wrapped)
    saves = ModelCheckpoint(dirpath=tmp_path, filename="{step}", save_top_k=-1, save_on_train_epoch_end=False)
    trainer(tmp_path, [ExactResume(), saves], max_epochs=epochs, num_sanity_val_steps=0, **validation).fit(full)
    assert full.steps == expected and full.loader.stats().batches == len(expected)  # not the one fetched ahead
    at = PER_EPOCH * (epochs - 1)  # validated at the end of the epoch before the last
    resumed = Validated(pipe, wrapped)
    again = trainer(tmp_path, [ExactResume()], max_epochs=epochs, num_sanity_val_steps=0, **validation)
    again.fit(resumed, ckpt_path=tmp_path / f"step={at}.ckpt")
    assert resumed.steps == expected[at:] and again.current_epoch == epochs
    assert resumed.loader.stats().batches == PER_EPOCH  # nor those fetched and dropped as Lightning re-iterates


def test_an_epoch_cut_short_by_limit_train_batches_is_an_epoch_when_resumed(pipe, two_epochs, tmp_path):
    """``limit_train_batches``: Lightning's next epoch reads padpipe's next, in the uninterrupted run and resumed from
    inside the cut epoch, from its last batch, and from a failure at its last batch (on a ``LightningLoader``)."""
    limit = PER_EPOCH - 2
    expected = two_epochs[:limit] + two_epochs[PER_EPOCH : PER_EPOCH + limit]
    full = Run(pipe, False)
    saves = ModelCheckpoint(dirpath=tmp_path, filename="{step}", every_n_train_steps=limit // 2, save_top_k=-1)
    trainer(tmp_path, [ExactResume(), saves], max_epochs=2, limit_train_batches=limit).fit(full)
    assert full.steps == expected
    for at in (limit // 2, limit):
        resumed = Run(pipe, False)
        again = trainer(tmp_path, [ExactResume()], max_epochs=2, limit_train_batches=limit)
        again.fit(resumed, ckpt_path=tmp_path / f"step={at}.ckpt")
        assert resumed.steps == expected[at:], at
    failed = Run(pipe, True, fail_at=limit)
    interrupted = trainer(tmp_path, [ExactResume()], max_epochs=2, limit_train_batches=limit)
    with pytest.raises(Crash):
        interrupted.fit(failed)
    interrupted.save_checkpoint(tmp_path / "failed.ckpt")
    assert failed.loader.stats().batches == limit - 1  # the batches trained: not the one whose step failed
    resumed = Run(pipe, True)
    trainer(tmp_path, [ExactResume()], max_epochs=2, limit_train_batches=limit).fit(
        resumed, ckpt_path=tmp_path / "failed.ckpt"
    )
    assert failed.steps + resumed.steps == expected


def test_a_second_fit_of_the_same_trainer_reads_the_next_epoch(pipe, two_epochs, tmp_path):
    model = Run(pipe, False)
    fit = trainer(tmp_path, [ExactResume()], max_epochs=1)
    fit.fit(model)
    fit.fit_loop.max_epochs = 2  # more epochs, then fit again
    fit.fit(model)
    assert model.steps == two_epochs
