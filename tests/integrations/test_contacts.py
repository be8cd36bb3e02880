"""Every private name of a framework that an adapter reads, pinned against the installed release.

Each adapter keeps its contacts in one table (Lightning: ``loader_guard.LIGHTNING``, ``LOADER_SLOT`` and
``LIGHTNING_TRAINER``; Accelerate and torch's fetcher: ``guard.ACCELERATE``, ``loader_guard.ACCELERATE_SAVE`` and
``guard.TORCH_FETCHER``; torchdata's snapshot and worker
shutdown: ``runtime.loader_snapshot.PARTS`` / ``SHUTDOWN``; transformers: ``hf_hooks.HOOKS``, pinned
with the behaviour of each hook in test_hf_hooks*.py, and the attributes ``hf_hooks.ATTRIBUTES``
(Accelerate's ``_models`` too); the packing check's ``inspection.packing_causes.CONTACTS``;
datasets: ``readers.hf.FINGERPRINT`` and ``readers.arrow.SAVED_FILES``; torchtitan:
``titan_api.CONTACTS``, pinned in test_torchtitan_api.py). Code that reads one raises naming it when
it is gone, never falls back quietly. A release that renames one fails here, by name, on ``make
test-latest``, before an adapter could quietly fall back to a weaker guarantee. What the loops do
with them is pinned by the framework tests that run them (test_lightning_bare.py, test_accelerate.py,
test_workers_state.py).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import json
import types

import pytest
import torch

import padpipe as pp
from padpipe.inspection import packing_causes
from padpipe.integrations import guard, hf_hooks, loader_guard
from padpipe.readers import arrow
from padpipe.readers import hf as readers_hf
from padpipe.runtime.loader_snapshot import ITERATOR_PARTS, PARTS, SHUTDOWN, worker_stopper


def resolve(root, path: str):
    return functools.reduce(getattr, path.split("."), root)


@pytest.mark.parametrize(("module", "path"), loader_guard.LIGHTNING, ids=[p for _, p in loader_guard.LIGHTNING])
def test_every_lightning_contact_exists(module, path):
    pytest.importorskip("lightning")
    from lightning.pytorch import Trainer

    owner, _, rest = path.partition(".")
    cls = getattr(importlib.import_module(module), owner)
    if owner == "_FitLoop":  # set in __init__: read on a real trainer's fit loop
        instance = Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False).fit_loop
        assert isinstance(instance, cls)
        resolve(instance, rest)  # AttributeError names what Lightning renamed
    else:
        resolve(cls, rest)


def test_lightning_calls_a_loaders_state_methods_from_its_combined_loader():
    pytest.importorskip("lightning")
    from lightning.pytorch import Trainer
    from lightning.pytorch.utilities.combined_loader import CombinedLoader

    assert CombinedLoader.__module__ in loader_guard.LIGHTNING_COMBINED
    assert ".state_dict()" in inspect.getsource(CombinedLoader._state_dicts)
    assert ".load_state_dict(" in inspect.getsource(CombinedLoader._load_state_dicts)
    # the methods that run the loops (fit, save_checkpoint) are Trainer's own, in the module the checks look for
    assert all(
        getattr(Trainer, name).__module__ in loader_guard.LIGHTNING_TRAINER for name in ("fit", "save_checkpoint")
    )


def test_lightning_iterates_the_train_loaders_at_an_epochs_start_as_exact_resume_expects():
    """``ExactResume.on_train_epoch_start`` repeats the test by which Lightning's epoch loop calls ``iter()``."""
    pytest.importorskip("lightning")
    from lightning.pytorch.loops.training_epoch_loop import _TrainingEpochLoop

    source = inspect.getsource(_TrainingEpochLoop.on_run_start)
    assert "current_epoch > 0 and not self.trainer.fit_loop.is_resuming and not self.restarting:" in source
    assert "iter(data_fetcher)" in source


@pytest.mark.timeout(120)
@pytest.mark.filterwarnings("ignore:`isinstance\\(treespec, LeafSpec\\)` is deprecated")
def test_lightnings_checkpoint_keeps_the_loader_states_where_exact_resume_writes(tmp_path):
    L = pytest.importorskip("lightning")
    pytest.importorskip("transformers")
    from padpipe.integrations.lightning import ExactResume

    pipe = pp.from_iterable([{"text": t} for t in "abcdef"]).tokenize(pp.examples.tokenizer()).batch(1).pad()

    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.zeros(1))

        def train_dataloader(self):
            return pipe.loader()

        def training_step(self, batch, batch_idx):
            return (self.weight * batch["input_ids"].float().sum()).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    seen = []

    class Peek(L.Callback):
        def on_save_checkpoint(self, trainer, pl_module, checkpoint):
            seen.append(functools.reduce(dict.get, loader_guard.LOADER_SLOT, checkpoint))

    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=2,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        callbacks=[ExactResume(), Peek()],
        default_root_dir=tmp_path,
    )
    trainer.fit(Tiny())
    trainer.save_checkpoint(tmp_path / "x.ckpt")
    assert len(seen) == 1 and len(seen[0]) == 1 and "ranks" in seen[0][0]  # ExactResume's checkpoint() was written


