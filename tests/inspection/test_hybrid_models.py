"""Every hybrid and recurrent causal-LM class of the installed transformers, packed: none silently wrong.

One tiny random model of each class (tests/hybrid_models.py, built once, CPU float32). For each,
what :func:`padpipe.model_kind` says is checked against what the model does with a packed batch on
this CPU, where no kernel is installed: a class said to keep documents apart with kernels gets the
boundaries as far as transformers' torch fallback, which refuses them; a class said to keep nothing
apart reads the batch and lets documents see each other. Then ``pp.check_packing`` names that cause
(also under HF's column filter, which leaves position_ids only), ``padpipe.hf.Trainer`` refuses
before a step, and the recipes, given the model, bucket its documents so that each gets the logits
it has alone in the docs' own ``model(**batch)`` loop. With reference kernels standing in for
causal-conv1d, mamba-ssm and flash-linear-attention (tests/inspection/reference_kernels.py), the
flat layout is exact in every class that keeps documents apart.
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from typing import Any

import pytest
import torch

import padpipe as pp
from padpipe.hf import Trainer
from padpipe.inspection import packing_model
from padpipe.recipes.pretrain import load_tokenizer, pretrain
from tests.hybrid_models import EXPECTED, SKIPPED, TINY, VOCAB, build, hybrid_and_recurrent_types

transformers = pytest.importorskip("transformers")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]  # 29 models: seconds each, a minute in all
TYPES = sorted(TINY)
REFUSED = "can't keep packed sequences apart without"  # transformers' torch fallbacks, given boundaries


@functools.cache
def tiny(model_type: str) -> torch.nn.Module:
    return build(model_type)


def documents(lengths: tuple[int, ...] = (23, 17, 11, 9, 30, 6, 14, 20)) -> list[list[int]]:
    return [[4 + (97 * d + 31 * j) % (VOCAB - 4) for j in range(n)] for d, n in enumerate(lengths)]


def packed(layout: str = "rows", **options: Any) -> pp.Pipeline:
    rows = [{"input_ids": ids} for ids in documents()]
    return pp.from_iterable(rows).tokens(pad_id=0).pack(64, batch_size=2, buffer_size=16, layout=layout, **options)


def arguments(out, **changes) -> transformers.TrainingArguments:  # noqa: ANN001
    options = dict(max_steps=2, report_to=[], use_cpu=True, disable_tqdm=True, save_strategy="no", seed=0)
    return transformers.TrainingArguments(str(out), **{**options, **changes})


def test_every_hybrid_and_recurrent_causal_lm_class_has_a_tiny_model() -> None:
    found = hybrid_and_recurrent_types()
    assert sorted(found.values()) == sorted(set(TINY) | set(SKIPPED)), "a class without a tiny model (or a reason)"
    assert sorted(TINY) == sorted(EXPECTED)
    assert len(found) == 29


@pytest.mark.parametrize("model_type", TYPES)
def test_model_kind_finds_what_keeps_each_class_documents_apart(model_type: str, monkeypatch) -> None:
    kind, packages = EXPECTED[model_type]
    model = tiny(model_type)
    found = pp.model_kind(model)
    assert (found.kind, found.packages) == (kind, packages), str(found)
    assert found.model == type(model).__name__ and str(found).startswith(found.model)
    assert found.layout == "bucket" and found.missing == packages  # this CPU: no kernel
    monkeypatch.setattr(packing_model, "_usable", lambda package, device: device == "cuda")
    on_gpu = pp.model_kind(model, device="cuda")
    expected = "bucket" if kind == "recurrent" else "flat" if "fla" in packages else "rows"
    assert (on_gpu.layout, on_gpu.missing) == (expected, ())
    assert pp.model_kind(model.config).kind == ("varlen" if model_type in ("kimi_linear", "bailing_hybrid",
                                                                           "inkling_text") else kind)  # fmt: skip


@pytest.mark.parametrize("model_type", TYPES)
def test_check_packing_names_the_real_cause_in_each_class(model_type: str) -> None:
    """Varlen classes get the boundaries to transformers' torch fallback (which refuses them here); the others leak."""
    kind, _ = EXPECTED[model_type]
    model = tiny(model_type)
    key = "kernel_missing" if kind == "varlen" else "recurrent_state"
    with pytest.raises(pp.PackingError, match=rf"; cause \[{key}\]: {type(model).__name__}: state runs on") as caught:
        pp.check_packing(model, packed().loader())
    report = caught.value.report
    if kind == "varlen" or report is None:  # the forward refused the boundaries (a recurrent class's convolution
        assert report is None and REFUSED in str(caught.value.__cause__)  # may take them; its scan still does not)
    else:
        assert report.max_abs_diff > 1e-2  # a real leak, well past rounding
    hf_columns = lambda batch: {k: batch[k] for k in ("input_ids", "position_ids", "labels", "use_cache")}  # noqa: E731
    with pytest.raises(pp.PackingError, match=rf"; cause \[{key}\]") as caught:  # HF Trainer's column filter
        pp.check_packing(model, packed().loader(), columns=hf_columns)
    assert caught.value.report.max_abs_diff > 1e-2  # what training on position_ids alone would have done


