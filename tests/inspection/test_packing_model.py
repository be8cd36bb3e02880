"""``pp.model_kind``: verdicts from configs and code alone, the causes they give, and transformers' names it reads.

Every class, run, is in test_hybrid_models.py (slow); here the pieces that need no forward: a config
read on the ``meta`` device, the verdict's words and layout, the recipes' choice, and the names of
transformers (its kernel hooks, cache layer types, device table) pinned against the installed release.
"""

from __future__ import annotations

import importlib
import pathlib
import re

import pytest
import torch

import padpipe as pp
from padpipe.inspection import packing_model
from padpipe.inspection.packing_causes import layer_cause
from padpipe.inspection.packing_model import DECODE, KERNELS, PACKAGES, ModelKind
from padpipe.recipes.batching import batching

HOOK = re.compile(r'use_kernel_func_from_hub_with_fallback\(\s*"(\w+)",\s*"(\w+)"')

transformers = pytest.importorskip("transformers")

QWEN3_NEXT = dict(
    vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
    layer_types=["linear_attention", "full_attention"], linear_num_key_heads=2, linear_num_value_heads=2,
    linear_key_head_dim=16, linear_value_head_dim=16, num_experts=2, num_experts_per_tok=1,
)  # fmt: skip


def test_model_kind_reads_a_config_without_weights() -> None:
    llama = transformers.LlamaConfig(vocab_size=64, hidden_size=16, num_hidden_layers=2, num_attention_heads=2)
    assert (pp.model_kind(llama).kind, pp.model_kind(llama).layout) == ("attention", "rows")
    mamba = pp.model_kind(transformers.MambaConfig(vocab_size=64, hidden_size=16, num_hidden_layers=2))
    assert (mamba.kind, mamba.layout, mamba.layers) == ("recurrent", "bucket", "2 linear_attention layers (MambaMixer)")
    qwen = pp.model_kind(transformers.Qwen3NextConfig(**QWEN3_NEXT), device="cpu")
    assert (qwen.kind, qwen.packages, qwen.missing, qwen.one_row) == ("varlen", ("causal_conv1d", "fla"),
                                                                      ("causal_conv1d", "fla"), True)  # fmt: skip
    assert qwen.layers == "1 linear_attention layer (Qwen3NextGatedDeltaNet)"


def test_model_kind_raises_error_when_given_no_model() -> None:
    with pytest.raises(TypeError, match=r"^model_kind: `model` must be a transformers model or config, but is str\.$"):
        pp.model_kind("Qwen/Qwen3-Next")


VERDICTS = [
    (
        ModelKind("M", "attention"),
        "rows",
        "M has attention layers only; pack() keeps documents apart, its batch as it is.",
    ),
    (
        ModelKind("M", "attention", mask_without_positions=True),
        "rows",
        "M builds its attention mask without position_ids, so its eager/sdpa attention finds no packed rows; use "
        "attn_implementation='flash_attention_2' (it reads cu_seq_lens_*), or pack(block_mask=True).",
    ),
    (
        ModelKind("M", "varlen", "2 conv layers (C)", packages=("causal_conv1d",), device="cuda"),
        "rows",
        "M: state runs on from one document into the next in its 2 conv layers (C); the kernels of causal-conv1d keep "
        "them apart given seq_idx/cu_seq_lens; pack(..., layout='rows').",
    ),
    (
        ModelKind("M", "varlen", "2 layers (G)", packages=("causal_conv1d", "fla"), one_row=True, device="cuda"),
        "flat",
        "M: state runs on from one document into the next in its 2 layers (G); the kernels of causal-conv1d and "
        "flash-linear-attention keep them apart given seq_idx/cu_seq_lens; pack(..., layout='flat') "
        "(flash-linear-attention takes the batch as one row).",
    ),
    (
        ModelKind("M", "varlen", "2 layers (G)", packages=("fla",), missing=("fla",), one_row=True),
        "bucket",
        "M: state runs on from one document into the next in its 2 layers (G); only the kernels of "
        "flash-linear-attention keep them apart (given seq_idx/cu_seq_lens), and flash-linear-attention is not usable "
        "on cpu (not installed, or no kernel for it); pip install flash-linear-attention and train on cuda with "
        "pack(..., layout='flat'), or .bucket(max_tokens=...).pad(): one document a row, padding on the right.",
    ),
    (
        ModelKind("M", "recurrent", "2 layers (R)", "no kernel of theirs takes any"),
        "bucket",
        "M: state runs on from one document into the next in its 2 layers (R), and nothing keeps packed documents apart "
        "in them (no kernel of theirs takes any); do not pack: .bucket(max_tokens=...).pad(): one document a row, "
        "padding on the right.",
    ),
]


@pytest.mark.parametrize(("kind", "layout", "words"), VERDICTS)
def test_model_kind_says_in_one_line_why_and_what_to_do(kind: ModelKind, layout: str, words: str) -> None:
    assert (kind.layout, str(kind)) == (layout, words)
    assert "\n" not in str(kind)


def test_layer_cause_names_what_the_layers_lack_in_this_batch() -> None:
    varlen = ModelKind("M", "varlen", "2 layers (G)", packages=("fla",), one_row=True, device="cuda")
    rows = {"input_ids": torch.ones(2, 8), "seq_idx": 0, "cu_seq_lens_q": 0}
    assert layer_cause(varlen, rows, rows).key == "flat_layout"
    assert layer_cause(varlen, rows, {k: v for k, v in rows.items() if k == "input_ids"}).what.endswith(
        "but the model gets no seq_idx, cu_seq_lens_q (dropped before the model, as remove_unused_columns=True does)"
    )
    assert layer_cause(varlen, rows, {**rows, "input_ids": torch.ones(1, 16)}) is None  # one row: all it needs
    assert layer_cause(ModelKind("M", "varlen", "2 layers", packages=("fla",), missing=("fla",)), rows, rows).key == (
        "kernel_missing"
    )
    assert layer_cause(ModelKind("M", "attention"), rows, rows) is None


