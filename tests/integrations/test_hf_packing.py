"""padpipe.hf.Trainer checks packing in the model before training: fixes ``use_cache``, refuses a leak or a model
whose layers carry state across documents."""

from __future__ import annotations

import gzip
import itertools
import json
import logging
import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

import padpipe as pp  # noqa: E402
from padpipe.hf import Trainer  # noqa: E402

pytestmark = pytest.mark.timeout(300)
VOCAB = 8000


def packed(**options) -> pp.Pipeline:
    """Shipped-corpus documents of 3 to 27 words in rows of 64 tokens, 2 rows a batch."""
    with gzip.open(pp.examples.SAMPLE_JSONL, "rt") as f:
        texts = [json.loads(line)["text"].split() for line in itertools.islice(f, 60)]
    rows = [{"text": " ".join(words[: 3 + 7 * i % 25])} for i, words in enumerate(texts)]
    tokens = pp.from_iterable(rows).tokenize(pp.examples.tokenizer(), max_length=64, num_threads=1)
    return tokens.pack(64, batch_size=2, buffer_size=16, **options)


def llama() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, attn_implementation="sdpa"
    )
    return transformers.LlamaForCausalLM(config)


def bert() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64
    )
    return transformers.BertForMaskedLM(config)


def arguments(out, **changes) -> transformers.TrainingArguments:
    options = dict(max_steps=2, report_to=[], use_cpu=True, disable_tqdm=True, save_strategy="no", seed=0)
    return transformers.TrainingArguments(str(out), **{**options, **changes})


def training_calls(model: torch.nn.Module) -> list[dict]:
    """The keyword arguments of every forward the model runs in training mode."""
    calls: list[dict] = []
    model.register_forward_pre_hook(
        lambda module, args, kwargs: calls.append(dict(kwargs)) if module.training else None, with_kwargs=True
    )
    return calls


def test_trainer_trains_on_the_batch_use_cache_false_whatever_the_config_says(tmp_path, caplog) -> None:
    model = llama()
    calls = training_calls(model)
    trainer = Trainer(model=model, args=arguments(tmp_path, use_cache=True), train_dataset=packed())
    assert model.config.use_cache is True  # as the arguments say: without the batch's False, packed rows would leak
    with caplog.at_level(logging.INFO, logger="padpipe.hf"):
        trainer.train()
    assert trainer.state.global_step == 2 and len(calls) == 2
    assert all(call["use_cache"] is False and "position_ids" in call for call in calls)
    assert model.config.use_cache is True  # left as it is, for generation
    dropped = lambda batch: {k: v for k, v in batch.items() if k != "use_cache"}  # noqa: E731
    with pytest.raises(pp.PackingError, match=r"cause \[use_cache\]"):  # what the batch's False prevents
        pp.check_packing(model, packed().loader(), columns=dropped)
    messages = [r.getMessage() for r in caplog.records if r.name == "padpipe.hf"]
    assert any(
        m.startswith("padpipe.hf.Trainer: packing in the model checked on the first batch: exact: 6") for m in messages
    )


def test_trainer_refuses_to_train_a_model_that_reads_packed_rows_wrong(tmp_path) -> None:
    torch.manual_seed(0)
    model = transformers.MambaForCausalLM(
        transformers.MambaConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2)
    )
    before = [p.detach().clone() for p in model.parameters()]
    trainer = Trainer(model=model, args=arguments(tmp_path), train_dataset=packed())
    message = (
        r"^padpipe\.hf\.Trainer: packed documents would see each other in this model; cause \[recurrent_state\]: "
        r"MambaForCausalLM: state runs on from one document into the next in its 2 linear_attention layers "
        r"\(MambaMixer\), and nothing keeps packed documents apart in them \(mamba_inner_fn and selective_scan_fn take "
        r"no document boundaries\)\. Fix: do not pack: \.bucket\(max_tokens=\.\.\.\)\.pad\(\): one document a row, "
        r"padding on the right\. Pass `check_packing=False` to padpipe\.hf\.Trainer to train anyway\.$"
    )
    with pytest.raises(pp.PackingError, match=message):
        trainer.train()
    assert trainer.state.global_step == 0
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))  # not a step taken


def test_trainer_with_check_packing_false_trains_as_it_is_told(tmp_path) -> None:
    model = bert()
    trainer = Trainer(model=model, args=arguments(tmp_path), train_dataset=packed(), check_packing=False)
    trainer.train()
    assert trainer.state.global_step == 2


