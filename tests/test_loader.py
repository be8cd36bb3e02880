"""pipe.loader(): one pass per epoch in this process or in worker processes, exact resume, epoch ends right."""

from __future__ import annotations

import pickle

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader

import padpipe as pp
from padpipe import Consumer
from padpipe.pipes.device import DevicePrefetcher
from padpipe.runtime.workers import WorkerProcesses
from tests.contract import check_loader_resume, normalize


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("loader") / "d.parquet"
    rows = pq.read_table(pp.examples.SAMPLE_PARQUET).slice(0, 600)
    pq.write_table(rows, path, row_group_size=250)  # 3 uneven row groups
    return str(path)


def pipeline(path: str) -> pp.Pipeline:
    return (
        pp.read_parquet(path, chunk_rows=100)
        .shuffle(buffer_size=200, seed=3)
        .tokenize(pp.examples.tokenizer(), fields=("sentence1", "sentence2"), max_length=64, num_threads=1)
        .bucket(max_tokens=2048, buffer_size=200)
        .pad()
    )


def ids(batches) -> list[int]:
    return sorted(i for b in batches for i in b["idx"].tolist())


@pytest.mark.parametrize("num_workers", [0, 2])
def test_loader_reads_every_row_once_per_epoch_and_epochs_differ(data, num_workers):
    loader = pipeline(data).loader(num_workers=num_workers)
    first, second = list(loader), list(loader)
    expected = list(range(600))
    assert ids(first) == ids(second) == expected
    assert [b["idx"].tolist() for b in first] != [b["idx"].tolist() for b in second]


def test_loader_with_workers_yields_what_its_workers_read_in_a_fixed_order(data):
    runs = [[normalize(b) for b in pipeline(data).loader(num_workers=2)] for _ in range(2)]
    assert runs[0] == runs[1]


def test_loader_with_workers_resumes_exactly(data):
    check_loader_resume(lambda: pipeline(data).loader(num_workers=2), steps=[0, 3, 7, 9, 10, 11, 15])


def test_loader_resumes_exactly_at_epoch_ends_as_the_ordinary_loop(data):
    """The loop `for epoch in range(saved, E): for b in loader` trains no extra epoch after a resume."""
    loader = pipeline(data).loader()
    epochs = 3
    reference, saved = [], None
    for epoch in range(epochs):
        batches = []
        for batch in loader:
            batches.append(normalize(batch))
            if epoch == 0:
                saved = (epoch, pickle.dumps(loader.state_dict()))  # the last one is after the last batch
        reference.append(batches)
    start, state = saved
    fresh = pipeline(data).loader()
    fresh.load_state_dict(pickle.loads(state))
    resumed = [[normalize(b) for b in fresh] for _ in range(start, epochs)]
    assert resumed == [[], *reference[1:]]


def test_loader_state_before_the_first_batch_starts_at_epoch_zero(data):
    reference = [normalize(b) for b in pipeline(data).loader()]
    state = pipeline(data).loader().state_dict()
    used = pipeline(data).loader()
    list(used)
    used.load_state_dict(state)
    assert [normalize(b) for b in used] == reference


def test_loader_with_workers_runs_a_trailing_prefetch_stage_in_this_process(data):
    loader = pipeline(data).prefetch(2).loader(num_workers=2, equal_steps="off")
    prefetcher = loader.root.source  # under the failure latch that keeps its errors
    assert isinstance(prefetcher, DevicePrefetcher) and isinstance(prefetcher.source, WorkerProcesses)
    assert ids(loader) == list(range(600))


def test_loader_with_workers_takes_dataloader_options(data):
    loader = pipeline(data).loader(num_workers=1, prefetch_factor=4, timeout=60, multiprocessing_context="spawn")
    assert ids(loader) == list(range(600))


