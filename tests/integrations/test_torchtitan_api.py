"""Pins every row of padpipe.integrations.titan_api.CONTACTS: what the adapter relies on in torchtitan 0.3.0.

The trainer's contacts are read from torchtitan/trainer.py's source (its import needs tensorboard and
CUDA-side packages that the adapter does not); the others are called.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import sys
import types
from pathlib import Path

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers

import padpipe as pp

INSTALL = "needs torchtitan 0.3.0: pip install 'padpipe[torchtitan]' && pip install --no-deps torchtitan==0.3.0"
pytest.importorskip("torchtitan.components.dataloader", reason=INSTALL)
import tyro  # noqa: E402
from torchtitan.components import checkpoint, dataloader, loss, tokenizer  # noqa: E402
from torchtitan.config import Configurable  # noqa: E402

from padpipe.integrations import titan_api  # noqa: E402
from padpipe.integrations.titan_batches import IGNORE_INDEX  # noqa: E402
from padpipe.integrations.titan_tokenizer import as_padpipe  # noqa: E402
from padpipe.integrations.torchtitan import PadpipeDataLoader, text_tokenizer  # noqa: E402

TRAINER = Path(importlib.util.find_spec("torchtitan").origin).parent / "trainer.py"
TEXTS = ["", "a", "the cat sat", "Hello, world. The dog ran far away!", "  spaces  ", "ünïcödé café 😀"]


def method(name: str) -> ast.FunctionDef:
    tree = ast.parse(TRAINER.read_text())
    trainer = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Trainer")
    return next(n for n in trainer.body if isinstance(n, ast.FunctionDef) and n.name == name)


def test_every_contact_is_pinned_here():
    pinned = {
        "components.dataloader.BaseDataLoader",
        "config.Configurable.Config.build",
        "trainer.Trainer.__init__",
        "trainer.Trainer.batch_generator",
        "trainer.Trainer.train_step",
        "trainer.Trainer.post_dataloading_process",
        "components.loss.IGNORE_INDEX",
        "components.checkpoint.DATALOADER",
        "components.tokenizer.HuggingFaceTokenizer",
        "tyro.conf.Suppress",
    }
    assert set(titan_api.CONTACTS) == pinned
    assert importlib.metadata.version("torchtitan") == titan_api.VERSION


def test_the_base_dataloader_is_subclassed_and_its_config_builds_the_owner():
    assert issubclass(PadpipeDataLoader, dataloader.BaseDataLoader) and not PadpipeDataLoader.__abstractmethods__
    assert PadpipeDataLoader.Config._owner is PadpipeDataLoader
    assert issubclass(PadpipeDataLoader.Config, Configurable.Config)
    assert {"dataset", "dataset_path"} <= set(PadpipeDataLoader.Config.__dataclass_fields__)


def test_the_trainer_builds_the_loader_with_these_keywords():
    init = method("__init__")
    calls = [n for n in ast.walk(init) if isinstance(n, ast.Call) and ast.unparse(n.func) == "config.dataloader.build"]
    assert len(calls) == 1
    assert [k.arg for k in calls[0].keywords] == [
        "dp_world_size",
        "dp_rank",
        "tokenizer",
        "seq_len",
        "local_batch_size",
        "snapshot_every_n_steps",
    ]
    assert "pipeline_parallel_microbatch_size" in ast.unparse(init), "local_batch_size: the micro-batch under PP"


def test_the_end_of_the_loader_ends_training():
    generator = ast.unparse(method("batch_generator"))
    assert "data_iterator = iter(data_iterable)" in generator
    assert "except StopIteration as ex:\n            raise DataloaderExhaustedError() from ex" in generator
    assert "except DataloaderExhaustedError:" in ast.unparse(method("train"))


def test_a_step_takes_accumulation_times_microbatches_and_trains_labels_not_ignored():
    step = ast.unparse(method("train_step"))
    assert "for _ in range(self.gradient_accumulation_steps):" in step
    assert "for _ in range(self.num_pipeline_parallel_microbatches):" in step
    assert "local_valid_tokens += (labels != IGNORE_INDEX).sum()" in step
    assert loss.IGNORE_INDEX == IGNORE_INDEX == -100


def test_the_model_gets_input_and_the_other_keys_as_keywords():
    process = ast.unparse(method("post_dataloading_process"))
    assert "inputs = input_dict['input']" in process
    assert "extra_kwargs: dict[str, Any] = {k: v for k, v in input_dict.items() if k != 'input'}" in process


def test_the_checkpoint_saves_the_loader_under_dataloader():
    assert checkpoint.DATALOADER == "dataloader"
    source = Path(checkpoint.CheckpointManager.__init__.__code__.co_filename).read_text()
    assert "DATALOADER: dataloader," in source


def write_llama_like(folder: Path, *, template: bool) -> Path:
    """A byte-level BPE tokenizer with <|begin_of_text|>/<|end_of_text|> (its template adds the BOS when ``template``)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    specials = ["<|begin_of_text|>", "<|end_of_text|>"]
    tok.train_from_iterator(TEXTS * 20, trainers.BpeTrainer(vocab_size=400, special_tokens=specials))
    if template:
        bos = tok.token_to_id(specials[0])
        tok.post_processor = processors.TemplateProcessing(
            single=f"{specials[0]} $A", pair=f"{specials[0]} $A {specials[0]} $B:1", special_tokens=[(specials[0], bos)]
        )
    folder.mkdir()
    tok.save(str(folder / "tokenizer.json"))
    config = {"bos_token": specials[0], "eos_token": specials[1]}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize("kind", ["bert (no bos/eos)", "bos from the template", "bos and eos from torchtitan"])
