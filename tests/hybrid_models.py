"""Tiny random models of every hybrid and recurrent causal-LM class of the installed transformers, from configs.

:data:`TINY` holds each class's config changes (a model type whose config builds it: ``qwen3_5_text``
for ``Qwen3_5ForCausalLM``), :data:`EXPECTED` what :func:`padpipe.model_kind` must find in it, and
:func:`hybrid_and_recurrent_types` finds the classes from transformers itself (a kernel hook in
their modeling code, a state layer type in their default config, or a recurrent block), so a class
a later transformers adds fails the test that compares them until it is added here. Weights start
at ``initializer_range=0.2`` so that a state leaking across documents moves the logits well past
float rounding (at HF's 0.02, a short convolution's leak is 1e-5, under ``check_packing``'s tolerance).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import sys
from typing import Any

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

VOCAB = 8000  # the shipped tokenizer's
COMMON = dict(
    vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
    max_position_embeddings=256, initializer_range=0.2, pad_token_id=0, bos_token_id=1, eos_token_id=3,
)  # fmt: skip
GDN = dict(
    linear_num_key_heads=2, linear_num_value_heads=2, linear_key_head_dim=16, linear_value_head_dim=16,
    linear_conv_kernel_dim=4,
)  # fmt: skip
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32)
MAMBA2 = dict(
    mamba_n_heads=4, mamba_d_head=16, mamba_d_state=8, mamba_n_groups=1, mamba_expand=2, mamba_chunk_size=8,
    mamba_d_conv=4,
)  # fmt: skip
MLA = dict(
    num_key_value_heads=2, layer_types=["linear_attention", "full_attention"], mlp_layer_types=["dense", "dense"],
    linear_num_heads=2, linear_head_dim=16, kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
    num_experts=4, num_experts_per_token=2, moe_intermediate_size=32,
)  # fmt: skip
INKLING = dict(
    swa_head_dim=16, swa_num_attention_heads=2, swa_num_key_value_heads=1, sliding_window_size=8, n_routed_experts=4,
    num_experts_per_tok=2, moe_intermediate_size=32, d_rel=4, rel_extent=16,
)  # fmt: skip
LINEAR_FULL = ["linear_attention", "full_attention"]

TINY: dict[str, dict[str, Any]] = {
    "qwen3_next": dict(GDN, **MOE, num_hidden_layers=2, layer_types=LINEAR_FULL),
    "qwen3_5_text": dict(GDN, num_hidden_layers=2, layer_types=LINEAR_FULL),
    "qwen3_5_moe_text": dict(GDN, **MOE, num_hidden_layers=2, layer_types=LINEAR_FULL),
    "qwen4_exp_text": dict(
        GDN,
        **MOE,
        num_hidden_layers=2,
        layer_types=["linear_attention", "indexed_attention"],
        indexer_n_heads=2,
        indexer_kv_heads=1,
        indexer_head_dim=16,
        indexer_budget=8,
        indexer_compress_ratio=4,
        ngram_vocab_size_base=256,
        make_ngram_vocab_size_divisible_by=8,
        split_ngram_parts=8,
        hc_lowrank=8,
        ple_embed_dim=32,
    ),  # fmt: skip
    "olmo_hybrid": dict(GDN, num_hidden_layers=2, layer_types=LINEAR_FULL),
    "lara_mini": dict(
        GDN,
        **MOE,
        num_hidden_layers=3,
        layer_types=["linear_attention", "sliding_attention", "full_attention"],
        sliding_window=8,
    ),  # fmt: skip
    "lfm2": dict(
        num_hidden_layers=2,
        layer_types=["conv", "full_attention"],
        full_attn_idxs=[1],
        conv_L_cache=3,
        block_auto_adjust_ff_dim=False,
    ),  # fmt: skip
    "lfm2_moe": dict(
        num_hidden_layers=2,
        layer_types=["conv", "full_attention"],
        num_dense_layers=1,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        conv_L_cache=3,
    ),  # fmt: skip
    "lfm3": dict(
        num_hidden_layers=3,
        layer_types=["conv", "sliding_attention", "full_attention"],
        sliding_window=8,
        conv_L_cache=3,
    ),  # fmt: skip
    "mamba": dict(num_hidden_layers=2, state_size=8, expand=2, conv_kernel=4, time_step_rank=4),
    "falcon_mamba": dict(num_hidden_layers=2, state_size=8, expand=2, conv_kernel=4, time_step_rank=4),
    "mamba2": dict(
        num_hidden_layers=2, num_heads=4, head_dim=16, n_groups=1, state_size=8, expand=2, chunk_size=8, conv_kernel=4
    ),
    "bamba": dict(MAMBA2, num_hidden_layers=2, attn_layer_indices=[1]),
    "granitemoehybrid": dict(
        MAMBA2,
        num_hidden_layers=2,
        layer_types=["mamba", "attention"],
        num_local_experts=4,
        num_experts_per_tok=2,
        shared_intermediate_size=32,
    ),  # fmt: skip
    "falcon_h1": dict(MAMBA2, num_hidden_layers=2, mamba_d_ssm=64),
    "nemotron_h": dict(
        num_hidden_layers=2,
        hybrid_override_pattern="M*",
        mamba_num_heads=4,
        mamba_head_dim=16,
        ssm_state_size=8,
        n_groups=1,
        expand=2,
        chunk_size=8,
        conv_kernel=4,
        n_routed_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        moe_shared_expert_intermediate_size=32,
    ),  # fmt: skip
    "zamba": dict(
        num_hidden_layers=3,
        attention_hidden_size=64,
        attention_head_dim=32,
        mamba_d_state=8,
        mamba_dt_rank=4,
        n_mamba_heads=2,
        layers_block_type=["linear_attention", "hybrid", "hybrid"],
    ),  # fmt: skip
    "zamba2": dict(
        num_hidden_layers=2,
        attention_hidden_size=64,
        attention_head_dim=32,
        mamba_d_state=8,
        mamba_headdim=16,
        n_mamba_heads=4,
        num_mem_blocks=1,
        layers_block_type=["linear_attention", "hybrid"],
        adapter_rank=4,
        chunk_size=8,
        kv_channels=16,
        num_query_groups=2,
    ),  # fmt: skip
    "jamba": dict(
        num_hidden_layers=2,
        attn_layer_period=2,
        attn_layer_offset=1,
        expert_layer_period=2,
        expert_layer_offset=1,
        num_experts=2,
        num_experts_per_tok=1,
        mamba_d_state=8,
        mamba_dt_rank=4,
        use_mamba_kernels=False,
    ),  # fmt: skip
    "kimi_linear": dict(MLA, num_hidden_layers=2),
    "bailing_hybrid": dict(
        MLA,
        num_hidden_layers=2,
        qk_head_dim=24,
        first_k_dense_replace=2,
        num_expert_group=1,
        topk_group=1,
        layer_group_size=2,
    ),  # fmt: skip
    "minimax": dict(
        num_hidden_layers=2, layer_types=LINEAR_FULL, num_local_experts=2, num_experts_per_tok=1, block_size=8
    ),
    "recurrent_gemma": dict(
        num_hidden_layers=3,
        block_types=["recurrent", "recurrent", "attention"],
        lru_width=32,
        attention_window_size=64,
        num_key_value_heads=2,
    ),  # fmt: skip
    "rwkv": dict(num_hidden_layers=2, attention_hidden_size=32, context_length=256),
    "xlstm": dict(
        num_hidden_layers=2,
        num_blocks=2,
        embedding_dim=32,
        num_heads=2,
        chunk_size=8,
        mode="inference",
        autocast_kernel_dtype="float32",
        inference_state_dtype="float32",
        max_inference_chunksize=64,
        use_cache=False,  # its cache path fails at these sizes, packed or not (transformers 5.25)
    ),  # fmt: skip
    "zaya": dict(
        num_hidden_layers=2,
        layer_types=["hybrid", "hybrid"],
        num_experts=2,
        num_experts_per_tok=1,
        moe_intermediate_size=32,
        router_hidden_size=16,
    ),  # fmt: skip
    "inkling_text": dict(
        INKLING,
        num_hidden_layers=2,
        layer_types=["hybrid_sliding", "hybrid"],
        mlp_layer_types=["dense", "dense"],
        n_shared_experts=1,
    ),  # fmt: skip
    "inkling2_text": dict(
        INKLING, num_hidden_layers=2, layer_types=["hybrid_sliding", "hybrid"], unpadded_vocab_size=VOCAB
    ),
    "inkling2_loop_text": dict(
        INKLING,
        num_hidden_layers=3,
        layer_types=["hybrid_sliding", "hybrid", "hybrid"],
        unpadded_vocab_size=VOCAB,
        loop_layer_index_start=1,
        loop_layer_index_end=2,
        loop_num_passes=2,
        loop_gate_rank=4,
        n_layers_per_attn_res_block=1,
    ),  # fmt: skip
}
"""Config changes of each class's tiny model (on top of :data:`COMMON`): both kinds of its layers, a few of each."""

