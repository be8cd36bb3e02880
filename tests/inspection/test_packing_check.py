"""``pp.check_packing`` on tiny HF models built from configs: exact where packing is, each known cause named.

Causal LMs (Llama, Qwen2) and a BERT masked LM, CPU ``eager`` and ``sdpa``; the flash-attention path
runs HF's own flash code with the suite's reference varlen kernel (tests/pipes/test_pack_hf.py).
"""

from __future__ import annotations

import functools
import gzip
import itertools
import json
import os
from typing import Any

import pytest
import torch

import padpipe as pp
from padpipe.inspection.packing_check import NothingToCheck
from padpipe.inspection.packing_rows import read_batches
from tests.contract import normalize
from tests.pipes.test_pack_hf import ReferenceFlash, reference_flash  # noqa: F401 (a fixture)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")

SEQ_LEN = 64
VOCAB = 8000


def causal_lm(kind: str = "llama", attn: str = "sdpa", **config: Any) -> Any:
    torch.manual_seed(0)
    make = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
    }[kind]
    options = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2)
    options.update(num_attention_heads=4, num_key_value_heads=2, attn_implementation=attn)
    return make[1](make[0](**options, **config))


def masked_lm(attn: str = "sdpa") -> Any:
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64
    )
    config._attn_implementation = attn
    return transformers.BertForMaskedLM(config)


def batches(n: int = 2, **options: Any) -> list[dict]:
    """Shipped-corpus documents of 3 to 27 words, packed into 2 rows of 64 tokens: several documents a row."""
    return [dict(b) for b in _packed(n, tuple(sorted(options.items())))]


@functools.cache
def _packed(n: int, options: tuple) -> list[dict]:
    with gzip.open(pp.examples.SAMPLE_JSONL, "rt") as f:
        texts = [json.loads(line)["text"].split() for line in itertools.islice(f, 40)]
    rows = [{"text": " ".join(words[: 3 + 7 * i % 25])} for i, words in enumerate(texts)]
    pipe = pp.from_iterable(rows).tokenize(pp.examples.tokenizer(), max_length=SEQ_LEN, num_threads=1)
    return list(itertools.islice(pipe.pack(SEQ_LEN, batch_size=2, buffer_size=16, **dict(options)).loader(), n))


def bidirectional_mask(batch: dict) -> dict:
    seq_idx = batch["seq_idx"]
    return {**batch, "attention_mask": seq_idx[:, None, :, None] == seq_idx[:, None, None, :]}


def without(*keys: str):
    return lambda batch: {k: v for k, v in batch.items() if k not in keys}


EXACT = [  # model, its packed batches
    (lambda: causal_lm("llama", "sdpa", use_cache=False), lambda: batches()),
    (lambda: causal_lm("llama", "sdpa"), lambda: batches()),  # use_cache=True: the batch's use_cache=False wins
    (lambda: causal_lm("llama", "eager"), lambda: batches(block_mask=True)),
    (lambda: causal_lm("qwen2", "sdpa"), lambda: batches(block_mask=True, mask_dtype=torch.bool)),
    (lambda: causal_lm("qwen2", "eager", use_cache=False), lambda: batches()),
    (lambda: causal_lm("llama", "sdpa").to(torch.bfloat16), lambda: batches(block_mask=True)),
    (lambda: masked_lm("sdpa"), lambda: [bidirectional_mask(b) for b in batches()]),
]


@pytest.mark.parametrize(("model", "packed"), EXACT)
def test_check_packing_works_where_packing_is_exact(model, packed) -> None:
    model = model().train()
    report = pp.check_packing(model, packed())
    assert report.exact and len(report.documents) == 8
    assert sum(d.document.start > 0 for d in report.documents) == 6  # all 6 after another in their row come first
    assert report.max_abs_diff <= report.atol and model.training  # training mode restored
    assert report.verdict.startswith("exact: 8 documents get their own logits")


def test_check_packing_reports_each_document_and_the_settings() -> None:
    model = causal_lm("llama", "sdpa", use_cache=False)
    report = pp.check_packing(model, iter(batches(3)), max_documents=3, max_batches=1)
    assert [str(d.document) for d in report.documents] == [
        "batch 0, row 0, tokens 36:58",
        "batch 0, row 0, tokens 58:64",
        "batch 0, row 1, tokens 36:55",
    ]
    assert (report.attn_implementation, report.use_cache, report.dtype) == ("sdpa", False, "torch.float32")
    assert (report.atol, report.rtol) == (1e-5, 1e-4)
    assert str(report).splitlines()[0] == (
        "check_packing: attn_implementation='sdpa', use_cache=False, dtype=torch.float32, "
        "tolerance atol=1e-05 + rtol=1e-04 x |logits|"
    )


