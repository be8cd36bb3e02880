"""Which attention backend x packing setting is exact, as ``pp.check_packing`` finds it (docs/packing.md's tables).

Tiny models built from configs (a Llama causal LM and a BERT masked LM, hidden size 32, 2 layers)
read the shipped corpus's documents (3 to 27 words each) packed into 2 rows of 64 tokens; each cell
is the check's verdict on 2 batches, 8 documents alone: ``exact``, ``wrong`` (logits differ) or
``fails`` (the forward raised), with the cause the check names. ``flash_attention_2`` runs HF's
own flash-attention code on the test suite's reference varlen kernel (tests/pipes/test_pack_hf.py),
since ``flash_attn`` needs a GPU; the rest runs on the CPU.

Usage:
    python benchmarks/packing_table.py
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import itertools
import json
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import transformers

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import padpipe as pp  # noqa: E402
from tests.pipes.test_pack_hf import install_reference_flash  # noqa: E402

ATTENTION = ("eager", "sdpa", "flash_attention_2")
FLASH_KWARGS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k", "seq_idx")


def batches(**options: Any) -> list[dict]:
    """The 2 packed batches every cell reads (made once per setting)."""
    return [dict(b) for b in _batches(tuple(sorted(options.items())))]


@functools.cache
def _batches(options: tuple) -> list[dict]:
    with gzip.open(pp.examples.SAMPLE_JSONL, "rt") as f:
        texts = [json.loads(line)["text"].split() for line in itertools.islice(f, 40)]
    rows = [{"text": " ".join(words[: 3 + 7 * i % 25])} for i, words in enumerate(texts)]
    pipe = pp.from_iterable(rows).tokenize(pp.examples.tokenizer(), max_length=64, num_threads=1)
    return list(itertools.islice(pipe.pack(64, batch_size=2, buffer_size=16, **dict(options)).loader(), 2))


def llama(**config: Any) -> Any:
    torch.manual_seed(0)
    options = dict(vocab_size=8000, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**options, num_key_value_heads=2, **config))


def bert() -> Any:
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=8000, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64
    )
    return transformers.BertForMaskedLM(config)


def bidirectional(batch: dict) -> dict:
    """A float block mask without the causal part: each token sees its whole document."""
    seq_idx = batch["seq_idx"]
    same = seq_idx[:, None, :, None] == seq_idx[:, None, None, :]
    mask = torch.zeros(same.shape).masked_fill_(~same, torch.finfo(torch.float32).min)
    return {**batch, "attention_mask": mask}


def dropped(batch: dict) -> dict:
    return {k: v for k, v in batch.items() if k not in FLASH_KWARGS}


CAUSAL = [  # setting, model, batches, columns
    ("default batch, `use_cache=True` (every pretrained config)", lambda: llama(), lambda: batches(), None),
    (
        "default batch without its `use_cache=False`, `use_cache=True` in the config",
        lambda: llama(),
        lambda: batches(),
        lambda batch: {k: v for k, v in batch.items() if k != "use_cache"},
    ),
    ("default batch, `use_cache=False`", lambda: llama(use_cache=False), lambda: batches(), None),
    (
        "default batch, `use_cache=False`, flash kwargs dropped (`remove_unused_columns`)",
        lambda: llama(use_cache=False),
        lambda: batches(),
        dropped,
    ),
    ("`block_mask=True` (float)", lambda: llama(), lambda: batches(block_mask=True), None),
    (
        "`block_mask=True, mask_dtype=torch.bool`",
        lambda: llama(),
        lambda: batches(block_mask=True, mask_dtype=torch.bool),
        None,
    ),
]
MASKED = [
    ("default batch", bert, lambda: batches(), None),
    ("`block_mask=True` (causal, float)", bert, lambda: batches(block_mask=True), None),
    ("a bidirectional float block mask from `seq_idx`", bert, lambda: [bidirectional(b) for b in batches()], None),
]


@contextlib.contextmanager
def reference_flash() -> Iterator[None]:
    """HF's flash-attention module on the reference kernels, put back as it was afterwards."""
    import transformers.modeling_flash_attention_utils as fa

    saved: list[tuple[str, Any]] = []

    def set_attribute(module: Any, name: str, value: Any) -> None:
        saved.append((name, getattr(module, name)))
        setattr(module, name, value)

    install_reference_flash(fa, set_attribute)
    try:
        yield
    finally:
        for name, value in reversed(saved):
            setattr(fa, name, value)


def verdict(model: Any, packed: list[dict], columns: Callable[[dict], dict] | None) -> str:
    try:
        pp.check_packing(model, packed, columns=columns)
    except pp.PackingError as exc:
        key = exc.cause.key if exc.cause else "cause unknown"
        return f"wrong (`{key}`)" if exc.report is not None else f"fails (`{key}`)"
    return "exact"


def table(title: str, cases: list) -> str:
    lines = [f"| {title} | " + " | ".join(f"`{a}`" for a in ATTENTION) + " |", "|---" * (len(ATTENTION) + 1) + "|"]
    for setting, make_model, make_batches, columns in cases:
        cells = []
        for attn in ATTENTION:
            model = make_model()
            model.config._attn_implementation = attn
            with reference_flash() if attn.startswith("flash") else contextlib.nullcontext():
                cells.append(verdict(model, make_batches(), columns))
        lines.append(f"| {setting} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    print(table("causal LM (Llama)", CAUSAL))
    print()
    print(table("masked LM (BERT)", MASKED))
    return 0


if __name__ == "__main__":
    sys.exit(main())
