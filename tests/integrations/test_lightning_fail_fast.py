"""Lightning without ``ExactResume``: a fit that will save the loader refuses at its first batch, before any step.

One device here (Lightning's default checkpointing, a ``ModelCheckpoint`` every few steps, a resume, a
``LightningLoader``); DDP x2 under torchrun in test_lightning_ddp.py. A fit that can only save the loader through
``trainer.save_checkpoint`` warns at its start and trains; that save raises. Old checkpoints are refused by version.
With ``ExactResume``, several train loaders are refused before a step.
"""

from __future__ import annotations

import copy
import functools

import pytest
import torch

L = pytest.importorskip("lightning")
pytest.importorskip("transformers")

from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402
from lightning.pytorch.utilities import CombinedLoader  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

import padpipe as pp  # noqa: E402
from padpipe.checkpoints import CHECKPOINT  # noqa: E402
from padpipe.integrations.lightning import ExactResume  # noqa: E402
from padpipe.integrations.loader_guard import LOADER_SLOT  # noqa: E402
from padpipe.recipes.glue import glue  # noqa: E402
from padpipe.state import make_state  # noqa: E402
from tests.integrations import test_lightning  # noqa: E402
from tests.integrations.scripts.lightning_bare_run import Bare  # noqa: E402
from tests.integrations.scripts.lightning_run import Classifier  # noqa: E402
from tests.integrations.test_lightning import trainer  # noqa: E402
from tests.integrations.tiny import write_mrpc  # noqa: E402

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.filterwarnings("ignore:`isinstance\\(treespec, LeafSpec\\)` is deprecated"),
    pytest.mark.filterwarnings("ignore:Be aware that when using `ckpt_path`"),
]
CALLBACK = (
    r"without the padpipe\.integrations\.lightning\.ExactResume\(\) callback, so the state would be one batch late"
)
WILL_SAVE = rf"^Lightning will save pipe\.loader\(\) in its checkpoints \(ModelCheckpoint\) {CALLBACK} "
SAVES = rf"^Lightning is saving pipe\.loader\(\) in a checkpoint {CALLBACK} .*add `callbacks=\[padpipe\.integrations"


@pytest.fixture(scope="module")
def pipe(tmp_path_factory):
    data = write_mrpc(tmp_path_factory.mktemp("lightning_fail_fast") / "mrpc", train_rows=200, val_rows=10)
    return glue("mrpc", "train", pp.examples.tokenizer(), data=data, max_tokens=2048)


class Steps(L.Callback):
    def __init__(self) -> None:
        self.started = 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.started += 1


def default_trainer(folder, *callbacks) -> L.Trainer:
    """Lightning's defaults: a ``ModelCheckpoint`` saving at each epoch's end."""
    return L.Trainer(
        accelerator="cpu",
        max_epochs=1,
        logger=False,
        enable_progress_bar=False,
        default_root_dir=folder,
        callbacks=list(callbacks),
    )


@pytest.mark.parametrize("checkpoints", ["default", "every_n_train_steps", "lightning_loader"])
def test_a_fit_that_will_save_the_loader_without_exact_resume_refuses_before_a_step(pipe, tmp_path, checkpoints):
    steps = Steps()
    model = Classifier(pipe, 0) if checkpoints == "lightning_loader" else Bare(pipe, 0)
    if checkpoints == "every_n_train_steps":
        saves = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=4)
        fit = trainer(tmp_path, [saves, steps], max_steps=8)
    else:
        fit = default_trainer(tmp_path, steps)
    wrapped = r"^LightningLoader needs `padpipe\.integrations\.lightning\.ExactResume\(\)` in `Trainer\(callbacks="
    with pytest.raises(RuntimeError, match=wrapped if checkpoints == "lightning_loader" else WILL_SAVE):
        fit.fit(model)
    assert model.steps == [] and steps.started == 0 and fit.global_step == 0  # nothing trained, nothing lost


@pytest.mark.parametrize("never_saves", [[], [ModelCheckpoint(save_top_k=0)]], ids=["no_callback", "save_top_k_0"])
def test_a_fit_that_saves_only_by_save_checkpoint_warns_at_its_start_and_that_save_raises(pipe, tmp_path, never_saves):
    model = Bare(pipe, 0)
    fit = trainer(tmp_path, never_saves, max_steps=2)
    with pytest.warns(
        UserWarning, match=r"^Lightning may save pipe\.loader\(\) in `trainer\.save_checkpoint\(\.\.\.\)` " + CALLBACK
    ):
        fit.fit(model)
    assert len(model.steps) == 2
    with pytest.raises(RuntimeError, match=SAVES):
        fit.save_checkpoint(tmp_path / "stopped.ckpt")


