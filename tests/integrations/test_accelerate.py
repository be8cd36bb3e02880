"""Accelerate under torchrun x2: ``prepare(..., pipe.loader(num_workers=2))``; ``prepare(DataLoader(pipe))`` fails."""

from __future__ import annotations

import json
import os
import re

import pyarrow.parquet as pq
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("accelerate")
pytest.importorskip("transformers")

import padpipe as pp  # noqa: E402
from tests.integrations.tiny import torchrun  # noqa: E402

pytestmark = pytest.mark.timeout(300)
ROWS = 2000
FIX = (
    r"Fix: pass `pipe\.loader\(\.\.\.\)` to `accelerator\.prepare\(\.\.\.\)` instead \(Accelerate passes it "
    r"through; padpipe shards by rank and worker and keeps steps equal across ranks\), or use "
    r"`padpipe\.hf\.Trainer` with transformers' Trainer\."
)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("accelerate")
    table = pq.read_table(pp.examples.SAMPLE_PARQUET).slice(0, ROWS)
    pq.write_table(table, out / "train.parquet", row_group_size=250)
    torchrun("accelerate_run.py", str(out / "train.parquet"), str(out))
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


def test_accelerate_passes_the_loader_through_and_trains_every_row_once_per_epoch(ranks):
    assert all(rank["passed_through"] for rank in ranks)
    for epoch in range(2):
        steps = [rank["epochs"][epoch]["steps"] for rank in ranks]
        assert steps[0] == steps[1] > 0
        rows = [i for rank in ranks for i in rank["epochs"][epoch]["ids"]]
        assert len(rows) == len(set(rows)) and len(rows) >= 0.99 * ROWS  # at most 1% held back by stop_first
    assert ranks[0]["epochs"][0]["ids"] != ranks[0]["epochs"][1]["ids"]


def test_accelerate_loader_state_saved_per_rank_resumes_exactly(ranks):
    assert [rank["resumed"] for rank in ranks] == [True, True]


@pytest.mark.parametrize(
    "case, wrapper",
    [
        ("dispatch", "DataLoaderDispatcher"),
        ("shard", "IterableDatasetShard"),
        ("shard_in_workers", "IterableDatasetShard"),
    ],
)
def test_accelerate_prepare_of_a_dataloader_over_a_pipeline_fails_naming_the_fix(ranks, case, wrapper):
    for rank in ranks:
        message = rank["errors"][case]
        if case == "shard_in_workers":  # raised in a DataLoader worker, re-raised by the DataLoader
            assert message.startswith("Caught RuntimeError in DataLoader worker process")
            message = message[message.index("RuntimeError: A padpipe") + len("RuntimeError: ") :]
        assert message.startswith(f"A padpipe pipeline is read through accelerate's {wrapper} over 2 processes: ")
        assert re.search(FIX, message)


def test_accelerate_save_state_of_a_registered_loader_fails_at_the_first_save(ranks):
    for rank in ranks:  # not at the resume, where every rank would load rank 0's state
        assert re.match(
            r"^Accelerate's save_state is saving pipe\.loader\(\) \(given to register_for_checkpointing\) from rank 0 "
            r"of 2 alone, which no other rank could resume from: do not register the loader; save each rank's ",
            rank["registered"],
        )


def test_accelerate_save_state_of_a_registered_loader_resumes_on_one_process(tmp_path):
    from accelerate import Accelerator

    pipe = pp.from_iterable([{"text": f"row {i}", "i": i} for i in range(10)]).tokenize(pp.examples.tokenizer())
    pipe = pipe.batch(2).pad()
    accelerator, loader = Accelerator(cpu=True), pipe.loader()
    accelerator.register_for_checkpointing(loader)
    batches = iter(loader)
    first = next(batches)["i"].tolist()
    accelerator.save_state(tmp_path / "state")
    again = Accelerator(cpu=True)
    resumed = pipe.loader()
    again.register_for_checkpointing(resumed)
    again.load_state(tmp_path / "state")
    assert first + [i for b in resumed for i in b["i"].tolist()] == list(range(10))


def test_accelerate_prepare_of_a_dataloader_is_fine_on_one_process():
    from accelerate import Accelerator
    from torch.utils.data import DataLoader

    pipe = (
        pp.from_iterable([{"text": f"row {i}", "i": i} for i in range(10)])
        .tokenize(pp.examples.tokenizer())
        .batch(4)
        .pad()
    )
    prepared = Accelerator(cpu=True).prepare(DataLoader(pipe, batch_size=None))
    assert sorted(i for batch in prepared for i in batch["i"].tolist()) == list(range(10))