def test_recipes_pack_bucket_or_refuse_as_the_model_needs(caplog) -> None:
    recurrent = ModelKind("M", "recurrent", "2 layers", "no kernel takes any")
    flat = ModelKind("M", "varlen", "2 layers", packages=("fla",), one_row=True, device="cuda")
    assert batching(flat, None, "sft") == batching(flat, "pack", "sft") == ("pack", "flat")
    assert batching(recurrent, "bucket", "sft") == ("bucket", "rows")
    assert batching(recurrent, None, "sft") == ("bucket", "rows")
    assert caplog.records[-1].getMessage().startswith("sft: batches by bucket, not pack: M: state runs on")
    with pytest.raises(
        ValueError, match=r"^pretrain\(mode='pack'\) cannot keep packed documents apart in this model: M"
    ):
        batching(recurrent, "pack", "pretrain")
    with pytest.raises(ValueError, match=r"^`mode` must be one of \('pack', 'bucket'\), but is 'pad' instead\.$"):
        batching(None, "pad", "sft")


def test_the_attention_mask_check_reads_the_decoders_mask_calls() -> None:
    def create_causal_mask(**kwargs):  # noqa: ANN003, ANN202
        return None

    class Decoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = torch.nn.ModuleList([torch.nn.Linear(2, 2)])

    class WithPositions(Decoder):
        def forward(self, x, position_ids):  # noqa: ANN001, ANN201
            mask_kwargs = {"inputs_embeds": x, "position_ids": position_ids}
            return create_causal_mask(**mask_kwargs)

    class WithoutPositions(Decoder):
        def forward(self, x, position_ids):  # noqa: ANN001, ANN201
            return create_causal_mask(inputs_embeds=x)

    assert packing_model._mask_reads_positions(WithPositions())
    assert not packing_model._mask_reads_positions(WithoutPositions())
    assert packing_model._mask_reads_positions(torch.nn.Linear(2, 2))  # no decoder: nothing to say


def test_the_kernels_transformers_hooks_are_all_known() -> None:
    """A kernel a later transformers hooks must be added to KERNELS (with its boundary argument) or DECODE."""
    hooked = set()
    for path in pathlib.Path(importlib.import_module("transformers.models").__path__[0]).glob("*/modeling_*.py"):
        hooked |= {kernel for kernel, _ in HOOK.findall(path.read_text(encoding="utf-8"))}
    training = {k for k in hooked if not any(part in k for part in DECODE)}
    assert training == set(KERNELS), "a training kernel model_kind does not know, or one transformers dropped"


def test_the_packages_devices_and_cache_layers_are_transformers_own() -> None:
    hub = importlib.import_module("transformers.integrations.hub_kernels")
    assert {p: devices for p, (_, devices) in PACKAGES.items()} == hub._PACKAGE_SUPPORTED_DEVICES
    assert all(hub._PACKAGE_TO_DISTRIBUTION.get(p, p.replace("_", "-")) == name for p, (name, _) in PACKAGES.items())
    assert callable(hub.use_kernel_func_from_hub_with_fallback)
    from transformers.cache_utils import DYNAMIC_LAYER_TYPE_MAPPING, LinearAttentionCacheLayerMixin

    stateful = {t for t, c in DYNAMIC_LAYER_TYPE_MAPPING.items() if issubclass(c, LinearAttentionCacheLayerMixin)}
    assert stateful == {"conv", "linear_attention", "hybrid", "hybrid_sliding"}


@pytest.mark.slow  # seconds: inspect and a chat pipeline
def test_inspect_and_sft_take_the_model_and_bucket_where_packing_cannot_keep_documents_apart(tmp_path, capsys):
    from padpipe.cli import main
    from padpipe.recipes.sft import sft

    mamba = transformers.MambaConfig(vocab_size=64, hidden_size=16, num_hidden_layers=2)
    result = pp.inspect(pp.examples.SAMPLE_PARQUET, pp.examples.tokenizer(), max_length=128, sample=300,
                        progress=False, model=mamba)  # fmt: skip
    first = result.recommendations()[0]
    assert re.fullmatch(
        r"model: MambaForCausalLM: state runs on .*; do not pack: bucket\(max_tokens=4096\) fills \d+\.\d% of token "
        r"slots here \(one document a row, padding on the right: \.pad\(side='right'\)\), where pack\(seq_len=128\) "
        r"would fill \d+\.\d% and let documents see each other\.",
        first,
    )
    assert result.as_dict()["model"] == {"kind": "recurrent", "layout": "bucket"}
    mamba.to_json_file(tmp_path / "config.json")
    main(["inspect", pp.examples.SAMPLE_PARQUET, "--tokenizer", pp.examples.TOKENIZER_JSON, "--max-length", "128",
          "--sample", "300", "--model", str(tmp_path / "config.json")])  # fmt: skip
    assert "  - model: MambaForCausalLM: state runs on" in capsys.readouterr().out
    pipe = sft(pp.examples.CHATS_JSONL, pp.examples.chat_tokenizer(), seq_len=256, model=mamba)
    assert [s.name for s in pipe.stages][-2:] == ["bucket", "pad"]