@pytest.mark.parametrize("model_type", ["mamba", "jamba", "minimax", "recurrent_gemma", "rwkv", "xlstm", "zaya"])
def test_check_packing_names_the_state_not_the_mask_when_given_a_block_mask(model_type: str) -> None:
    """A 4-D mask keeps attention apart, never a recurrent layer's state (it crashed Mamba's forward before)."""
    with pytest.raises(pp.PackingError, match=r"; cause \[recurrent_state\]: .*Fix: do not pack: \.bucket"):
        pp.check_packing(tiny(model_type), packed(block_mask=True).loader())


@pytest.mark.parametrize("model_type", TYPES)
def test_recipes_bucket_each_class_so_the_docs_loop_gives_every_document_its_own_logits(model_type: str) -> None:
    model = tiny(model_type)
    tokenizer = load_tokenizer(pp.examples.TOKENIZER_JSON, "[SEP]")
    pipe = pretrain(pp.examples.SAMPLE_JSONL, tokenizer, seq_len=64, batch_size=4, model=model)  # on this CPU
    batch = next(iter(pipe.loader()))
    assert "seq_idx" not in batch and batch["attention_mask"].shape[0] > 1  # bucketed: one document a row
    with torch.no_grad():
        out = model(**batch)  # the docs' loop: model(**batch).loss
        assert torch.isfinite(out.loss)
        for r, (row, mask) in enumerate(zip(batch["input_ids"], batch["attention_mask"])):
            n = int(mask.sum())
            assert bool(mask[:n].all())  # padding on the right
            alone = model(input_ids=row[:n][None], use_cache=False).logits[0]
            assert (out.logits[r, :n] - alone).abs().max() <= 1e-5 + 1e-4 * alone.abs().max()


@pytest.mark.parametrize("model_type", TYPES)
def test_padpipe_hf_trainer_refuses_packed_rows_of_each_class_before_a_step(model_type: str, tmp_path) -> None:
    kind, _ = EXPECTED[model_type]
    model = tiny(model_type)
    before = [p.detach().clone() for p in model.parameters()]
    trainer = Trainer(model=model, args=arguments(tmp_path), train_dataset=packed())
    key = "kernel_missing" if kind == "varlen" else "recurrent_state"
    with pytest.raises(pp.PackingError, match=rf"^padpipe\.hf\.Trainer: packed documents would see each other in this "
                                              rf"model; cause \[{key}\]: "):  # fmt: skip
        trainer.train()
    assert trainer.state.global_step == 0 and all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    model.eval()


def test_a_plain_transformers_trainer_given_a_packed_pipeline_stops_at_its_first_batch(tmp_path) -> None:
    """Its column filter would keep position_ids only (the layers' silent leak): it never gets that far."""
    trainer = transformers.Trainer(model=build("qwen3_5_text"), args=arguments(tmp_path), train_dataset=packed())
    with pytest.raises(RuntimeError, match=r"batches them again .* use padpipe\.hf\.Trainer \(it reads"):
        trainer.train()
    assert trainer.state.global_step == 0