@pytest.mark.parametrize(("module", "name", "attribute"), guard.ACCELERATE)
def test_every_accelerate_contact_exists(module, name, attribute):
    pytest.importorskip("accelerate")
    cls = getattr(importlib.import_module(module), name)
    first = attribute.split(".")[0]
    source = inspect.getsource(cls.__init__)
    assert f"self.{first} = " in source or first in inspect.signature(cls.__init__).parameters, (name, first)


def test_accelerates_save_state_contact_saves_the_registered_objects():
    pytest.importorskip("accelerate")
    module, method = loader_guard.ACCELERATE_SAVE
    source = inspect.getsource(getattr(importlib.import_module(module).Accelerator, method))
    assert "_custom_objects" in source and "save_custom_state(" in source  # it calls each object's state_dict()


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


@pytest.mark.parametrize(
    ("module", "name", "attribute", "why"), hf_hooks.ATTRIBUTES, ids=[r[2] for r in hf_hooks.ATTRIBUTES]
)
def test_every_private_attribute_padpipe_hf_reads_is_set_by_its_class(module, name, attribute, why):
    pytest.importorskip(module.split(".")[0])
    cls = getattr(importlib.import_module(module), name)
    assert f"self.{attribute} = " in inspect.getsource(cls), (name, attribute)


def test_a_private_attribute_padpipe_hf_reads_that_is_gone_raises_naming_it():
    with pytest.raises(ImportError, match=r"^padpipe\.hf reads transformers\.trainer\.Trainer's `_signature_columns`"):
        hf_hooks.private(object(), "_signature_columns")


@pytest.mark.parametrize(
    ("module", "name", "attribute"), packing_causes.CONTACTS, ids=[r[1] for r in packing_causes.CONTACTS]
)
def test_every_transformers_contact_of_the_packing_check_exists(module, name, attribute):
    transformers = pytest.importorskip("transformers")
    cls = getattr(importlib.import_module(module), name)
    owner = cls() if cls is transformers.PretrainedConfig else cls
    assert hasattr(owner, attribute), (name, attribute)


def test_the_packing_check_refuses_a_transformers_config_without_its_attention_name():
    config = type("GoneConfig", (), {"__module__": "transformers.configuration_gone"})()
    with pytest.raises(ImportError, match=r"^padpipe\.check_packing reads transformers' `_attn_implementation`"):
        packing_causes.attention_of(types.SimpleNamespace(config=config))
    assert packing_causes.attention_of(types.SimpleNamespace(config=types.SimpleNamespace())) is None  # not HF's


@pytest.mark.timeout(120)
def test_torchdatas_worker_shutdown_exists_stops_the_workers_and_its_loss_raises(monkeypatch):
    """WorkerProcesses stops its workers with this method: a release without it fails here and at the first epoch."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    module, name, method = SHUTDOWN
    cls = getattr(importlib.import_module(module), name)
    loader = StatefulDataLoader(range(4), batch_size=None, num_workers=1)
    it = iter(loader)
    assert type(it) is cls
    with monkeypatch.context() as patch:
        patch.delattr(cls, method)
        with pytest.raises(
            RuntimeError, match=rf"^padpipe's WorkerProcesses stops its DataLoader workers with .*{method}"
        ):
            worker_stopper(it)
    worker_stopper(it)()
    assert not any(w.is_alive() for w in it._workers)  # the workers are gone


def test_datasets_contacts_exist(tmp_path):
    datasets = pytest.importorskip("datasets")
    dataset = datasets.Dataset.from_dict({"text": ["a", "b"]})
    module, name, attribute = readers_hf.FINGERPRINT
    assert isinstance(getattr(dataset, attribute), str) and type(dataset) is getattr(
        importlib.import_module(module), name
    )
    dataset.save_to_disk(str(tmp_path / "saved"))
    state = json.loads((tmp_path / "saved" / arrow.SAVED_FILES[2]).read_text())
    assert [set(entry) >= {"filename"} for entry in state[arrow.SAVED_FILES[3]]] == [True]


def test_from_hf_refuses_a_dataset_without_its_fingerprint():
    datasets = pytest.importorskip("datasets")
    dataset = datasets.Dataset.from_dict({"text": ["a", "b"]})
    dataset._fingerprint = None  # what a datasets release that renamed it would leave
    loader = pp.from_hf(dataset).tokenize(pp.examples.tokenizer()).batch(1).pad().loader()
    with pytest.raises(TypeError, match=r"^padpipe's from_hf reads a datasets\.Dataset's `_fingerprint`"):
        next(iter(loader))
        loader.state_dict()
