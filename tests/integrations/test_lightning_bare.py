"""Lightning on ``pipe.loader()`` with ``ExactResume``: exact resume from mid-epoch and end-of-fit checkpoints,
epochs in step (without the callback: test_lightning_fail_fast.py; at an epoch's end: test_lightning_epoch_end.py).

One device here; DDP x2 under torchrun (0 and 2 workers: the mid-epoch, the ``max_steps`` and the
2-ranks-to-1-device checks) in test_lightning_ddp.py.
"""

from __future__ import annotations

import pytest

L = pytest.importorskip("lightning")
pytest.importorskip("transformers")

from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402

import padpipe as pp  # noqa: E402
from padpipe.checkpoints import CHECKPOINT  # noqa: E402
from padpipe.integrations.lightning import ExactResume  # noqa: E402
from padpipe.recipes.glue import glue  # noqa: E402
from padpipe.state import StateMismatchError  # noqa: E402
from tests.integrations.scripts.lightning_bare_run import STOP_AT, Bare  # noqa: E402
from tests.integrations.scripts.lightning_run import Classifier  # noqa: E402
from tests.integrations.test_lightning import trainer  # noqa: E402
from tests.integrations.tiny import write_mrpc  # noqa: E402

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.filterwarnings("ignore:`isinstance\\(treespec, LeafSpec\\)` is deprecated"),
    pytest.mark.filterwarnings("ignore:Be aware that when using `ckpt_path`"),
    pytest.mark.filterwarnings("ignore:You are using the `dataloader_iter` step flavor"),
    pytest.mark.filterwarnings("ignore:Found `dataloader_iter` argument"),
]


@pytest.fixture(scope="module")
def pipe(tmp_path_factory):
    data = write_mrpc(tmp_path_factory.mktemp("lightning_bare") / "mrpc", train_rows=400, val_rows=10)
    return glue("mrpc", "train", pp.examples.tokenizer(), data=data, max_tokens=2048)


class StepIter(Bare):
    """``training_step(dataloader_iter)``: Lightning fetches nothing ahead."""

    def training_step(self, dataloader_iter):
        batch, _, _ = next(dataloader_iter)
        return super().training_step(batch, 0)


@pytest.fixture(scope="module", params=[Bare, StepIter], ids=["fetch_ahead", "dataloader_iter"])
def full(request, pipe, tmp_path_factory):
    """Two epochs on a bare ``pipe.loader()`` with a checkpoint every 4 steps: the steps, steps per epoch, the
    checkpoints' folder and the module class."""
    folder = tmp_path_factory.mktemp("full")
    model = request.param(pipe, 0)
    checkpoints = ModelCheckpoint(dirpath=folder, filename="{step}", every_n_train_steps=4, save_top_k=-1)
    at_epoch_ends = ModelCheckpoint(dirpath=folder, filename="{epoch}", save_top_k=-1)  # in on_train_epoch_end
    trainer(folder, [ExactResume(), checkpoints, at_epoch_ends], max_epochs=2).fit(model)
    outside = pipe.loader()
    epochs = [[b["idx"].tolist() for b in outside] for _ in range(2)]  # epochs 0 and 1 outside Lightning
    per_epoch = len(epochs[0])
    assert per_epoch % 4 == 0 and [s["epoch"] for s in model.steps] == [0] * per_epoch + [1] * per_epoch
    assert [s["idx"] for s in model.steps] == epochs[0] + epochs[1] and epochs[0] != epochs[1]  # Lightning's epochs
    return model.steps, per_epoch, folder, request.param


@pytest.mark.parametrize("where", ["mid_epoch", "last_batch_of_epoch"])
def test_bare_loader_resumes_a_checkpoint_exactly(pipe, full, tmp_path, where):
    steps, per_epoch, folder, model = full
    at = 4 if where == "mid_epoch" else per_epoch
    resumed = model(pipe, 0)
    trainer(tmp_path, [ExactResume()], max_epochs=2).fit(resumed, ckpt_path=folder / f"step={at}.ckpt")
    assert resumed.steps == steps[at:]  # tensor-equal batches in the same epochs: none skipped, none repeated


def test_bare_loader_resumes_an_epoch_end_checkpoint_with_the_next_epoch(pipe, full, tmp_path):
    steps, per_epoch, folder, model = full
    for limits in ({"max_epochs": 2}, {"max_steps": 2 * per_epoch}):
        resumed = model(pipe, 0)
        trainer(tmp_path, [ExactResume()], **limits).fit(resumed, ckpt_path=folder / "epoch=0.ckpt")
        # the same batches; Lightning itself numbers that epoch 0 again when resumed with max_steps
        assert [(s["idx"], s["batch"]) for s in resumed.steps] == [(s["idx"], s["batch"]) for s in steps[per_epoch:]]


