"""Lightning resumed at an epoch's end: Lightning's epochs and padpipe's in step, every batch trained once.

A first fit stops at a step of interest — its ``training_step`` raises there (then ``trainer.save_checkpoint``), a
``ModelCheckpoint`` saves there, or ``max_steps`` ends it there (then ``trainer.save_checkpoint``) — and a second fit
resumes from that checkpoint with ``max_epochs=2``. On a bare ``pipe.loader()`` and on ``LightningLoader``, with
the default ``training_step(batch, batch_idx)`` (Lightning fetches a batch ahead) and ``training_step(dataloader_iter)``,
the steps of both fits, by row ids and tensor digest and each with Lightning's epoch, are exactly two epochs of the
data read outside Lightning: no batch trained twice or skipped, no third epoch.
"""

from __future__ import annotations

import pytest

L = pytest.importorskip("lightning")
pytest.importorskip("transformers")

from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402

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
        loader = self.pipe.loader()
        return LightningLoader(loader) if self.wrapped else loader

    def training_step(self, batch, batch_idx):
        if len(self.steps) + 1 == self.fail_at:
            raise Crash(f"step {self.fail_at} fails")
        return super().training_step(batch, batch_idx)


class RunIter(Run):
    """``training_step(dataloader_iter)``: Lightning fetches nothing ahead; the step fetches its batch."""

    def training_step(self, dataloader_iter):
        batch, batch_idx, _ = next(dataloader_iter)
        return super().training_step(batch, batch_idx)


@pytest.fixture(scope="module")
def pipe(tmp_path_factory):
    data = write_mrpc(tmp_path_factory.mktemp("lightning_epoch_end") / "mrpc", train_rows=200, val_rows=10)
    return glue("mrpc", "train", pp.examples.tokenizer(), data=data, max_tokens=2048)


@pytest.fixture(scope="module")
def two_epochs(pipe) -> list[dict]:
    """Two epochs read outside Lightning, as the steps ``Classifier`` records (Lightning's epoch, ids, digest)."""
    loader = pipe.loader()
    return [
        {"epoch": epoch, "idx": b["idx"].tolist(), "batch": digest(b["input_ids"], b["attention_mask"])}
        for epoch in range(2)
        for b in loader
    ]


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