def test_loader_state_of_another_rank_count_asks_for_every_rank(data, monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    loader = pipeline(data).loader(num_workers=2)
    next(iter(loader))
    state = loader.state_dict()
    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(
        pp.StateMismatchError,
        match=r"^PipelineLoader state was saved by rank 0 of 2 with 2 workers, "
        r"but this loader is rank 0 of 3 with 0 workers: to resume on another layout, pass the states "
        r"of all 2 saved ranks, loader.load_state_dict\(\[state_rank0, \.\.\.\]\) \(docs/elastic\.md\)\.$",
    ):
        pipeline(data).loader().load_state_dict(state)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_loader_shares_by_global_rank_on_a_node_of_several(data, monkeypatch, num_workers):
    """Node 1 of 2 under torchrun: global rank 3 of 4 reads its quarter, not local rank 1 of 2's half."""
    for name, value in {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("GROUP_RANK", "1")
    loader = pipeline(data).loader(num_workers=num_workers)
    graph = pipeline(data).build(consumer=Consumer(rank=3, world_size=4))
    graph.reset()
    quarter = ids(graph)
    assert len(quarter) == 150 and ids(loader) == quarter
    assert loader.state_dict()["layout"] == [3, 4, num_workers]


def test_loader_raises_error_when_options_need_workers(data):
    with pytest.raises(ValueError, match=r"^`num_workers` must be an int >= 0, but is -1 instead\.$"):
        pipeline(data).loader(num_workers=-1)
    with pytest.raises(ValueError, match=r"^`pin_memory`, `prefetch_factor` and `timeout` need `num_workers` > 0\.$"):
        pipeline(data).loader(pin_memory=True)


def test_shard_off_makes_every_rank_read_everything(data, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert len(ids(pipeline(data).loader())) == 300
    assert ids(pipeline(data).shard("off").loader()) == list(range(600))
    assert ids(pipeline(data).shard("off").loader(num_workers=2)) == list(range(600))
    with pytest.raises(ValueError, match=r"^`mode` must be one of \('auto', 'off'\), but is 'ranks' instead\.$"):
        pipeline(data).shard("ranks")


def test_record_pipelines_load_in_workers_too(tmp_path):
    pq.write_table(pa.table({"n": list(range(10))}), tmp_path / "n.parquet", row_group_size=3)
    batches = list(pp.read_parquet(str(tmp_path / "n.parquet"), chunk_rows=2).loader(num_workers=2))
    assert sorted(n for b in batches for n in b.column("n").to_pylist()) == list(range(10))


def test_loader_with_workers_sums_its_workers_stats(data):
    alone = pipeline(data).loader()
    list(alone)
    loader = pipeline(data).loader(num_workers=2)
    first = len(list(loader))
    one = loader.stats()
    assert (one.rows, one.batches, one.real_tokens) == (600, first, alone.stats().real_tokens)
    assert one.counters["read.rows"] == 600 and one.seconds["tokenize"] > 0
    second = len(list(loader))
    two = loader.stats()
    assert (two.rows, two.batches) == (1200, first + second)
    assert two.counters["workers.epochs_started"] == 2


BATCHED_AGAIN = (
    r"^A padpipe pipeline yields ready batches, but the torch DataLoader reading it batches them again \(its "
    r"batch_size is not None\), so its collate_fn would stack several padpipe batches into one\. Fix: with "
    r"transformers, use padpipe\.hf\.Trainer \(it reads the pipeline's batches as they are\); with a DataLoader, "
    r"pass batch_size=None, or iterate pipe\.loader\(\.\.\.\)\.$"
)


def test_a_dataloader_that_batches_a_pipeline_again_raises_naming_the_fix(data):
    """Issue 30 item 7: plain transformers.Trainer's DataLoader(pipe, batch_size=8) crashed deep in the model."""
    pipe = pipeline(data)
    for make in (DataLoader, StatefulDataLoader):  # torch's fetcher calls iter(pipe): the contact guard.py pins
        with pytest.raises(RuntimeError, match=BATCHED_AGAIN):
            next(iter(make(pipe, batch_size=8)))
        assert ids(make(pipe, batch_size=None)) == list(range(600))
    records = pp.read_parquet(data)  # record batches are not padpipe's batches: a collate_fn of the user's may
    assert next(iter(DataLoader(records, batch_size=2, collate_fn=lambda b: b[0]))).num_rows > 0
