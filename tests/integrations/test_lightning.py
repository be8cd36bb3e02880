"""Lightning: LightningLoader + ExactResume resume exactly on one device; warnings.

DDP x2 under torchrun: test_lightning_ddp.py (one launch for every Lightning DDP run).
"""

from __future__ import annotations

import os
import warnings

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
L = pytest.importorskip("lightning")
pytest.importorskip("transformers")

from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402
from torchdata.stateful_dataloader import StatefulDataLoader  # noqa: E402

import padpipe as pp  # noqa: E402
from padpipe.checkpoints import CHECKPOINT  # noqa: E402
from padpipe.integrations.lightning import ExactResume, LightningLoader  # noqa: E402
from padpipe.recipes.glue import glue  # noqa: E402
from padpipe.state import ListOf, Plain, StateMismatchError, StateSchema  # noqa: E402
from tests.integrations.scripts.lightning_run import Classifier  # noqa: E402
from tests.integrations.tiny import write_mrpc  # noqa: E402

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.filterwarnings("ignore:`isinstance\\(treespec, LeafSpec\\)` is deprecated"),
    pytest.mark.filterwarnings("ignore:Be aware that when using `ckpt_path`"),
]


@pytest.fixture(scope="module")
def mrpc(tmp_path_factory):
    return write_mrpc(tmp_path_factory.mktemp("lightning") / "mrpc", train_rows=400, val_rows=10)


def trainer(tmp_path, callbacks=(), **options) -> L.Trainer:
    return L.Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=any(isinstance(c, ModelCheckpoint) for c in callbacks),
        default_root_dir=tmp_path,
        callbacks=list(callbacks),
        **options,
    )


class Bare(Classifier):
    """Returns whatever ``make(pipe)`` builds from ``train_dataloader``."""

    def __init__(self, pipe, make) -> None:
        super().__init__(pipe, 0)
        self.make = make

    def train_dataloader(self):
        return self.make(self.pipe)


def test_lightning_loader_resumes_a_mid_epoch_checkpoint_exactly(mrpc, tmp_path):
    pipe = glue("mrpc", "train", pp.examples.tokenizer(), data=mrpc, max_tokens=2048)
    per_epoch = sum(1 for _ in pipe.loader())
    full = Classifier(pipe, 0)
    checkpoints = ModelCheckpoint(dirpath=tmp_path / "ckpt", filename="{step}", every_n_train_steps=5, save_top_k=-1)
    trainer(tmp_path, [ExactResume(), checkpoints], max_epochs=2).fit(full)
    assert len(full.steps) == 2 * per_epoch and full.steps[:per_epoch] != full.steps[per_epoch:]
    resumed = Classifier(pipe, 0)
    # Lightning's default weights_only: the checkpoint's loader states are plain data
    trainer(tmp_path, [ExactResume()], max_epochs=2).fit(resumed, ckpt_path=tmp_path / "ckpt" / "step=5.ckpt")
    assert resumed.steps == full.steps[5:]  # the default loop fetches a batch ahead: none is skipped


def test_lightning_loader_without_exact_resume_fails_at_its_first_batch(mrpc, tmp_path):
    pipe = glue("mrpc", "train", pp.examples.tokenizer(), data=mrpc, max_tokens=2048)
    model = Classifier(pipe, 0)
    with pytest.raises(
        RuntimeError,
        match=r"^LightningLoader needs `padpipe\.integrations\.lightning\.ExactResume\(\)` in "
        r"`Trainer\(callbacks=\.\.\.\)` \(it tells the loader which batches were trained on\)",
    ):
        trainer(tmp_path, max_steps=5).fit(model)
    assert model.steps == []


def test_lightning_loader_taken_more_than_its_loop_fetches_ahead_raises():
    pipe = pp.from_iterable([{"text": f"row {i}"} for i in range(6)]).tokenize(pp.examples.tokenizer()).batch(1).pad()
    batches = iter(LightningLoader(pipe.loader()))  # outside Lightning, no callback says what was trained
    with pytest.raises(RuntimeError, match=r"^LightningLoader needs `padpipe\.integrations\.lightning\.ExactResume"):
        for _ in range(3):
            next(batches)