SKIPPED: dict[str, str] = {}
"""Classes found by :func:`hybrid_and_recurrent_types` with no tiny model, and why (none now)."""

CONV, MAMBA, FLA = "causal_conv1d", "mamba_ssm", "fla"
EXPECTED: dict[str, tuple[str, tuple[str, ...]]] = {
    # model type -> (what model_kind finds, the kernel packages that keep its documents apart)
    **{t: ("varlen", (CONV, FLA)) for t in ("qwen3_next", "qwen3_5_text", "qwen3_5_moe_text", "qwen4_exp_text")},
    **{t: ("varlen", (CONV, FLA)) for t in ("olmo_hybrid", "lara_mini")},
    **{t: ("varlen", (CONV,)) for t in ("lfm2", "lfm2_moe", "lfm3", "inkling2_text", "inkling2_loop_text")},
    **{t: ("varlen", (CONV, MAMBA)) for t in ("mamba2", "bamba", "granitemoehybrid", "falcon_h1", "nemotron_h")},
    "zamba2": ("varlen", (CONV, MAMBA)),
    # Mamba v1's selective scan takes no boundaries (Jamba and Zamba v1 use it too)
    **{t: ("recurrent", ()) for t in ("mamba", "falcon_mamba", "jamba", "zamba")},
    # the probe: chunk_kda gets no cu_seqlens from these models, Inkling's convolution no seq_idx
    **{t: ("recurrent", ()) for t in ("kimi_linear", "bailing_hybrid", "inkling_text")},
    # no kernel that takes boundaries at all
    **{t: ("recurrent", ()) for t in ("minimax", "recurrent_gemma", "rwkv", "xlstm", "zaya")},
}