@pytest.mark.parametrize("model_type", ["mamba", "qwen3_5_text", "rwkv", "granitemoehybrid"])
def test_padpipe_hf_trainer_trains_each_kind_on_the_batches_its_recipe_chose(model_type: str, tmp_path) -> None:
    model = build(model_type)  # its own: training changes it
    tokenizer = load_tokenizer(pp.examples.TOKENIZER_JSON, "[SEP]")
    train = pretrain(pp.examples.SAMPLE_JSONL, tokenizer, seq_len=64, batch_size=4, model=model)
    trainer = Trainer(model=model, args=arguments(tmp_path), train_dataset=train)
    trainer.train()
    assert trainer.state.global_step == 2


def test_attention_masks_built_without_position_ids_are_named_and_fixed_by_a_block_mask() -> None:
    """GPT-OSS and GraniteMoeHybrid's attention build their masks without position_ids: eager/sdpa see across."""
    torch.manual_seed(0)
    oss = transformers.GptOssForCausalLM(
        transformers.GptOssConfig(
            vocab_size=VOCAB, hidden_size=32, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=1, head_dim=16, num_local_experts=2, num_experts_per_tok=1, initializer_range=0.2,
            attn_implementation="eager",
        )
    )  # fmt: skip
    attention_only = build("granitemoehybrid", layer_types=["attention", "attention"], attn_implementation="sdpa")
    for model in (oss, attention_only):
        kind = pp.model_kind(model)
        assert kind.mask_without_positions and str(kind).startswith(f"{type(model).__name__} builds its attention")
        with pytest.raises(pp.PackingError, match=r"; cause \[mask_without_positions\]: .*Fix: use "
                                                  r"attn_implementation='flash_attention_2'"):  # fmt: skip
            pp.check_packing(model, packed().loader())
        assert pp.check_packing(model, packed(block_mask=True).loader()).exact


def test_flat_layout_is_exact_with_reference_kernels_in_every_class_that_keeps_documents_apart() -> None:
    """Kernels that honour seq_idx / cu_seqlens as causal-conv1d, mamba-ssm and FLA document it (per-document
    torch fallbacks, the kernels' checks): a fresh interpreter, so that transformers binds them at import."""
    done = subprocess.run(
        [sys.executable, "-m", "tests.inspection.reference_kernels"], capture_output=True, text=True, timeout=540
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.splitlines()[-1])
    for model_type, (kind, packages) in EXPECTED.items():
        got = results[model_type]
        if kind == "recurrent":  # with the kernels too: nothing keeps these apart
            assert got["flat"].startswith("PackingError recurrent_state"), (model_type, got)
            continue
        assert got["kind"] == ["varlen", "flat" if "fla" in packages else "rows"], (model_type, got)
        if model_type == "granitemoehybrid":  # its attention reads no position_ids: a block mask on rows is exact
            assert got["flat"].startswith("PackingError mask_without_positions") and got["rows"] == "exact"
            continue
        assert got["flat"] == "exact", (model_type, got)
        rows = "PackingError flat_layout" if "fla" in packages else "exact"  # FLA: "The batch size is expected to be 1"
        assert got["rows"].startswith(rows), (model_type, got)
    assert results["trained"] == {"qwen3_5_text": 2}  # padpipe.hf.Trainer on the flat layout


def test_a_model_that_reads_no_positions_is_never_told_to_take_them(monkeypatch) -> None:
    """Mamba2 on a device with its kernels, given seq_idx but not position_ids: no `position_ids_missing`."""
    from padpipe.inspection.packing_causes import diagnose

    monkeypatch.setattr(packing_model, "_usable", lambda package, device: True)
    batch = next(iter(packed().loader()))
    inputs = {k: v for k, v in batch.items() if k != "position_ids"}
    assert diagnose(tiny("mamba2"), batch, inputs, []).key == "state_leak"
    assert diagnose(tiny("qwen3_5_text"), batch, inputs, []).key == "flat_layout"  # it reads them: first the row