def test_check_packing_leaves_random_states_as_they_were() -> None:
    model, packed = causal_lm("llama", "sdpa", use_cache=False), batches(1)
    state = torch.random.get_rng_state()
    pp.check_packing(model, packed)
    assert torch.equal(torch.random.get_rng_state(), state)


WORST = r"^check_packing: \d+ of \d+ documents get other logits packed than alone, worst at batch \d, row \d, "
WORST += r"tokens \d+:\d+: max abs difference \S+, expected at most \S+; cause "


def arange_positions(batch: dict) -> dict:
    return {**batch, "position_ids": torch.arange(SEQ_LEN).expand(2, SEQ_LEN).clone()}


def with_2d_mask(batch: dict) -> dict:
    return {**batch, "attention_mask": torch.ones(2, SEQ_LEN, dtype=torch.long)}


CAUSES = [  # model, pack options, batch change, columns, message after the common head
    (
        lambda: causal_lm("llama", "sdpa"),  # the model's default use_cache=True; a filter drops the batch's False
        {},
        None,
        without("use_cache"),
        r"\[use_cache\]: use_cache=True \(the batch's use_cache=False was dropped before the model\) with "
        r"attn_implementation='sdpa' and no 4-D mask: HF looks for packed rows in position_ids only when there is no "
        r"cache\. Fix: pass the batch's use_cache=False to the model",
    ),
    (
        lambda: causal_lm("qwen2", "eager"),
        {},
        None,
        without("use_cache"),
        r"\[use_cache\]: use_cache=True \(the batch's use_cache=False was dropped before the model\) with "
        r"attn_implementation='eager'",
    ),
    (
        lambda: causal_lm("llama", "eager"),
        dict(block_mask=True, mask_dtype=torch.bool),
        None,
        None,
        r"\[bool_mask_eager\]: a bool 4-D attention_mask goes to attn_implementation='eager'.*Fix: "
        r"pack\(block_mask=True\) with the default float mask_dtype",
    ),
    (
        lambda: causal_lm("llama", "sdpa", use_cache=False),
        {},
        arange_positions,
        None,
        r"\[position_ids_not_restarting\]: position_ids do not restart at each document: at batch 0, row 0, "
        r"tokens 36:58 \(column 36\) expected 0, found 36 \(positions \[36, 37, 38, 39, 40, 41\] \.\.\.\)\. Fix: "
        r"give the model the position_ids pack\(\) makes, unchanged\.$",
    ),
    (
        lambda: causal_lm("llama", "sdpa", use_cache=False),
        {},
        None,
        without("position_ids"),
        r"\[position_ids_missing\]: the model gets no position_ids \(the batch has them; they were dropped before "
        r"the model\)",
    ),
    (
        lambda: causal_lm("llama", "sdpa", use_cache=False),
        {},
        with_2d_mask,
        None,
        r"\[mask_2d\]: the packed batch carries a 2-D attention_mask.*Fix: drop attention_mask",
    ),
    (
        lambda: masked_lm("sdpa"),  # transformers 5.25 finds packed rows in position_ids for encoders too
        {},
        None,
        without("position_ids"),
        r"\[encoder_without_mask\]: a bidirectional model \(BertForMaskedLM, attn_implementation='sdpa'\) reads "
        r"packed rows without a mask",
    ),
    (
        lambda: masked_lm("eager"),
        dict(block_mask=True),
        None,
        None,
        r"\[causal_mask_on_encoder\]: a causal 4-D attention_mask \(pack\(block_mask=True\)\) goes to a "
        r"bidirectional model \(BertForMaskedLM\)",
    ),
]


@pytest.mark.parametrize(("model", "options", "change", "columns", "message"), CAUSES)
def test_check_packing_raises_error_naming_the_cause(model, options, change, columns, message) -> None:
    packed = [change(b) if change else b for b in batches(**options)]
    with pytest.raises(pp.PackingError, match=WORST + message) as caught:
        pp.check_packing(model(), packed, columns=columns)
    report = caught.value.report
    assert caught.value.cause.key == message[2:].split("\\]")[0]
    assert not report.exact and report.max_abs_diff > 1e-3 and report.verdict.startswith("wrong: ")


def test_check_packing_passes_on_hf_flash_attention_with_the_varlen_kwargs(
    reference_flash: ReferenceFlash,  # noqa: F811 (the fixture imported above)
) -> None:
    for model in (causal_lm("llama", "sdpa"), masked_lm("sdpa")):
        model.config._attn_implementation = "flash_attention_2"
        reference_flash.calls.clear()
        report = pp.check_packing(model, batches(), max_documents=4)
        assert report.exact and report.attn_implementation == "flash_attention_2"
        packed_batches = len({d.document.batch for d in report.documents})  # those holding a checked document
        assert reference_flash.calls.count("varlen") == 2 * packed_batches  # two layers each


