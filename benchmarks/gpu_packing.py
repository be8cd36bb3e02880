"""GPU check of ``pp.check_packing`` in a real model: a tiny Llama, bf16, with the GPU's own attention kernels.

Four settings, each with the verdict the CPU suite pins (docs/packing.md): ``sdpa`` with
``use_cache=False`` is exact, and so with ``use_cache=True`` in the config (the batch's own
``use_cache=False`` wins); with that key dropped the check names ``use_cache``;
``flash_attention_2`` (``flash_attn`` installed) is exact on the default batch.
On the CPU (``gpu_check.py --smoke``) the two ``sdpa`` settings run in float32 and flash is skipped.
"""

from __future__ import annotations

from typing import Any

import torch

import padpipe as pp

EXPECTED = {
    "sdpa, use_cache=False": "exact",
    "sdpa, use_cache=True": "exact",
    "sdpa, use_cache=True, dropped": "use_cache",
    "flash_attention_2": "exact",
}


def tiny_llama(attn: str, use_cache: bool, device: torch.device) -> Any:
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=pp.examples.tokenizer().get_vocab_size(),
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        use_cache=use_cache,
    )
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    return transformers.LlamaForCausalLM._from_config(config, attn_implementation=attn, dtype=dtype).to(device)


def packed_batches(device: torch.device) -> list[dict]:
    pipe = (
        pp.read_jsonl(pp.examples.SAMPLE_JSONL).tokenize(pp.examples.tokenizer(), max_length=96).pack(512, batch_size=4)
    )
    pipe = pipe.to_cuda() if device.type == "cuda" else pipe
    return [batch for batch, _ in zip(pipe.loader(), range(2))]


def verdict(model: Any, batches: list[dict], dropped: bool = False) -> str:
    columns = (lambda batch: {k: v for k, v in batch.items() if k != "use_cache"}) if dropped else None
    try:
        pp.check_packing(model, batches, columns=columns)
    except pp.PackingError as error:
        return error.cause.key if error.cause else "unknown cause"
    return "exact"


def check_model_packing(device: torch.device) -> dict[str, Any]:
    """Each setting's verdict against :data:`EXPECTED`; ``ok`` None when none ran."""
    batches, found = packed_batches(device), {}
    for name in EXPECTED:
        attn = name.split(",")[0]
        if attn.startswith("flash") and device.type != "cuda":
            found[name] = None
            continue
        try:
            model = tiny_llama(attn, use_cache="use_cache=True" in name, device=device)
        except ImportError as error:  # flash_attn not installed
            found[name] = f"skipped ({str(error)[:80]})"
            continue
        found[name] = verdict(model, batches, dropped=name.endswith("dropped"))
    ran = {k: v for k, v in found.items() if v is not None and not v.startswith("skipped")}
    ok = all(v == EXPECTED[k] for k, v in ran.items()) if ran else None
    return {"ok": ok, **found}