def test_trainer_checks_packing_with_the_columns_the_model_gets(tmp_path) -> None:
    """A forward without ``**kwargs`` loses ``position_ids`` to the column filter: refused."""

    class NoPositions(transformers.LlamaForCausalLM):
        def forward(self, input_ids=None, labels=None, use_cache=None):  # noqa: ANN001, ANN201
            return super().forward(input_ids=input_ids, labels=labels, use_cache=use_cache)

    torch.manual_seed(0)
    model = NoPositions(llama().config)
    trainer = Trainer(model=model, args=arguments(tmp_path), train_dataset=packed())
    message = r"cause \[position_ids_missing\]: the model gets no position_ids \(the batch has them; they were dropped"
    with pytest.raises(pp.PackingError, match=message):
        trainer.train()


def test_trainer_check_packing_must_be_a_bool(tmp_path) -> None:
    with pytest.raises(TypeError, match=r"^`check_packing` must be a bool, but is 'no' instead\.$"):
        Trainer(model=llama(), args=arguments(tmp_path), train_dataset=packed(), check_packing="no")


def test_guard_checks_on_rank_zero_only_and_not_under_fsdp(caplog) -> None:
    from types import SimpleNamespace

    from padpipe.integrations.hf_packing import guard_columns

    class Leaky(torch.nn.Module):  # every call would fail the check: only calls that happen count
        calls = 0

        def forward(self, **inputs):
            Leaky.calls += 1
            return torch.randn(*inputs["input_ids"].shape, 3)

    batch = next(iter(packed().loader()))
    for rank, fsdp in ((1, False), (0, True)):
        trainer = SimpleNamespace(
            model=Leaky(), args=SimpleNamespace(process_index=rank), is_fsdp_enabled=fsdp, is_deepspeed_enabled=False
        )
        select = guard_columns(trainer, dict)
        with caplog.at_level(logging.WARNING, logger="padpipe.hf"):
            assert sorted(select(batch)) == sorted(batch)
    assert Leaky.calls == 0
    assert [r.getMessage()[:60] for r in caplog.records] == [
        "padpipe.hf.Trainer does not check packing under FSDP or Deep"
    ]


def test_guard_warns_that_it_cannot_check_a_first_batch_of_one_document_rows(caplog) -> None:
    """Rows of one document each (long documents split) prove nothing: a warning, not a claim that packing is exact."""
    from types import SimpleNamespace

    from padpipe.integrations.hf_packing import guard_columns

    ids = next(iter(packed().loader()))["input_ids"]
    batch = {"input_ids": ids, "position_ids": torch.arange(64).expand(2, 64).clone(), "labels": ids.clone()}
    trainer = SimpleNamespace(
        model=llama(), args=SimpleNamespace(process_index=0), is_fsdp_enabled=False, is_deepspeed_enabled=False
    )
    select = guard_columns(trainer, dict)
    with caplog.at_level(logging.INFO, logger="padpipe.hf"):
        assert select(batch) == {**batch, "use_cache": False}
    assert [r.getMessage()[:88] for r in caplog.records] == [
        "padpipe.hf.Trainer passes use_cache=False to LlamaForCausalLM's training forward: with u",
        "padpipe.hf.Trainer: packing in the model is not checked: check_packing: no row of the ba",
    ]
    assert caplog.records[-1].getMessage().endswith("Run pp.check_packing(model, pipe.loader()) before training.")


def test_trainer_trains_packed_masked_rows_on_their_labels_without_their_kept_ids(tmp_path, caplog) -> None:
    """Masked SFT rows packed with ``keep=("idx",)``: the model gets each document's labels, never the ids."""
    rows = []
    for i in range(40):
        ids = [5 + (i * 31 + j * 17) % (VOCAB - 5) for j in range(4 + (i * 7) % 19)]
        rows.append({"input_ids": ids, "labels": [-100] * (1 + i % 3) + ids[1 + i % 3 :], "idx": i})
    pipe = pp.from_iterable(rows).tokens(pad_id=0).pack(64, batch_size=2, buffer_size=16, keep=("idx",))
    model = llama()
    calls = training_calls(model)
    trainer = Trainer(model=model, args=arguments(tmp_path, use_cache=False), train_dataset=pipe)
    with caplog.at_level(logging.INFO, logger="padpipe.hf"):
        trainer.train()
    assert trainer.state.global_step == 2 and all("idx" not in call for call in calls)
    expected = [batch["labels"] for batch in itertools.islice(pipe.loader(), 2)]
    assert all(torch.equal(call["labels"], labels) for call, labels in zip(calls, expected))
    assert any(
        r.getMessage().startswith("padpipe.hf.Trainer: packing in the model checked on the first batch: exact: ")
        and "get their own logits and loss" in r.getMessage()
        for r in caplog.records
    )
