"""Packed batches in ``transformers`` models: every document gets the logits it has alone.

A tiny Llama (built from ``LlamaConfig``, default config but for its size) reads ``.pack()``'s
batches as they come, ``model(**batch)``, for each attention implementation and mask option the
docs call exact; the combinations they call wrong are pinned too, so the docs stay true when
``transformers`` changes. Flash-attention cannot run here (no GPU): HF's own flash code path runs
with a reference varlen kernel in its place, and the key names and values are checked against
HF's ``DataCollatorWithFlattening``.
"""

from __future__ import annotations

import gzip
import itertools
import json
import os
from typing import Any

import numpy as np
import pytest
import torch

import padpipe as pp
from padpipe.chunks import TokenChunk
from padpipe.pipes.pack import Packer

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")
from torchdata.nodes import IterableWrapper  # noqa: E402

SEQ_LEN = 64
EXACT = 1e-5


def tiny_llama(attn_implementation: str) -> Any:
    torch.manual_seed(0)
    vocab = pp.examples.tokenizer().get_vocab_size()
    config = transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=32, num_hidden_layers=2, attn_implementation=attn_implementation
    )
    return transformers.LlamaForCausalLM(config).eval()


def packed_batches(**options: Any) -> list[dict]:
    """Two batches of shipped-corpus text (the first 3 to 27 words of each document) in 3 rows of 64 tokens."""
    with gzip.open(pp.examples.SAMPLE_JSONL, "rt") as f:
        texts = [json.loads(line)["text"].split() for line in itertools.islice(f, 40)]
    rows = [{"text": " ".join(words[: 3 + 7 * i % 25])} for i, words in enumerate(texts)]
    pipe = pp.from_iterable(rows).tokenize(pp.examples.tokenizer(), max_length=SEQ_LEN, num_threads=1)
    return list(itertools.islice(pipe.pack(SEQ_LEN, batch_size=3, buffer_size=16, **options).loader(), 2))


def documents(batch: dict) -> list[tuple[int, torch.Tensor]]:
    """``(row, columns)`` of every document segment (the padding run, all pad ids, left out)."""
    out = []
    for r, seg in enumerate(batch["seq_idx"]):
        for s in seg.unique().tolist():
            cols = (seg == s).nonzero().flatten()
            if batch["input_ids"][r, cols[0]] != 0:  # the shipped tokenizer's [PAD]
                out.append((r, cols))
    return out


def error_against_alone(model: Any, batch: dict, logits: torch.Tensor) -> float:
    """Max abs difference between the packed logits and each document run alone."""
    worst = 0.0
    for r, cols in documents(batch):
        alone = model(input_ids=batch["input_ids"][r, cols][None]).logits[0]
        worst = max(worst, (logits[r, cols] - alone).abs().max().item())
    return worst


def loss_alone(model: Any, batch: dict) -> torch.Tensor:
    """The token-weighted mean of the documents' own causal-LM losses."""
    total, count = torch.zeros(()), 0
    for r, cols in documents(batch):
        ids = batch["input_ids"][r, cols][None]
        total += model(input_ids=ids, labels=ids).loss * (len(cols) - 1)
        count += len(cols) - 1
    return total / count


EXACT_CASES = [  # attention, pack options, model call options, model dtype
    ("eager", dict(block_mask=True), {}, torch.float32),
    ("sdpa", dict(block_mask=True), {}, torch.float32),
    ("sdpa", dict(block_mask=True, mask_dtype=torch.bool), {}, torch.float32),
    ("eager", dict(block_mask=True), {}, torch.bfloat16),
    ("sdpa", dict(block_mask=True), {}, torch.bfloat16),
    ("eager", dict(block_mask=True, mask_dtype=torch.bfloat16), {}, torch.bfloat16),
    ("sdpa", dict(block_mask=True, mask_dtype=torch.bfloat16), {}, torch.bfloat16),
    ("eager", {}, {}, torch.float32),  # the batch's own use_cache=False, under the config's use_cache=True
    ("sdpa", {}, {}, torch.float32),
    ("sdpa", {}, dict(use_cache=False), torch.float32),
]