def test_lightning_loader_needs_a_stateful_loader():
    with pytest.raises(
        TypeError,
        match=r"^`loader` must have state_dict\(\) and load_state_dict\(\) \(e\.g\. "
        r"pipe\.loader\(\)\), but is a list instead\.$",
    ):
        LightningLoader([])


def test_lightning_loader_over_a_stateful_dataloader_resumes_on_as_many_ranks():
    pipe = pp.from_iterable([{"text": f"row {i}"} for i in range(6)]).tokenize(pp.examples.tokenizer()).batch(1).pad()
    wrapped = LightningLoader(StatefulDataLoader(pipe, batch_size=None))
    batches, seen = iter(wrapped), []
    for _ in range(3):  # the loop trained two and fetched a third
        seen.append(next(batches)["input_ids"].tolist())
        if len(seen) < 3:
            wrapped.taken()
    state = wrapped.state_dict()
    again, rest = LightningLoader(StatefulDataLoader(pipe, batch_size=None)), []
    again.load_state_dict(state)
    for batch in again:
        rest.append(batch["input_ids"].tolist())
        again.taken()
    everything = [b["input_ids"].tolist() for b in StatefulDataLoader(pipe, batch_size=None)]
    assert seen[:2] + rest == everything and rest[0] == seen[2]  # the fetched one again, then the rest
    two_ranks = CHECKPOINT.make({}, ranks=state["ranks"] * 2)
    with pytest.raises(StateMismatchError, match=r"^LightningLoader state was saved by 2 ranks, but this run has 1: "):
        LightningLoader(StatefulDataLoader(pipe, batch_size=None)).load_state_dict(two_ranks)


def test_lightning_loader_refuses_a_state_of_an_earlier_version_by_its_version():
    """padpipe's LightningLoader state before loader.checkpoint() (version 2): refused in one line, not read."""
    pipe = pp.from_iterable([{"text": f"row {i}"} for i in range(6)]).tokenize(pp.examples.tokenizer()).batch(1).pad()
    old = StateSchema("LightningLoader", 2, ranks=ListOf(Plain())).make({}, ranks=[])
    for loader in (pipe.loader(), StatefulDataLoader(pipe, batch_size=None)):
        with pytest.raises(
            StateMismatchError, match=r"^PipelineLoader checkpoint state .*version found 2 instead of 1\.$"
        ):
            LightningLoader(loader).load_state_dict(old)


@pytest.mark.parametrize(
    "make, says",
    [
        (
            lambda pipe: DataLoader(pipe, batch_size=None),
            "a plain torch DataLoader over a padpipe pipeline: it saves no data position",
        ),
        (
            lambda pipe: StatefulDataLoader(pipe, batch_size=None),
            "a StatefulDataLoader over a padpipe pipeline: Lightning saves its state one batch late",
        ),
    ],
)
def test_lightning_warns_when_a_dataloader_reads_the_pipeline(mrpc, tmp_path, make, says):
    from padpipe.integrations import guard

    guard._warned.clear()
    pipe = glue("mrpc", "train", pp.examples.tokenizer(), data=mrpc, max_tokens=2048)
    fix = r"`pipe\.loader\(\.\.\.\)` from `train_dataloader\(\)` \(Lightning's checkpoints then hold every rank's"
    with pytest.warns(UserWarning, match=f"^Lightning is training on {says}.* For an exact resume, return {fix}"):
        trainer(tmp_path, max_steps=2).fit(Bare(pipe, make))


def test_exact_resume_warns_without_a_padpipe_loader(mrpc, tmp_path):
    pipe = glue("mrpc", "train", pp.examples.tokenizer(), data=mrpc, max_tokens=2048)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.warns(
            UserWarning,
            match=r"^ExactResume: the train dataloader is neither a LightningLoader nor a "
            r"pipe\.loader\(\), so a resumed run will not continue exactly",
        ):
            trainer(tmp_path, [ExactResume()], max_steps=2).fit(Bare(pipe, lambda p: DataLoader(p, batch_size=None)))


def test_exact_resume_is_quiet_with_a_bare_pipe_loader(mrpc, tmp_path):
    pipe = glue("mrpc", "train", pp.examples.tokenizer(), data=mrpc, max_tokens=2048)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", "ExactResume")
        trainer(tmp_path, [ExactResume()], max_steps=2).fit(Bare(pipe, lambda p: p.loader()))