def build(model_type: str, **changes: Any) -> torch.nn.Module:
    """The tiny model of ``model_type`` (seed 0, CPU, float32, ``eval`` mode; the config's ``use_cache``)."""
    import transformers

    config = transformers.AutoConfig.for_model(model_type, **{**COMMON, **TINY[model_type], **changes})
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config).eval()


HOOKED = re.compile(r"use_kernel_func_from_hub_with_fallback\(\s*\"\w+\",\s*\"(causal_conv1d|mamba_ssm|fla)\"")


@functools.cache
def hybrid_and_recurrent_types() -> dict[str, str]:
    """Every causal-LM class of the installed transformers that has a layer carrying state: ``{class: model type}``.

    A class is one when its modeling code hooks a causal-conv1d, mamba-ssm or flash-linear-attention
    kernel, its default config declares a layer type transformers caches a conv or recurrent state
    for, or it defines a block of ``padpipe.inspection.packing_model.RECURRENT_BLOCKS``. The model type
    named is the one :data:`TINY` builds it from, if any.
    """
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from padpipe.inspection.packing_model import RECURRENT_BLOCKS, _state_layer_types

    modules = sys.modules["transformers"]._class_to_module  # noqa: SLF001 (which file defines each class)
    found: dict[str, str] = {}
    for model_type, name in sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items()):
        spec = importlib.util.find_spec(f"transformers.{modules[name]}")
        code = open(spec.origin, encoding="utf-8").read() if spec and spec.origin else ""  # noqa: SIM115
        try:
            state = bool(_state_layer_types(transformers.AutoConfig.for_model(model_type)))
        except Exception:  # a default config that does not build: its code decides
            state = False
        if state or HOOKED.search(code) or any(f"class {block}(" in code for block in RECURRENT_BLOCKS):
            if name not in found or model_type in TINY:
                found[name] = model_type
    return found