@pytest.mark.slow  # seconds alone: make test runs it, test-fast leaves it out
@pytest.mark.parametrize(("attn", "options", "call", "dtype"), EXACT_CASES)
def test_pack_gives_each_document_the_logits_and_loss_it_has_alone(
    attn: str, options: dict, call: dict, dtype: torch.dtype
) -> None:
    model = tiny_llama(attn).to(dtype)
    assert model.config.use_cache is True  # the model's default config
    batches = packed_batches(**options)
    assert sum(len(documents(b)) - len(b["input_ids"]) for b in batches) >= 4  # rows with several documents
    # bf16: within a bf16 step, not bit-equal (torch 2.6's sdpa differs by 2e-3 packed vs alone; 2.13 by 0); a
    # document that sees another is off by ~0.1-0.2 (tests/inspection/test_packing_check.py)
    tolerance = EXACT if dtype == torch.float32 else 1e-2
    with torch.no_grad():
        for batch in batches:
            out = model(**{**batch, **call})
            assert error_against_alone(model, batch, out.logits) < tolerance
            torch.testing.assert_close(out.loss, loss_alone(model, batch), atol=tolerance, rtol=0)


def test_pack_mask_of_another_float_dtype_than_the_model_fails_loudly_in_sdpa() -> None:
    model = tiny_llama("sdpa")
    batch = packed_batches(block_mask=True, mask_dtype=torch.bfloat16)[0]
    with (
        torch.no_grad(),
        pytest.raises(
            RuntimeError,
            match=r"^Expected attn_mask dtype to be bool or float or to "
            r"match query dtype",
        ),
    ):
        model(**batch)


@pytest.mark.parametrize(
    ("attn", "options"),
    [("eager", {}), ("sdpa", {}), ("eager", dict(block_mask=True, mask_dtype=torch.bool))],
)
def test_pack_batch_attends_across_documents_where_the_docs_say_so(attn: str, options: dict) -> None:
    """Pinned HF behaviour: position-only packing under the default ``use_cache=True`` (the batch's
    ``use_cache=False`` dropped), and a bool mask in eager."""
    model = tiny_llama(attn)
    with torch.no_grad():
        batch = {k: v for k, v in packed_batches(**options)[0].items() if k != "use_cache"}
        assert error_against_alone(model, batch, model(**batch).logits) > 1e-2


class ReferenceFlash:
    """Stands in for the ``flash_attn`` kernels HF calls: plain sdpa per segment, calls recorded."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    @staticmethod
    def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float | None) -> torch.Tensor:
        rep = q.shape[1] // k.shape[1]  # [tokens, heads, dim]; grouped key/value heads repeated
        q, k, v = (x.transpose(0, 1) for x in (q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)))
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale).transpose(0, 1)

    def varlen(
        self,
        q,
        k,
        v,
        cu_seqlens_q,
        cu_seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        dropout_p=0.0,
        softmax_scale=None,
        causal=False,
    ):  # noqa: ANN001 (flash_attn_varlen_func's own signature)
        self.calls.append("varlen")
        bounds = cu_seqlens_q.tolist()
        assert cu_seqlens_q.dtype == torch.int32 and torch.equal(cu_seqlens_q, cu_seqlens_k)
        assert bounds[-1] == q.shape[0] and max_seqlen_q == max_seqlen_k == max(np.diff(bounds))
        return torch.cat(
            [self._attend(q[a:b], k[a:b], v[a:b], causal, softmax_scale) for a, b in zip(bounds, bounds[1:])]
        )

    def dense(self, q, k, v, dropout_p=0.0, softmax_scale=None, causal=False):  # noqa: ANN001
        self.calls.append("dense")
        return torch.stack([self._attend(q[i], k[i], v[i], causal, softmax_scale) for i in range(len(q))])


FLASH_NAMES = (
    "_loaded_implementation",
    "_flash_fn",
    "_flash_varlen_fn",
    "_flash_with_kvcache_fn",
    "_pad_fn",
    "_unpad_fn",
    "_process_flash_kwargs_fn",
    "_process_with_kvcache_kwargs_fn",
    "_lazy_define_process_function",
)


def install_reference_flash(fa: Any, setattr: Any) -> ReferenceFlash:
    """Point HF's flash-attention module ``fa`` at the reference kernels, with ``setattr`` (to undo it later)."""
    kernels = ReferenceFlash()
    for name, value in [
        ("_flash_fn", kernels.dense),
        ("_flash_varlen_fn", kernels.varlen),
        ("_flash_with_kvcache_fn", None),
        ("_pad_fn", fa._pad_input),
        ("_unpad_fn", fa._unpad_input),
        ("_process_flash_kwargs_fn", fa._lazy_define_process_function(kernels.varlen)),
        ("_process_with_kvcache_kwargs_fn", dict),
        ("_loaded_implementation", "flash_attention_2"),
    ]:
        setattr(fa, name, value)
    return kernels


