"""End-to-end resume: read_parquet -> shuffle -> tokenize -> bucket(max_tokens) -> pad, checkpointed anywhere.

Through ``pipe.loader()`` (every step on a small input, random steps on a larger one), through
``StatefulDataLoader(pipe, num_workers=2)``, and with states from other pipelines (rejected).
"""

from __future__ import annotations

import pickle

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from torchdata.stateful_dataloader import StatefulDataLoader

import padpipe as pp
from tests.contract import check_loader_resume, normalize

WORDS = "alpha beta gamma delta the cat sat on a mat and ran far away over hills".split()


def write_dataset(path, rows: int, group_sizes: list[int]) -> str:
    """``rows`` texts of 1..40 words with a ``rid`` column, in row groups cycling through ``group_sizes``."""
    rng = np.random.default_rng(rows)
    lengths = rng.integers(1, 40, rows)
    texts = [" ".join(WORDS[(i + j) % len(WORDS)] for j in range(n)) for i, n in enumerate(lengths)]
    table = pa.table({"text": texts, "rid": np.arange(rows)})
    with pq.ParquetWriter(str(path), table.schema) as writer:
        start, g = 0, 0
        while start < rows:
            size = group_sizes[g % len(group_sizes)]
            writer.write_table(table.slice(start, size))
            start, g = start + size, g + 1
    return str(path)


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> str:
    return write_dataset(tmp_path_factory.mktemp("small") / "small.parquet", 90, [7, 20, 13])


@pytest.fixture(scope="module")
def large(tmp_path_factory) -> str:
    return write_dataset(tmp_path_factory.mktemp("large") / "large.parquet", 1500, [100, 37, 180])


def full(
    path: str,
    *,
    seed: int = 0,
    max_tokens: int | None = 256,
    batch_size: int | None = None,
    chunk_rows: int = 8,
    buffer: int = 24,
) -> pp.Pipeline:
    return (
        pp.read_parquet(path, chunk_rows=chunk_rows)
        .shuffle(buffer_size=buffer, seed=seed)
        .tokenize(pp.examples.TOKENIZER_JSON, fields="text", max_length=64)
        .bucket(batch_size, max_tokens=max_tokens, buffer_size=buffer + 8)
        .pad(pad_to_multiple_of=8)
    )


def rids(batches) -> list[int]:
    return [r for b in batches for r in b["rid"].tolist()]


def test_loader_resumes_a_full_pipeline_at_every_step(small):
    loader = full(small).loader()
    epochs = [rids(loader) for _ in range(2)]
    assert all(sorted(e) == list(range(90)) for e in epochs) and epochs[0] != epochs[1]
    check_loader_resume(full(small).loader, epochs=2)


@pytest.mark.slow  # seconds alone: make test runs it, test-fast leaves it out
def test_loader_resumes_a_full_pipeline_at_random_steps(large):
    make = lambda: full(large, chunk_rows=64, buffer=200, max_tokens=1024).loader()  # noqa: E731
    steps = np.random.default_rng(7).choice(np.arange(1, 99), size=3, replace=False).tolist()
    check_loader_resume(make, epochs=2, steps=sorted([0, 49] + steps))  # 50 batches per epoch


def sdl_epochs(pipe: pp.Pipeline, first: int, last: int, state: dict | None = None):
    """Batches and loader states per epoch ``first..last`` through a fresh StatefulDataLoader."""
    loader = StatefulDataLoader(pipe, batch_size=None, num_workers=2)
    if state is not None:
        loader.load_state_dict(state)
    out = []
    for epoch in range(first, last + 1):
        pipe.set_epoch(epoch)
        batches, states = [], []
        for batch in loader:
            batches.append(normalize(batch))
            states.append(pickle.dumps(loader.state_dict()))
        out.append((batches, states, pickle.dumps(loader.state_dict())))
    return out


@pytest.mark.slow  # seconds alone: make test runs it, test-fast leaves it out
def test_stateful_dataloader_resumes_a_full_pipeline(small):
    (ref0, states0, done0), (ref1, _, _) = sdl_epochs(full(small), 0, 1)
    assert sorted(r for b in ref0 for r in b["rid"][2]) == list(range(90)) and ref0 != ref1
    # mid-epoch (one worker may already be done) and after the epoch's last batch, inside the loop
    for k in (0, len(ref0) // 2, len(ref0) - 3, len(ref0) - 1):
        (rest0, _, _), (again1, _, _) = sdl_epochs(full(small), 0, 1, pickle.loads(states0[k]))
        assert rest0 == ref0[k + 1 :], f"resume after batch {k} differs"
        assert again1 == ref1, f"the epoch after resuming after batch {k} differs"
    # a state saved after the loop ended: the loader starts the next epoch (as set with set_epoch)
    [(again1, _, _)] = sdl_epochs(full(small), 1, 1, pickle.loads(done0))
    assert again1 == ref1


def mismatch(state_from: pp.Pipeline, resume_in: pp.Pipeline, **loader) -> None:
    old = state_from.loader(**loader)
    next(iter(old))
    fresh = resume_in.loader()
    fresh.load_state_dict(pickle.loads(pickle.dumps(old.state_dict())))
    next(iter(fresh))


def test_resume_raises_error_when_state_is_from_another_pipeline(small, large):
    with pytest.raises(
        pp.StateMismatchError,
        match=r"^Bucketizer state doesn't match this pipeline: setting 'seed' found 1 instead of 2\.$",
    ):
        mismatch(full(small, seed=1), full(small, seed=2))
    with pytest.raises(
        pp.StateMismatchError,
        match=r"^ParquetReader state doesn't match this pipeline: its files changed since the state was saved \(1 file as when saved, but other names: files were renamed, or added and removed; the file being read, \S+/large\.parquet, is no longer listed\); resuming would read other rows\. Resume with the files as they were, or start a new run\.$",
    ):
        mismatch(full(large), full(small))
    with pytest.raises(
        pp.StateMismatchError,
        match=r"^Bucketizer state doesn't match this pipeline: setting 'max_tokens' found 256 instead of 512\.$",
    ):
        mismatch(full(small), full(small, max_tokens=512))
    with pytest.raises(
        pp.StateMismatchError,
        match=r"^Bucketizer state doesn't match this pipeline: setting 'batch_size' found None instead of 8\.$",
    ):
        mismatch(full(small), full(small, max_tokens=None, batch_size=8))
    with pytest.raises(
        pp.StateMismatchError,
        match=r"^PipelineLoader state doesn't match this pipeline: setting 'equal_steps' found 'off' instead of 'balance'\.$",
    ):
        mismatch(full(small), full(small), equal_steps="off")