def test_bare_loader_after_max_steps_resumes_with_the_next_epoch_whole(pipe, full, tmp_path):
    steps, per_epoch, _, model = full
    stopped = trainer(tmp_path, [ExactResume()], max_steps=STOP_AT)
    stopped.fit(model(pipe, 0))
    assert stopped.current_epoch == 1  # Lightning counts epoch 0 as done
    stopped.save_checkpoint(tmp_path / "stopped.ckpt")
    for limits in ({"max_epochs": 2}, {"max_steps": STOP_AT + per_epoch}):
        after = model(pipe, 0)
        trainer(tmp_path, [ExactResume()], **limits).fit(after, ckpt_path=tmp_path / "stopped.ckpt")
        assert after.steps == steps[per_epoch:]  # epoch 1 from its first batch, as the uninterrupted run


def test_a_lightning_loader_checkpoint_resumes_a_bare_loader_and_back(pipe, full, tmp_path):
    """One format: LightningLoader(pipe.loader()) and a bare pipe.loader() save the same checkpoint."""
    steps, _, folder, model = full
    if model is not Bare:
        pytest.skip("one fetch-ahead flavour is enough")
    wrapped = ModelCheckpoint(dirpath=tmp_path / "wrapped", filename="{step}", every_n_train_steps=4, save_top_k=-1)
    trainer(tmp_path, [ExactResume(), wrapped], max_steps=4).fit(Classifier(pipe, 0))  # LightningLoader
    bare = Bare(pipe, 0)
    trainer(tmp_path, [ExactResume()], max_epochs=2).fit(bare, ckpt_path=tmp_path / "wrapped" / "step=4.ckpt")
    assert bare.steps == steps[4:]
    wrapped_again = Classifier(pipe, 0)
    trainer(tmp_path, [ExactResume()], max_epochs=2).fit(wrapped_again, ckpt_path=folder / "step=4.ckpt")
    assert wrapped_again.steps == steps[4:]


@pytest.mark.parametrize(
    "entries, says",
    [
        ([], r"'ranks' must be a list of every rank's state, but is \[\] instead\."),
        (
            [{"loader": {}}],
            r"'ranks\[0\]' must be a dict with keys \['ahead', 'loader'\], but is \['loader'\] instead\.",
        ),
        (["x"], r"'ranks\[0\]' must be a dict with keys \['ahead', 'loader'\], but is str instead\."),
    ],
)
def test_bare_loader_refuses_a_crafted_checkpoint(pipe, entries, says):
    with pytest.raises(StateMismatchError, match=rf"^PipelineLoader checkpoint state is invalid: {says}$"):
        pipe.loader().load_state_dict(CHECKPOINT.make({}, ranks=entries))


class Fails(Bare):
    def training_step(self, batch, batch_idx):
        if len(self.steps) == 3 and not getattr(self, "resumed", False):
            raise ValueError("step 4 fails")
        return super().training_step(batch, batch_idx)


def test_bare_loader_saved_after_an_interrupted_fit_resumes_with_the_failed_step(pipe, full, tmp_path):
    steps, _, _, _ = full
    if full[3] is not Bare:
        pytest.skip("one loop flavour is enough")
    interrupted = trainer(tmp_path, [ExactResume()], max_epochs=1)
    with pytest.raises(ValueError, match="^step 4 fails$"):
        interrupted.fit(Fails(pipe, 0))
    interrupted.save_checkpoint(tmp_path / "interrupted.ckpt")  # the failed batch and the one fetched ahead kept
    resumed = Fails(pipe, 0)
    resumed.resumed = True
    trainer(tmp_path, [ExactResume()], max_epochs=2).fit(resumed, ckpt_path=tmp_path / "interrupted.ckpt")
    assert [(s["idx"], s["batch"]) for s in resumed.steps] == [(s["idx"], s["batch"]) for s in steps[3:]]


class ReadsAnother(Bare):
    """Also iterates another loader in ``training_step``: user code, which Lightning does not checkpoint."""

    def __init__(self, pipe, other) -> None:
        super().__init__(pipe, 0)
        self.other, self.seen = other, []

    def training_step(self, batch, batch_idx):
        self.seen.append(len(list(self.other)))  # a whole epoch each time, as outside Lightning
        self.other.state_dict()  # the user's call: no check of Lightning's applies
        return super().training_step(batch, batch_idx)


@pytest.mark.filterwarnings("ignore:Lightning may save pipe.loader():UserWarning")  # the train loader's, no callback
def test_a_loader_read_inside_training_step_is_a_plain_loader(pipe, tmp_path):
    other = pipe.loader()
    per_epoch = sum(1 for _ in pipe.loader())
    model = ReadsAnother(pipe, other)
    trainer(tmp_path, max_steps=2).fit(model)
    assert model.seen == [per_epoch, per_epoch]
