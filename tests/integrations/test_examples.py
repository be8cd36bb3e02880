"""The scripts in examples/ run as the README shows them (on a small slice of the sample)."""

from __future__ import annotations

import os
import re

import pyarrow.parquet as pq
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("transformers")

import padpipe as pp  # noqa: E402
from tests.integrations.tiny import ROOT, run_script, write_mrpc  # noqa: E402

pytestmark = pytest.mark.timeout(300)
EXAMPLES = ROOT / "examples"
ROWS = 1000


@pytest.fixture(scope="module")
def parquet(tmp_path_factory):
    path = tmp_path_factory.mktemp("examples") / "train.parquet"
    pq.write_table(pq.read_table(pp.examples.SAMPLE_PARQUET).slice(0, ROWS), path, row_group_size=250)
    return str(path)


def test_ddp_example_under_torchrun_takes_equal_steps_over_every_row(parquet):
    out = run_script(EXAMPLES / "train_ddp.py", parquet).stdout
    found = re.findall(r"rank (\d)/2 epoch (\d): (\d+) steps, ([\d,]+) rows", out)
    assert len(found) == 4, out
    for epoch in "01":
        lines = [(int(steps), int(rows.replace(",", ""))) for _, e, steps, rows in found if e == epoch]
        assert lines[0][0] == lines[1][0] and lines[0][1] + lines[1][1] == ROWS


def test_trainer_example_trains_evaluates_and_predicts_in_row_order(tmp_path):
    data = write_mrpc(tmp_path / "mrpc", train_rows=1200, val_rows=100)
    out = run_script(EXAMPLES / "train_hf_trainer.py", str(data), str(tmp_path / "run"), processes=1).stdout
    assert re.search(r"^eval: 100 rows, loss \d\.\d{4}, accuracy \d\.\d{3}$", out, re.M), out
    labels = pq.read_table(data / "validation-00000-of-00001.parquet").column("label").to_pylist()[:8]
    assert f"predict: 100 rows in split order, labels [{' '.join(map(str, labels))}]" in out
    assert (tmp_path / "run" / "checkpoint-60" / "padpipe_loader_0.pt").is_file()


def test_accelerate_example_trains_one_epoch(parquet):
    pytest.importorskip("accelerate")
    out = run_script(EXAMPLES / "train_accelerate.py", parquet, processes=1).stdout
    assert re.search(r"^rank 0/1: \d+ steps, 1,000 rows$", out, re.M), out


def test_lightning_example_trains_two_epochs_with_a_last_checkpoint(parquet, tmp_path):
    pytest.importorskip("lightning")
    out = run_script(EXAMPLES / "train_lightning.py", parquet, str(tmp_path), processes=1).stdout
    assert re.search(r"^rank 0/1: \d+ steps, 2 epochs$", out, re.M), out
    assert (tmp_path / "last.ckpt").is_file()