def test_padpipe_tokenizes_as_torchtitans_tokenizer_encodes_for_its_text_loader(kind, tmp_path):
    if kind.startswith("bert"):
        path = Path(pp.examples.TOKENIZER_DIR)
    else:
        path = write_llama_like(tmp_path / "tok", template=kind.startswith("bos from"))
    titan = tokenizer.HuggingFaceTokenizer(tokenizer_path=str(path))
    for made in (text_tokenizer(titan), text_tokenizer(path)):
        assert [made.encode(t).ids for t in TEXTS] == [titan.encode(t, add_bos=True, add_eos=True) for t in TEXTS]
    if not kind.startswith("bert"):
        assert text_tokenizer(titan).encode("a").ids[-1] == titan.eos_id


def test_another_tokenizer_is_refused_by_name():
    with pytest.raises(
        TypeError,
        match=r"^padpipe.integrations.torchtitan reads torchtitan's HuggingFaceTokenizer .*, but was given a Tokenizer without tokenizer, bos_id",
    ):
        as_padpipe(pp.examples.tokenizer())


def test_the_pipeline_field_is_hidden_from_torchtitans_command_line():
    config = tyro.cli(PadpipeDataLoader.Config, args=["--dataset-path", "corpus/", "--epochs", "2"])
    assert config.dataset_path == "corpus/" and config.epochs == 2 and config.pipeline is None
    with pytest.raises(SystemExit):
        tyro.cli(PadpipeDataLoader.Config, args=["--dataset-path", "corpus/", "--pipeline", "x"])


def test_a_changed_contact_fails_the_import_naming_it():
    changed = types.SimpleNamespace(IGNORE_INDEX=-1)
    with pytest.raises(
        ImportError,
        match=r"^padpipe.integrations.torchtitan is written for torchtitan 0.3.0, but the installed torchtitan's components.loss.IGNORE_INDEX differs",
    ):
        titan_api.check_api(dataloader, importlib.import_module("torchtitan.config"), changed, checkpoint, tokenizer)


def test_a_missing_package_of_torchtitans_import_names_the_install_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "tyro", None)  # as if tyro were not installed
    monkeypatch.delitem(sys.modules, "padpipe.integrations.torchtitan")
    with pytest.raises(
        ImportError,
        match=r"^padpipe.integrations.torchtitan needs torchtitan 0.3.0 and what it imports \(tyro is not installed\): pip install 'padpipe\[torchtitan\]' && pip install --no-deps torchtitan==0.3.0$",
    ):
        importlib.import_module("padpipe.integrations.torchtitan")
