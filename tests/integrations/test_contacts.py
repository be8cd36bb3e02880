"""Every private name of a framework that an adapter reads, pinned against the installed release.

Each adapter keeps its contacts in one table (Lightning: ``lightning_fit.CONTACTS``; Accelerate and
torch's fetcher: ``guard.ACCELERATE`` / ``guard.TORCH_FETCHER``; torchdata's snapshot:
``runtime.loader_snapshot.PARTS``; transformers: ``hf_hooks.HOOKS``, pinned with the behaviour of
each hook in test_hf_hooks*.py). A release that renames one fails here, by name, on ``make
test-latest``, before an adapter could quietly fall back to a weaker guarantee. What the loops do
with them is pinned by the framework tests that run them (test_lightning_bare.py, test_accelerate.py,
test_workers_state.py).
"""

from __future__ import annotations

import functools
import importlib
import inspect

import pytest

import padpipe as pp
from padpipe.integrations import guard, lightning_fit
from padpipe.runtime.loader_snapshot import ITERATOR_PARTS, PARTS


def resolve(root, path: str):
    return functools.reduce(getattr, path.split("."), root)


@pytest.mark.parametrize(("module", "path"), lightning_fit.CONTACTS, ids=[p for _, p in lightning_fit.CONTACTS])
def test_every_lightning_contact_exists(module, path):
    pytest.importorskip("lightning")
    from lightning.pytorch import Trainer

    owner, _, rest = path.partition(".")
    cls = getattr(importlib.import_module(module), owner)
    if not rest:
        return
    if owner == "_FitLoop":  # set in __init__: read on a real trainer's fit loop
        instance = Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False).fit_loop
    else:
        instance = cls()
    assert isinstance(instance, cls)
    resolve(instance, rest)  # AttributeError names what Lightning renamed


def test_lightning_loop_names_are_the_loops_lightning_has():
    pytest.importorskip("lightning")
    from lightning.pytorch import loops

    for name in lightning_fit.FIT_LOOPS + lightning_fit.OTHER_LOOPS:
        assert name.endswith("Loop") and hasattr(loops, name), name


@pytest.mark.parametrize(("module", "name", "attribute"), guard.ACCELERATE)
def test_every_accelerate_contact_exists(module, name, attribute):
    pytest.importorskip("accelerate")
    cls = getattr(importlib.import_module(module), name)
    first = attribute.split(".")[0]
    source = inspect.getsource(cls.__init__)
    assert f"self.{first} = " in source or first in inspect.signature(cls.__init__).parameters, (name, first)


def test_torchs_fetcher_contact_exists():
    module, name, flag = guard.TORCH_FETCHER
    cls = getattr(importlib.import_module(module), name)
    assert f"self.{flag} = " in inspect.getsource(importlib.import_module(module)) or flag in inspect.getsource(cls)
    assert "iter(dataset)" in inspect.getsource(cls.__init__)  # the frame whose caller check_caller reads


@pytest.mark.timeout(120)
def test_every_torchdata_snapshot_part_exists_in_a_real_statefuldataloader_state():
    """The parts WorkerProcesses reads of torchdata's StatefulDataLoader state, on a real one with a worker."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    pipe = pp.from_iterable([{"text": t} for t in "abcd"]).tokenize(pp.examples.tokenizer()).batch(1).pad()
    loader = StatefulDataLoader(pipe, batch_size=None, num_workers=1)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    for path, kind, _ in PARTS:
        assert isinstance(functools.reduce(lambda v, k: v[k], path, state), kind), path
    iterator = state["_snapshot"]["_worker_snapshots"]["worker_0"]["fetcher_state"]["dataset_iter_state"]
    for key, kind, _ in ITERATOR_PARTS:
        assert isinstance(iterator[key], kind), key
    del it
