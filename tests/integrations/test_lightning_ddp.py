"""Lightning DDP x2 under torchrun: LightningLoader and a bare ``pipe.loader()`` (0 and 2 workers) with ``ExactResume``.

One launch (scripts/lightning_ddp_run.py) runs every fit one after another: two epochs on ``LightningLoader``
with equal steps, every row once and an exact mid-epoch resume; on a bare loader, for each worker count, an
exact mid-epoch resume, a resume after ``max_steps`` with the next epoch whole, and (here, on one device) a
resume of the 2 ranks' checkpoint with every row once; without ``ExactResume``, fits that will save the loader
refuse at their first batch, before any step, on every rank.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

L = pytest.importorskip("lightning")
pytest.importorskip("transformers")

import padpipe as pp  # noqa: E402
from padpipe.integrations.lightning import ExactResume  # noqa: E402
from padpipe.recipes.glue import glue  # noqa: E402
from tests.integrations.scripts.lightning_bare_run import SAVE_EVERY, STOP_AT, Bare  # noqa: E402
from tests.integrations.test_lightning import trainer  # noqa: E402
from tests.integrations.tiny import TRAIN_ROWS, torchrun, write_mrpc  # noqa: E402

pytestmark = [
    pytest.mark.timeout(900),  # the test that starts the launch waits for it
    pytest.mark.filterwarnings("ignore:`isinstance\\(treespec, LeafSpec\\)` is deprecated"),
    pytest.mark.filterwarnings("ignore:Be aware that when using `ckpt_path`"),
]


@pytest.fixture(scope="module")
def launch(tmp_path_factory) -> Path:
    """The launch's folder: the data (``mrpc/``) and each run's records (``bare0/``, ``bare2/``, ``loader/``)."""
    out = tmp_path_factory.mktemp("lightning_ddp")
    data = write_mrpc(out / "mrpc")
    torchrun("lightning_ddp_run.py", str(data), str(out), timeout=600)
    return out


def records(folder: Path) -> list[dict]:
    return [json.loads((folder / f"rank{r}.json").read_text()) for r in range(2)]


# -- LightningLoader(pipe.loader(num_workers=2)) ------------------------------------------------------
@pytest.fixture(scope="module")
def ranks(launch) -> list[dict]:
    return records(launch / "loader")


def test_lightning_ddp_two_epochs_with_equal_steps_and_every_row_once(ranks):
    for epoch in (0, 1):
        steps = [[s for s in rank["steps"] if s["epoch"] == epoch] for rank in ranks]
        assert len(steps[0]) == len(steps[1]) > 0
        rows = [i for rank in steps for s in rank for i in s["idx"]]
        assert len(rows) == len(set(rows)) and len(rows) >= 0.96 * TRAIN_ROWS
    assert [s["idx"] for s in ranks[0]["steps"] if s["epoch"] == 0] != [
        s["idx"] for s in ranks[0]["steps"] if s["epoch"] == 1
    ]


def test_lightning_ddp_resumes_a_mid_epoch_checkpoint_exactly_on_every_rank(ranks):
    for rank in ranks:
        assert rank["resumed_steps"][0]["epoch"] == 1
        assert rank["resumed_steps"] == rank["steps"][30:]  # tensor-equal batches, the same epochs


# -- a bare pipe.loader(num_workers=W) ------------------------------------------------------------------
@pytest.fixture(scope="module", params=[0, 2], ids=["workers0", "workers2"])
def ddp(request, launch) -> tuple[list[dict], Path, int]:
    """Every rank's steps of the four fits, the run's folder (its checkpoints) and its worker count."""
    folder = launch / f"bare{request.param}"
    return records(folder), folder, request.param


@pytest.fixture(scope="module")
def bare(ddp) -> list[dict]:
    return ddp[0]


def rows(*fits: list[dict], epoch: int) -> list[int]:
    return [i for steps in fits for s in steps if s["epoch"] == epoch for i in s["idx"]]


def test_bare_loader_ddp_resumes_a_mid_epoch_checkpoint_exactly(bare):
    for rank in bare:
        assert rank["resumed"] == rank["full"][SAVE_EVERY:]
    epoch0 = rows(*(r["full"][:SAVE_EVERY] for r in bare), *(r["resumed"] for r in bare), epoch=0)
    assert sorted(epoch0) == sorted(rows(*(r["full"] for r in bare), epoch=0))  # every row of the epoch once
    assert len(epoch0) == len(set(epoch0)) >= 0.96 * TRAIN_ROWS


def test_bare_loader_ddp_resumes_after_max_steps_with_the_next_epoch_whole(bare):
    for rank in bare:
        assert rank["stopped"] == rank["full"][:STOP_AT]
        assert rank["after"] == [s for s in rank["full"] if s["epoch"] == 1]  # epoch 1 whole, no row of epoch 0 again
    epoch1 = rows(*(r["after"] for r in bare), epoch=1)
    assert len(epoch1) == len(set(epoch1)) >= 0.96 * TRAIN_ROWS


def test_bare_loader_resumes_a_ddp_checkpoint_on_one_device_with_every_row_once(ddp, launch, tmp_path):
    ranks, folder, workers = ddp
    pipe = glue("mrpc", "train", pp.examples.tokenizer(), data=launch / "mrpc", max_tokens=2048)
    one = Bare(pipe, workers)
    trainer(tmp_path, [ExactResume()], max_epochs=1).fit(
        one, ckpt_path=folder / "checkpoints" / f"step={SAVE_EVERY}.ckpt"
    )
    epoch0 = rows(*(r["full"][:SAVE_EVERY] for r in ranks), one.steps, epoch=0)  # the 2 ranks' rows, then the one's
    assert sorted(epoch0) == sorted(rows(*(r["full"] for r in ranks), epoch=0)) and len(epoch0) == len(set(epoch0))


# -- without ExactResume ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "fit, says",
    [
        ("default", r"Lightning will save pipe\.loader\(\) in its checkpoints \(ModelCheckpoint\) without the "),
        (
            "every_n_train_steps",
            r"Lightning will save pipe\.loader\(\) in its checkpoints \(ModelCheckpoint\) without ",
        ),
        ("lightning_loader", r"LightningLoader needs `padpipe\.integrations\.lightning\.ExactResume\(\)` in "),
    ],
)
def test_lightning_ddp_without_exact_resume_refuses_at_the_first_batch_on_every_rank(launch, fit, says):
    for rank in records(launch / "fail_fast"):
        assert re.match(f"^{says}", rank[fit]["error"])
        assert rank[fit]["steps"] == rank[fit]["global_step"] == 0  # no training step ran: no work lost