@pytest.fixture
def reference_flash(monkeypatch: pytest.MonkeyPatch) -> ReferenceFlash:
    """HF's flash-attention path (``transformers.modeling_flash_attention_utils``) on the reference kernels."""
    fa = pytest.importorskip("transformers.modeling_flash_attention_utils")
    if not all(hasattr(fa, name) for name in FLASH_NAMES):
        pytest.skip("transformers' flash-attention internals changed; update this fixture")
    return install_reference_flash(fa, monkeypatch.setattr)


@pytest.mark.parametrize("call", [{}, dict(use_cache=True)])
def test_pack_batch_runs_hf_flash_attention_varlen_at_any_batch_size(
    reference_flash: ReferenceFlash, call: dict
) -> None:
    model = tiny_llama("sdpa")
    batch = packed_batches()[0]
    assert len(batch["input_ids"]) == 3
    with torch.no_grad():
        model.config._attn_implementation = "flash_attention_2"
        packed = model(**{**batch, **call}).logits
        assert reference_flash.calls == ["varlen"] * 2  # once per layer, from cu_seq_lens_*/max_length_*
        position_only = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"]).logits
        assert reference_flash.calls[2:] == ["dense"] * 2  # HF detects packing from positions only at B == 1
        model.config._attn_implementation = "sdpa"
        assert error_against_alone(model, batch, packed) < EXACT
        assert error_against_alone(model, batch, position_only) > 1e-2


def test_pack_block_mask_fails_loudly_in_hf_flash_attention(reference_flash: ReferenceFlash) -> None:
    model = tiny_llama("sdpa")
    model.config._attn_implementation = "flash_attention_2"  # flash takes a 2-D padding mask only
    with torch.no_grad(), pytest.raises(IndexError):
        model(**packed_batches(block_mask=True)[0])


def hf_flattened(features: list[list[int]]) -> dict:
    collator = transformers.DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_seq_idx=True)
    return collator([{"input_ids": f} for f in features])


def test_pack_batch_equals_data_collator_with_flattening_on_a_full_row() -> None:
    docs = [[1, 2, 3], [4, 5], [6, 7, 8, 9], [10]]  # fill one row of 10 exactly
    batch = next(Packer(IterableWrapper([TokenChunk.from_lists(docs)]), seq_len=10, buffer_size=8, pad_id=0))
    order = [[6, 7, 8, 9], [1, 2, 3], [4, 5], [10]]  # best fit decreasing: longest first
    assert batch["input_ids"].tolist() == [sum(order, [])]
    hf = hf_flattened(order)
    assert sorted(batch) == sorted([*hf, "use_cache"]) and batch["use_cache"] is False  # padpipe's one more key
    for key, value in hf.items():
        if isinstance(value, torch.Tensor):
            assert batch[key].dtype == value.dtype and torch.equal(batch[key], value), key
        else:
            assert type(batch[key]) is type(value) and batch[key] == value, key


def test_pack_batch_flattened_equals_data_collator_with_flattening_with_padding() -> None:
    docs = [[1, 2, 3], [4, 5, 6, 7, 8], [9, 10], [11, 12, 13, 14, 15, 16, 17], [18]]
    batch = next(
        Packer(IterableWrapper([TokenChunk.from_lists(docs)]), seq_len=8, batch_size=3, buffer_size=8, pad_id=0)
    )
    rows = batch["input_ids"].tolist()
    assert rows == [[11, 12, 13, 14, 15, 16, 17, 18], [4, 5, 6, 7, 8, 1, 2, 3], [9, 10, 0, 0, 0, 0, 0, 0]]
    # HF flattens the whole batch into one row; padpipe's padding run is one more segment
    hf = hf_flattened([[11, 12, 13, 14, 15, 16, 17], [18], [4, 5, 6, 7, 8], [1, 2, 3], [9, 10], [0] * 6])
    for key in ("input_ids", "position_ids", "seq_idx"):
        assert batch[key].dtype == hf[key].dtype and torch.equal(batch[key].reshape(1, -1), hf[key]), key
    for key in ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k"):
        assert torch.equal(batch[key], hf[key]) if key.startswith("cu") else batch[key] == hf[key], key
    labels = hf["labels"].reshape(3, 8)
    labels[2, 2:] = -100  # padding predicts nothing
    assert torch.equal(batch["labels"], labels)