def test_check_packing_names_flash_kwargs_dropped_by_a_column_filter(
    reference_flash: ReferenceFlash,  # noqa: F811 (the fixture imported above)
) -> None:
    model = causal_lm("llama", "sdpa")
    model.config._attn_implementation = "flash_attention_2"
    dropped = without("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k", "seq_idx")
    message = (
        r"\[flash_kwargs_missing\]: attn_implementation='flash_attention_2' gets no cu_seq_lens_q, cu_seq_lens_k, "
        r"max_length_q, max_length_k \(cu_seq_lens_q, cu_seq_lens_k, max_length_q, max_length_k dropped before the "
        r"model, as remove_unused_columns=True does\), so on a batch of 2 rows HF runs the dense kernel over whole "
        r"rows\. Fix: keep those keys: TrainingArguments\(remove_unused_columns=False\), or padpipe\.hf\.Trainer"
    )
    with pytest.raises(pp.PackingError, match=WORST + message):
        pp.check_packing(model, batches(), columns=dropped)


def test_check_packing_names_a_4d_mask_given_to_flash_attention(
    reference_flash: ReferenceFlash,  # noqa: F811 (the fixture imported above)
) -> None:
    model = causal_lm("llama", "sdpa")
    model.config._attn_implementation = "flash_attention_2"
    message = (
        r"^check_packing: the packed forward failed \(IndexError\(.*\); cause \[flash_4d_mask\]: a 4-D "
        r"attention_mask \(pack\(block_mask=True\)\) goes to attn_implementation='flash_attention_2', whose flash "
        r"path takes a 2-D padding mask only\. Fix: pack without block_mask"
    )
    with pytest.raises(pp.PackingError, match=message) as caught:
        pp.check_packing(model, batches(block_mask=True))
    assert caught.value.report is None and isinstance(caught.value.__cause__, IndexError)


def test_check_packing_raises_error_when_batches_cannot_show_documents() -> None:
    model = causal_lm()
    with pytest.raises(ValueError, match=r"^check_packing: `batches` holds no batch; expected at least one"):
        pp.check_packing(model, [])
    with pytest.raises(ValueError, match=r"^check_packing: batch 0 has no seq_idx, cu_seq_lens_q or position_ids"):
        pp.check_packing(model, {"input_ids": torch.ones(1, 4, dtype=torch.long)})
    padding = {"input_ids": torch.zeros(1, 4, dtype=torch.long), "labels": torch.full((1, 4), -100)}
    with pytest.raises(
        ValueError, match=r"^check_packing: the batches read \(1\) hold padding only; expected packed rows"
    ):
        pp.check_packing(model, {**padding, "position_ids": torch.arange(4)[None]})
    with pytest.raises(ValueError, match=r"^`max_documents` must be greater than zero, but is 0 instead\.$"):
        pp.check_packing(model, batches(1), max_documents=0)


def one_document_rows(batch: dict) -> dict:
    """``batch``'s ids as rows of one document each (positions 0.., its first label -100): nothing to cross."""
    ids = batch["input_ids"]
    labels = ids.clone()
    labels[:, 0] = -100
    return {"input_ids": ids, "position_ids": torch.arange(ids.shape[1]).expand_as(ids).clone(), "labels": labels}


def test_check_packing_raises_error_when_no_row_holds_two_documents() -> None:
    """A leaky model (use_cache=True on sdpa) must not pass on rows where nothing can leak: no verdict at all."""
    one = one_document_rows(batches(1)[0])
    message = (
        r"^check_packing: no row of the batches read \(1\) holds a document after another, so none can see "
        r"another and the check would prove nothing; expected packed rows of several documents"
    )
    with pytest.raises(NothingToCheck, match=message):
        pp.check_packing(causal_lm(use_cache=True), one)
    assert pp.check_packing(causal_lm(use_cache=False), [one, batches(2)[1]]).exact  # a later batch has rows to check
    padded = {k: v[:, :40] for k, v in one.items()}
    padded = {k: torch.cat([v, torch.zeros_like(v[:, :24])], 1) for k, v in padded.items()}
    padded["labels"][:, 40:] = -100
    padded["position_ids"] = torch.cat([torch.arange(40), torch.arange(24)]).expand(2, 64).clone()  # as pack()
    with pytest.raises(NothingToCheck, match=r"^check_packing: no row of the batches read \(1\) holds a document "):
        pp.check_packing(causal_lm(use_cache=True), padded)  # a causal document cannot see the padding after it
    with pytest.raises(pp.PackingError, match=r"cause \[encoder_without_mask\]"):
        pp.check_packing(masked_lm(), padded, columns=without("position_ids"))  # a bidirectional one can


