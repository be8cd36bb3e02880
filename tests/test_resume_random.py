"""Randomized resume over several pipelines, each state loaded in a fresh process with ``weights_only=True``.

For each pipeline the reference run reads two epochs through ``pipe.loader()`` and saves the state
after every batch with ``torch.save``. A seeded draw picks a few states per pipeline (always one
taken right after an epoch's last batch, inside the loop); a fresh Python process per pipeline
loads each of them into a new loader with ``torch.load(..., weights_only=True)`` and reads on.

* A mid-epoch state continues with exactly the rest of that epoch, then the next epoch is exact.
* A state taken after an epoch's last batch: the first pass that yields anything is exactly the
  next epoch (whether the loader first ends the finished epoch with an empty pass or goes straight
  on is the loader's epoch-boundary rule, not checked here).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import random
import subprocess
import sys
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import padpipe as pp
from tests.contract import normalize

SEED = 20261201
STATES_PER_PIPELINE = 3
WORDS = "alpha beta gamma delta the cat sat on a mat and ran far away over hills".split()


def write_data(folder: str) -> None:
    """Three Parquet files of 150 rows (row groups of 40) and a gzipped JSONL file of 300 documents."""
    rng = np.random.default_rng(5)
    for i in range(3):
        texts = [" ".join(rng.choice(WORDS, rng.integers(1, 36))) for _ in range(150)]
        table = pa.table({"text": texts, "rid": np.arange(150 * i, 150 * (i + 1))})
        pq.write_table(table, os.path.join(folder, f"part-{i}.parquet"), row_group_size=40)
    docs = [{"text": " ".join(rng.choice(WORDS, rng.integers(5, 120))), "id": i} for i in range(300)]
    with gzip.open(os.path.join(folder, "docs.jsonl.gz"), "wt") as f:
        f.write("\n".join(json.dumps(d) for d in docs) + "\n")


def pipelines(folder: str) -> dict[str, pp.Pipeline]:
    tok = pp.examples.TOKENIZER_JSON
    parquet = pp.read_parquet(os.path.join(folder, "*.parquet"), chunk_rows=32)
    return {
        "shuffle_bucket_tokens": parquet.shuffle(buffer_size=100, seed=3)
        .tokenize(tok, max_length=40)
        .bucket(max_tokens=300, buffer_size=120)
        .pad(pad_to_multiple_of=8),
        "bucket_rows_prefetch": parquet.tokenize(tok, num_threads=3)
        .bucket(12, buffer_size=64, drop_last=True)
        .pad()
        .prefetch(3),
        "pack": pp.read_jsonl(os.path.join(folder, "docs.jsonl.gz"), chunk_rows=32)
        .shuffle(buffer_size=80, seed=1)
        .tokenize(tok, max_length=200)
        .pack(128, batch_size=4, buffer_size=32),
        "mix_cycle": pp.mix(
            {
                "a": parquet.tokenize(tok, max_length=24),
                "b": pp.read_parquet(os.path.join(folder, "part-1.parquet"), chunk_rows=16).tokenize(
                    tok, max_length=24
                ),
            },
            weights={"a": 2, "b": 1},
            stop="cycle",
            seed=2,
            chunk_rows=20,
        )
        .batch(10)
        .pad(),
        "batch_one_thread": parquet.shuffle(buffer_size=50, seed=9)
        .tokenize(tok, max_length=16, num_threads=1)
        .batch(9)
        .pad(),
    }


def digest(batch: Any) -> str:
    return hashlib.sha1(json.dumps(normalize(batch), sort_keys=True).encode()).hexdigest()


def child(folder: str, jobs_file: str) -> None:
    """In a fresh process: load each job's state into a new loader and report the digests of the passes after it."""
    built = pipelines(folder)
    out = []
    for job in json.loads(open(jobs_file).read()):
        loader = built[job["pipeline"]].loader()
        loader.load_state_dict(torch.load(job["state"], weights_only=True))
        out.append([[digest(b) for b in loader] for _ in range(job["passes"])])
    print(json.dumps(out))


def reference(pipe: pp.Pipeline, folder: str, name: str) -> tuple[list[list[str]], list[tuple[int, int]]]:
    """Two epochs' batch digests; the state after every batch saved as ``<name>-<epoch>-<k>.pt``."""
    loader = pipe.loader()
    epochs: list[list[str]] = []
    states: list[tuple[int, int]] = []  # (epoch, batches of it done)
    for epoch in range(2):
        batches = []
        for batch in loader:
            batches.append(digest(batch))
            torch.save(loader.state_dict(), os.path.join(folder, f"{name}-{epoch}-{len(batches)}.pt"))
            states.append((epoch, len(batches)))
        epochs.append(batches)
    return epochs, states


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict[str, tuple[list, list, list]]:
    folder = str(tmp_path_factory.mktemp("random_resume"))
    write_data(folder)
    plan, jobs = {}, []
    built = pipelines(folder)
    assert sorted(built) == ["batch_one_thread", "bucket_rows_prefetch", "mix_cycle", "pack", "shuffle_bucket_tokens"]
    for name, pipe in built.items():
        epochs, states = reference(pipe, folder, name)
        boundary = (0, len(epochs[0]))
        inside = [s for s in states if s != boundary and s[1] < len(epochs[s[0]])]
        picked = [boundary] + random.Random(f"{SEED}-{name}").sample(inside, STATES_PER_PIPELINE - 1)
        plan[name] = (epochs, picked)
        jobs += [
            {
                "pipeline": name,
                "state": os.path.join(folder, f"{name}-{e}-{k}.pt"),
                "passes": 3 if k == len(epochs[e]) else 2,
            }
            for e, k in picked
        ]
    jobs_file = os.path.join(folder, "jobs.json")
    with open(jobs_file, "w") as f:
        json.dump(jobs, f)
    code = f"from tests.test_resume_random import child; child({folder!r}, {jobs_file!r})"
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=200, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    passes = iter(json.loads(done.stdout))
    return {name: (epochs, picked, [next(passes) for _ in picked]) for name, (epochs, picked) in plan.items()}


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    "name", ["batch_one_thread", "bucket_rows_prefetch", "mix_cycle", "pack", "shuffle_bucket_tokens"]
)
def test_random_states_resume_exactly_in_a_fresh_process(results, name) -> None:
    epochs, picked, passes_per_state = results[name]
    assert all(len(e) >= 4 for e in epochs) and epochs[0] != epochs[1]
    for (epoch, k), passes in zip(picked, passes_per_state):
        where = f"{name}: state after batch {k} of epoch {epoch} (seed {SEED})"
        if k < len(epochs[epoch]):
            assert passes[0] == epochs[epoch][k:], where
            if epoch == 0:
                assert passes[1] == epochs[1], f"{where}: the next epoch"
        else:
            first = next((p for p in passes if p), None)
            assert passes[0] in ([], epochs[epoch + 1]) and first == epochs[epoch + 1], where
