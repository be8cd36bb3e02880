"""Processes that build, break and abandon many loaders exit cleanly (issue 13.13 and 13.12); dropped loaders stop their workers.

A daemon thread still inside native code when Python finalizes aborts the process
(``terminate called without an active exception`` / ``FATAL: exception not rethrown``, exit 134)
after all its work is done. Each run here is a fresh process that leaves loaders behind in every
way a program can: mid-epoch with read-ahead threads busy, after a data error, after a rejected
state, with prefetch and thread-pool tokenization; it must exit 0 with nothing on stderr (no
"Exception ignored in" noise from thread objects either).
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import subprocess
import sys
import textwrap
import types
import weakref

import pytest

import padpipe as pp
from padpipe.runtime import workers as workers_module
from padpipe.runtime.workers import _shutdown

SCRIPT = textwrap.dedent(
    """
    import gc, json, os, sys, tempfile
    import padpipe as pp

    folder = tempfile.mkdtemp()
    rows = [{"text": " ".join(["word"] * (1 + i % 40)), "id": i} for i in range(3000)]
    with open(os.path.join(folder, "good.jsonl"), "w") as f:
        f.write("\\n".join(json.dumps(r) for r in rows) + "\\n")
    with open(os.path.join(folder, "bad.jsonl"), "w") as f:
        f.write("\\n".join(json.dumps(r if i != 700 else {"id": i, "text": None}) for i, r in enumerate(rows)) + "\\n")
    tok = pp.examples.tokenizer()

    def pipe(name, threads):
        return (pp.read_jsonl(os.path.join(folder, name), chunk_rows=64).shuffle(buffer_size=500, seed=1)
                .tokenize(tok, num_threads=threads).bucket(max_tokens=1024, buffer_size=400).pad().prefetch(4))

    kept = []
    for round in range(int(sys.argv[1])):
        threads = 1 + round % 3
        # abandoned mid-epoch, read-ahead threads busy
        loader = pipe("good.jsonl", threads).loader()
        it = iter(loader)
        next(it)
        state = loader.state_dict()
        kept.append(it)
        # broken by a bad row, then left
        bad = iter(pipe("bad.jsonl", threads).loader())
        try:
            for _ in bad:
                pass
        except pp.DataError:
            pass
        # a rejected state, then left
        other = pp.read_jsonl(os.path.join(folder, "good.jsonl"), chunk_rows=64).shuffle(buffer_size=500, seed=2)
        other = other.tokenize(tok, num_threads=threads).bucket(max_tokens=1024, buffer_size=400).pad().prefetch(4).loader()
        other.load_state_dict(state)
        try:
            next(iter(other))
        except pp.StateMismatchError:
            pass
        # resumed and left mid-epoch
        again = pipe("good.jsonl", threads).loader()
        again.load_state_dict(state)
        kept.append(iter(again))
        next(kept[-1])
    # last, loaders dropped while their threads are busy, and the process ends at once
    for threads in (1, 2, 3):
        it = iter(pipe("good.jsonl", threads).loader())
        next(it)
        del it
    gc.collect()
    print("done", flush=True)
    """
)


@pytest.mark.timeout(120)
def test_processes_that_abandon_broken_loaders_exit_cleanly(tmp_path) -> None:
    env = {**os.environ, "PYTHONPATH": os.getcwd(), "PYTHONFAULTHANDLER": "1"}
    for run in range(5):
        done = subprocess.run(
            [sys.executable, "-c", SCRIPT, "4"], capture_output=True, text=True, timeout=60, cwd=tmp_path, env=env
        )
        assert (done.returncode, done.stdout, done.stderr) == (0, "done\n", ""), f"run {run}"


THREADS_AT_EXIT = textwrap.dedent(
    """
    import atexit, gc, threading, time

    @atexit.register  # registered before padpipe's own handler, so it runs after it
    def report():
        alive = sorted(t.name for t in threading.enumerate() if t is not threading.main_thread())
        print("alive at exit:", alive, flush=True)

    import padpipe as pp
    from torchdata.nodes import BaseNode

    class Slow(BaseNode):  # a stage that takes 0.5 s per item, like a slow remote read
        def __init__(self, source):
            super().__init__()
            self.source = source
        def reset(self, initial_state=None):
            super().reset(initial_state)
            self.source.reset(initial_state)
        def next(self):
            time.sleep(0.5)
            return next(self.source)
        def get_state(self):
            return self.source.state_dict()

    rows = [{"text": "some words here", "id": i} for i in range(200)]
    pipe = (pp.from_iterable(rows, chunk_rows=8).tokenize(pp.examples.tokenizer(), num_threads=2).batch(4).pad()
            .add_stage("slow", lambda up, ctx: Slow(up), output="tensors").prefetch(2))
    for _ in range(3):
        it = iter(pipe.loader())
        next(it)
        del it  # abandoned: its producer object is collected, its thread is mid-item
    gc.collect()
    """
)


@pytest.mark.timeout(60)
def test_threads_of_abandoned_loaders_are_stopped_and_joined_at_exit(tmp_path) -> None:
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    done = subprocess.run(
        [sys.executable, "-c", THREADS_AT_EXIT], capture_output=True, text=True, timeout=50, cwd=tmp_path, env=env
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "alive at exit: []\n", "")


def abandoned_loaders():
    """Loaders with 2 worker processes, each taken 3 batches into an epoch: bucketed, packed in windows, moved."""
    tok = pp.examples.tokenizer()
    rows = pp.read_parquet(pp.examples.SAMPLE_PARQUET, chunk_rows=64)
    yield (
        rows.shuffle(1000)
        .tokenize(tok, fields=("sentence1", "sentence2"))
        .bucket(max_tokens=4096)
        .pad()
        .loader(num_workers=2)
    )
    yield rows.tokenize(tok, fields="sentence1").pack(128, batch_size=4).loader(num_workers=2, accumulation_steps=3)
    yield rows.tokenize(tok, fields="sentence1").batch(8).pad().to("cpu").loader(num_workers=2)


@pytest.mark.slow  # seconds alone: make test runs it, test-fast leaves it out
@pytest.mark.timeout(120)
def test_an_abandoned_loader_stops_its_workers_when_dropped_even_in_a_reference_cycle(monkeypatch) -> None:
    gc.disable()  # what frees the loader is reference counting alone: no cycle in the loader's layers
    try:
        for loader in abandoned_loaders():
            it = iter(loader)
            for _ in range(3):
                next(it)
            assert len(multiprocessing.active_children()) == 2
            del it, loader
            assert multiprocessing.active_children() == []
    finally:
        gc.enable()
    # a user's cycle holds it: the collector frees it and padpipe's finalizer stops the workers while torch's
    # queues are still open, so each worker exits on its own (exit code 0). The regression this guards against
    # is torch's ``__del__`` doing it after the queues closed: it waits 5 s for each worker, then terminates it
    # (exit code -15). Which path ran is checked, never how long it took (a loaded machine is slow either way).
    stopped: list[list[int | None]] = []

    def shutdown(it):
        workers = list(getattr(it, "_workers", ()))  # none for a loader already closed
        assert all(w.is_alive() for w in workers), "the workers had stopped before padpipe's finalizer"
        _shutdown(it)
        if workers:
            stopped.append([w.exitcode for w in workers])

    monkeypatch.setattr(workers_module, "_shutdown", shutdown)
    for loader in abandoned_loaders():
        it = iter(loader)
        next(it)
        holder: dict = {"it": it}
        holder["self"] = holder
        del it, loader, holder
        gc.collect()
        assert multiprocessing.active_children() == []
    assert stopped == [[0, 0]] * 3  # each loader's workers: stopped by padpipe's finalizer, each exiting by itself


def test_a_loader_iterated_while_frameworks_are_imported_is_freed_when_dropped(monkeypatch) -> None:
    for name in ("lightning", "accelerate"):  # their checks then look at the frames above the loader
        monkeypatch.setitem(sys.modules, name, sys.modules.get(name) or types.ModuleType(name))
    rows = pp.read_parquet(pp.examples.SAMPLE_PARQUET)
    loader = rows.tokenize(pp.examples.tokenizer(), fields="sentence1").batch(8).pad().loader()
    it = iter(loader)
    next(it)
    loader.load_state_dict(loader.state_dict())  # the check of who saves or restores it looks too
    gone = weakref.ref(loader)
    gc.disable()
    try:
        del it, loader
        assert gone() is None  # no adapter left a snapshot of this function's locals holding the loader
    finally:
        gc.enable()