def _small_packed_pipe() -> pp.Pipeline:
    with gzip.open(pp.examples.SAMPLE_JSONL, "rt") as f:
        rows = [{"text": json.loads(line)["text"]} for line in itertools.islice(f, 40)]
    tokens = pp.from_iterable(rows).shuffle(16, seed=3).tokenize(pp.examples.tokenizer(), max_length=16)
    return tokens.pack(SEQ_LEN, batch_size=2, buffer_size=16)


def _ids(batches: Any) -> list:
    return [b["input_ids"].tolist() for b in batches]


def test_check_packing_leaves_a_loader_it_reads_as_it_was() -> None:
    """Checking the training loader before its loop, or after a loop, must not shift training (another epoch's order)."""
    pipe = _small_packed_pipe()
    fresh = pipe.loader()
    epochs = [_ids(fresh), _ids(fresh), _ids(fresh)]
    assert epochs[0] != epochs[1], "each epoch its own order"
    loader = pipe.loader()
    assert pp.check_packing(causal_lm(use_cache=False), loader).exact
    assert _ids(loader) == epochs[0]
    assert pp.check_packing(causal_lm(use_cache=False), loader).exact
    assert _ids(loader) == epochs[1]
    loader.set_epoch(0)
    assert pp.check_packing(causal_lm(use_cache=False), loader).exact
    assert _ids(loader) == epochs[0] and _ids(loader) == epochs[1]


@pytest.mark.parametrize("at_step", [0, 3])
def test_check_packing_inside_the_loop_leaves_the_loop_and_its_states_as_without_it(at_step: int) -> None:
    """Issue 30 item 4 (F3): a check inside ``for batch in loader`` switched the loop to the next epoch's batches."""
    pipe = _small_packed_pipe()
    model = causal_lm(use_cache=False)

    def run(check: bool) -> tuple[list, list, list]:
        loader, seen, states = pipe.loader(), [], []
        for step, batch in enumerate(loader):
            if check and step == at_step:
                report = pp.check_packing(model, loader)
                checked = [d.document.batch for d in report.documents]
                assert report.exact and checked and max(checked) <= 1
            seen.append(batch["input_ids"].tolist())
            states.append(normalize(loader.state_dict()))
        return seen, states, _ids(loader)

    plain, checked = run(check=False), run(check=True)
    assert checked[0] == plain[0]  # the loop's batches: epoch 0, each once
    assert checked[1] == plain[1]  # its states, step by step
    assert checked[2] == plain[2] != plain[0]  # the next pass: epoch 1 from its start


def test_check_packing_inside_the_loop_checks_the_batches_the_loop_reads_next() -> None:
    pipe = _small_packed_pipe()
    loader = pipe.loader()
    it = iter(loader)
    next(it)
    read = read_batches(loader, 2)
    assert _ids(read) == _ids(itertools.islice(it, 2))
    assert loader.stats().batches == 3  # the copy's batches are not counted in the loader's stats


def test_check_packing_runs_the_packed_forward_without_labels_and_compares_in_chunks(monkeypatch) -> None:
    """The model's own loss over the batch is not computed (a batch's logits held once); chunks change nothing."""
    import padpipe.inspection.packing_loss as packing_loss

    model = causal_lm("llama", "sdpa", use_cache=False)
    given: list[set[str]] = []
    model.register_forward_pre_hook(lambda _, args, kwargs: given.append(set(kwargs)), with_kwargs=True)
    packed = batches(1)
    whole = pp.check_packing(model, packed)
    assert "labels" in packed[0] and given[0] == {"input_ids", "position_ids", "seq_idx", "cu_seq_lens_q",
                                                   "cu_seq_lens_k", "max_length_q", "max_length_k",
                                                   "use_cache"}  # fmt: skip
    monkeypatch.setattr(packing_loss, "ROWS_AT_ONCE", 3)
    chunked = pp.check_packing(model, packed)
    for a, b in zip(whole.documents, chunked.documents):
        assert a.document == b.document and a.max_abs_diff == b.max_abs_diff and a.tolerance == b.tolerance
        assert a.loss is not None and b.loss is not None
        assert (a.loss.trained_packed, a.loss.trained_alone) == (b.loss.trained_packed, b.loss.trained_alone)
        assert a.loss.packed == pytest.approx(b.loss.packed, rel=1e-5) and b.loss.exact
