"""A packed batch keeps documents apart in the loops users write, whatever the model's config says.

A Llama with the ``use_cache=True`` of every pretrained config, ``sdpa``: in Accelerate's prepared
loop and in a Lightning ``training_step`` of ``model(**batch).loss``, the forward gets the batch's
own ``use_cache=False`` (so HF finds the packed rows in ``position_ids``), and each document of the
batches those loops read gets the logits it has alone.
"""

from __future__ import annotations

import os

import pytest
import torch

import padpipe as pp

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.timeout(300)


def llama() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=8000, hidden_size=32, intermediate_size=64, num_hidden_layers=2, attn_implementation="sdpa"
    )
    assert config.use_cache is True
    return transformers.LlamaForCausalLM(config)


def packed() -> pp.Pipeline:
    tokens = pp.read_jsonl(pp.examples.SAMPLE_JSONL).tokenize(pp.examples.tokenizer(), max_length=24)
    return tokens.pack(64, batch_size=2)


def forwards(model: torch.nn.Module) -> list[dict]:
    calls: list[dict] = []
    model.register_forward_pre_hook(lambda _, args, kwargs: calls.append(dict(kwargs)), with_kwargs=True)
    return calls


def test_accelerates_prepared_loop_keeps_packed_documents_apart() -> None:
    accelerate = pytest.importorskip("accelerate")
    accelerator = accelerate.Accelerator(cpu=True)
    model = llama()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer, loader = accelerator.prepare(model, optimizer, packed().loader())
    calls, read = forwards(model), []
    for batch, _ in zip(loader, range(2)):
        read.append(batch)
        accelerator.backward(model(**batch).loss)
        optimizer.step()
        optimizer.zero_grad()
    assert [call["use_cache"] for call in calls] == [False, False]
    assert pp.check_packing(accelerator.unwrap_model(model), read).exact


@pytest.mark.filterwarnings("ignore:`isinstance\\(treespec, LeafSpec\\)` is deprecated")
def test_a_lightning_training_step_keeps_packed_documents_apart(tmp_path) -> None:
    L = pytest.importorskip("lightning")

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model, self.read = llama(), []

        def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
            self.read.append(batch)
            return self.model(**batch).loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

        def train_dataloader(self):  # noqa: ANN202
            return packed().loader()

    module = Module()
    calls = forwards(module.model)
    trainer = L.Trainer(
        max_steps=2, accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, default_root_dir=tmp_path,
    )  # fmt: skip
    trainer.fit(module)
    assert [call["use_cache"] for call in calls] == [False, False]
    assert pp.check_packing(module.model, module.read).exact