@pytest.mark.parametrize(
    "make",
    [
        lambda pipe: {"a": pipe.loader(), "b": pipe.loader()},
        lambda pipe: CombinedLoader([pipe.loader(), DataLoader([torch.zeros(1)] * 4, batch_size=None)], "max_size"),
    ],
    ids=["two_pipe_loaders", "one_and_a_dataloader"],
)
def test_exact_resume_refuses_several_train_loaders_before_a_step(pipe, tmp_path, make):
    model = test_lightning.Bare(pipe, make)  # its train_dataloader() returns make(pipe)
    with pytest.raises(
        RuntimeError,
        match=r"^ExactResume resumes one train loader exactly, but train_dataloader\(\) returns 2: mix their data in "
        r"one pipeline \(pp\.mix\) and return its pipe\.loader\(\)\.$",
    ):
        trainer(tmp_path, [ExactResume()], max_steps=2).fit(model)
    assert model.steps == []


class Validated(Bare):
    """Trains on a list of batches and validates on ``pipe.loader()``, whose state Lightning never saves."""

    def train_dataloader(self):
        return DataLoader(list(self.pipe.loader())[:2], batch_size=None)

    def val_dataloader(self):
        return self.pipe.loader()

    def validation_step(self, batch, batch_idx):
        batch.pop("idx")
        return self.model(**batch).loss


def test_a_validation_loader_without_exact_resume_is_not_refused(pipe, tmp_path):
    fit = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, default_root_dir=tmp_path, max_epochs=1)
    fit.fit(Validated(pipe, 0))  # Lightning's default checkpointing saves the train loaders' states only
    assert fit.global_step == 2


@pytest.fixture(scope="module")
def saved(pipe, tmp_path_factory):
    """A checkpoint saved with ``ExactResume`` after 2 steps."""
    folder = tmp_path_factory.mktemp("saved")
    model = Bare(pipe, 0)
    fit = trainer(folder, [ExactResume()], max_steps=2)
    fit.fit(model)
    fit.save_checkpoint(folder / "x.ckpt")
    return torch.load(folder / "x.ckpt", weights_only=False)


def loader_state(pipe, version: int) -> dict:
    """One rank's loader state (as Lightning saves it without ``ExactResume``) with another ``version``."""
    state = pipe.loader().state_dict()
    return make_state(version=version, settings=state["settings"], **{k: state[k] for k in pipe.loader().STATE.fields})


@pytest.mark.parametrize(
    "state, says",
    [
        (  # Lightning's own save of a bare loader, by this padpipe
            lambda pipe, good: loader_state(pipe, 3),
            r"^Lightning is restoring pipe\.loader\(\) from a checkpoint saved without the padpipe\.integrations\."
            r"lightning\.ExactResume\(\) callback \(one batch late, or rank 0's only\)",
        ),
        (  # the same of an older padpipe
            lambda pipe, good: loader_state(pipe, 2),
            r"^Lightning is restoring pipe\.loader\(\) from a checkpoint of another padpipe version: its loader state is "
            r"a version-2 PipelineLoader state, and this padpipe resumes a version-1 PipelineLoader checkpoint ",
        ),
        (  # an older padpipe's ExactResume: its epoch beside every rank's state
            lambda pipe, good: make_state(version=1, settings={}, epoch=0, ranks=good["ranks"]),
            r"of another padpipe version: its loader state is a version-1 state with keys \['checksum', 'epoch', "
            r"'ranks', 'settings', 'version'\], and this padpipe resumes a version-1 PipelineLoader checkpoint",
        ),
        (
            lambda pipe, good: CHECKPOINT.make({}, ranks=good["ranks"]) | {"version": 0},
            r"of another padpipe version: its loader state is a version-0 state with keys ",
        ),
    ],
    ids=["without_callback", "loader_v2", "old_exact_resume_v1", "checkpoint_v0"],
)
def test_a_checkpoint_this_padpipe_did_not_save_with_exact_resume_is_refused_by_its_version(
    pipe, saved, tmp_path, state, says
):
    crafted = copy.deepcopy(saved)
    *path, key = LOADER_SLOT
    slot = functools.reduce(dict.get, path, crafted)
    slot[key] = [state(pipe, slot[key][0])]
    torch.save(crafted, tmp_path / "crafted.ckpt")
    model = Bare(pipe, 0)
    with pytest.raises(RuntimeError, match=says):
        trainer(tmp_path, [ExactResume()], max_steps=4).fit(model, ckpt_path=tmp_path / "crafted.ckpt")
    assert model.steps == []
