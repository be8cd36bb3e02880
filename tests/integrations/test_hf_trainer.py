"""padpipe.hf.Trainer: pipelines into transformers' Trainer, on one process and on two (torchrun, gloo)."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

import padpipe as pp  # noqa: E402
from padpipe.checkpoints import CHECKPOINT, PART_KEYS  # noqa: E402
from padpipe.hf import LOADER_STATE, Trainer  # noqa: E402
from padpipe.recipes.glue import glue  # noqa: E402
from tests.integrations.tiny import (  # noqa: E402
    ROOT,
    TRAIN_ROWS,
    VAL_ROWS,
    bert_config,
    recording_bert,
    torchrun,
    write_mrpc,
)
from tests.worker_errors import raises_in_workers  # noqa: E402

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def mrpc(tmp_path_factory) -> Path:
    return write_mrpc(tmp_path_factory.mktemp("hf") / "mrpc")


def labels(mrpc: Path) -> np.ndarray:
    return pq.read_table(mrpc / "validation-00000-of-00001.parquet").column("label").to_numpy()


def arguments(out: Path, **changes) -> transformers.TrainingArguments:
    options = dict(
        max_steps=12,
        learning_rate=1e-3,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        save_strategy="no",
        logging_steps=100,
        seed=0,
    )
    return transformers.TrainingArguments(str(out), **{**options, **changes})


def accuracy(p) -> dict:
    return {"accuracy": float((p.predictions.argmax(-1) == p.label_ids).mean())}


def by_epoch(steps: list[dict]) -> dict[int, list[dict]]:
    epochs: dict[int, list[dict]] = {}
    for step in steps:
        epochs.setdefault(step["epoch"], []).append(step)
    return epochs


class Epochs(transformers.TrainerCallback):
    def on_epoch_begin(self, args, state, control, model=None, **kwargs):
        model.epoch += 1


def recorder() -> torch.nn.Module:
    model = recording_bert()
    model.epoch = -1
    return model


# -- one process ------------------------------------------------------------------------------------
def test_trainer_trains_on_padded_batches_as_they_are_and_counts_rows(mrpc, tmp_path):
    model = recorder()
    train = glue("mrpc", "train", pp.examples.tokenizer(), data=mrpc, max_tokens=4096)
    steps = sum(1 for _ in train.loader()) + 10
    trainer = Trainer(model=model, args=arguments(tmp_path, max_steps=steps), train_dataset=train, callbacks=[Epochs()])
    metrics = trainer.train().metrics
    epochs = by_epoch(model.steps)
    assert len(model.steps) == steps and sorted(epochs) == [0, 1] and len(epochs[1]) == 10
    first = [i for step in epochs[0] for i in step["idx"]]
    assert sorted(first) == list(range(TRAIN_ROWS))  # one process: every row exactly once
    second = [i for step in epochs[1] for i in step["idx"]]
    assert len(set(second)) == len(second) and second[:50] != first[:50]  # the next epoch, reshuffled
    assert metrics["train_samples"] == len(first) + len(second)
    assert metrics["train_samples_per_second"] == pytest.approx(
        metrics["train_samples"] / metrics["train_runtime"], rel=1e-3
    )


def test_trainer_evaluates_and_predicts_in_row_order_weighting_the_loss_by_rows(mrpc, tmp_path):
    val = glue("mrpc", "validation", pp.examples.tokenizer(), data=mrpc, max_tokens=1024)
    model = recorder()
    seen = {}

    def metrics_of(p) -> dict:
        seen.update(inputs=p.inputs, losses=p.losses)
        return accuracy(p)

    args = arguments(tmp_path, per_device_eval_batch_size=8, include_for_metrics=["inputs", "loss"])
    trainer = Trainer(model=model, args=args, compute_metrics=metrics_of, eval_dataset=val)
    out = trainer.predict(val)
    metrics = trainer.evaluate()
    assert np.array_equal(out.label_ids, labels(mrpc))  # split order, not length order
    model.eval()
    logits, losses, lengths, steps = {}, {}, {}, 0
    with torch.no_grad():
        for batch in val.loader():
            steps += 1
            inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids")}
            row_logits = model(**inputs).logits
            row_losses = torch.nn.functional.cross_entropy(row_logits, batch["labels"], reduction="none")
            logits.update(zip(batch["row_index"].tolist(), row_logits))
            losses.update(zip(batch["row_index"].tolist(), row_losses.tolist()))
            lengths.update(zip(batch["row_index"].tolist(), batch["attention_mask"].sum(1).tolist()))
    expected = torch.stack([logits[i] for i in range(VAL_ROWS)]).numpy()
    np.testing.assert_allclose(out.predictions, expected, atol=1e-6)
    assert metrics["eval_samples"] == out.metrics["test_samples"] == VAL_ROWS
    assert metrics["eval_loss"] == pytest.approx(np.mean(list(losses.values())), abs=1e-6)  # a mean over rows
    assert metrics["eval_accuracy"] == pytest.approx(accuracy(out)["accuracy"])
    real = (seen["inputs"] != -100) & (seen["inputs"] != 0)  # include_for_metrics: inputs in row order too
    assert real.sum(1).tolist() == [lengths[i] for i in range(VAL_ROWS)] and seen["losses"].shape == (VAL_ROWS,)
    for m, prefix in ((metrics, "eval"), (out.metrics, "test")):  # 8 per device does not apply: real batches
        assert m[f"{prefix}_samples_per_second"] == pytest.approx(VAL_ROWS / m[f"{prefix}_runtime"], rel=2e-3)
        assert m[f"{prefix}_steps_per_second"] == pytest.approx(steps / m[f"{prefix}_runtime"], rel=2e-3)


def test_trainer_removes_the_columns_the_model_does_not_take(mrpc, tmp_path):
    seen = []

    class Plain(transformers.BertForSequenceClassification):
        def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, labels=None, **kwargs):
            seen.append(sorted(kwargs))
            return super().forward(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids, labels=labels
            )

    val = glue("mrpc", "validation", pp.examples.tokenizer(), data=mrpc, batch_size=100)
    trainer = Trainer(model=Plain(bert_config()), args=arguments(tmp_path), train_dataset=val)
    trainer.train()
    trainer.predict(val)
    assert seen and all(extra == [] or extra == ["num_items_in_batch"] for extra in seen)  # no idx, no row_index


def test_trainer_resumes_at_an_epoch_boundary_with_the_next_epoch(mrpc, tmp_path):
    train = glue("mrpc", "train", pp.examples.tokenizer(), data=mrpc, max_tokens=4096)
    first_epoch = sum(1 for _ in train.loader())
    full = recorder()
    Trainer(
        model=full,
        args=arguments(tmp_path / "run", max_steps=first_epoch + 4, save_strategy="steps", save_steps=first_epoch),
        train_dataset=train,
    ).train()
    checkpoint = tmp_path / "run" / f"checkpoint-{first_epoch}"
    saved = torch.load(checkpoint / LOADER_STATE, weights_only=True)  # loader.checkpoint() and the pass
    assert (saved["version"], saved["epoch"], saved["batches"], saved["ended"]) == (2, 0, first_epoch, True)
    assert saved["checkpoint"]["version"] == CHECKPOINT.version and set(saved["checkpoint"]) == {
        "version",
        "settings",
        "checksum",
        "ranks",
    }
    assert [set(one) for one in saved["checkpoint"]["ranks"]] == [set(PART_KEYS)]
    resumed = recorder()
    Trainer(model=resumed, args=arguments(tmp_path / "resumed", max_steps=first_epoch + 4), train_dataset=train).train(
        resume_from_checkpoint=str(checkpoint)
    )
    assert len(resumed.steps) == 4
    assert [(s["idx"], s["batch"]) for s in resumed.steps] == [(s["idx"], s["batch"]) for s in full.steps[first_epoch:]]


def test_trainer_resume_needs_the_loader_state_in_the_checkpoint(mrpc, tmp_path):
    train = glue("mrpc", "train", pp.examples.tokenizer(), data=mrpc, max_tokens=4096)
    Trainer(
        model=recorder(),
        args=arguments(tmp_path, max_steps=2, save_strategy="steps", save_steps=2),
        train_dataset=train,
    ).train()
    (tmp_path / "checkpoint-2" / LOADER_STATE).unlink()
    trainer = Trainer(model=recorder(), args=arguments(tmp_path, max_steps=3), train_dataset=train)
    with pytest.raises(
        FileNotFoundError,
        match=r"^Checkpoint .*checkpoint-2 has no padpipe loader state "
        r"\(padpipe_loader\.pt\).*ignore_data_skip=True",
    ):
        trainer.train(resume_from_checkpoint=str(tmp_path / "checkpoint-2"))


def test_trainer_rejects_a_pipeline_that_does_not_yield_tensors(mrpc, tmp_path):
    tokens = pp.read_parquet(mrpc / "train-00000-of-00001.parquet").tokenize(
        pp.examples.tokenizer(), fields="sentence1"
    )
    trainer = Trainer(model=recorder(), args=arguments(tmp_path), train_dataset=tokens)
    with pytest.raises(
        ValueError,
        match=r"^`train_dataset` must be a pipeline that yields tensors \(ending in "
        r"\.pad\(\) or \.pack\(\)\), but it yields tokens instead\.$",
    ):
        trainer.train()


def test_plain_transformers_trainer_given_a_pipeline_fails_naming_padpipe_hf_trainer(mrpc, tmp_path):
    """Issue 30 item 7: its DataLoader stacked 8 ready batches, and the model failed deep inside HF."""
    pipe = glue("mrpc", "train", pp.examples.tokenizer(), data=mrpc, max_tokens=512)
    for workers in (0, 2):
        trainer = transformers.Trainer(
            model=recorder(), args=arguments(tmp_path, dataloader_num_workers=workers), train_dataset=pipe
        )
        with raises_in_workers(RuntimeError, match=r"batches them again .* use padpipe\.hf\.Trainer \(it reads"):
            trainer.train()


def test_trainer_refuses_a_pipeline_loader_naming_the_pipeline(mrpc, tmp_path):
    """Issue 30 item 7: padpipe.hf.Trainer(train_dataset=pipe.loader()) failed with `has no len()` in torch."""
    train = glue("mrpc", "train", pp.examples.tokenizer(), data=mrpc, max_tokens=512)
    val = glue("mrpc", "validation", pp.examples.tokenizer(), data=mrpc)

    def refused(name: str, given: str) -> str:
        return (
            rf"^padpipe\.hf\.Trainer: `{re.escape(given)}` is a PipelineLoader \(pipe\.loader\(\)\); pass the "
            rf"Pipeline itself \({name}=pipe\): the Trainer makes its loader \(workers, equal steps, checkpoints\)\.$"
        )

    with pytest.raises(TypeError, match=refused("train_dataset", "train_dataset")):
        Trainer(model=recorder(), args=arguments(tmp_path), train_dataset=train.loader())
    with pytest.raises(TypeError, match=refused("eval_dataset", "eval_dataset['val']")):
        Trainer(model=recorder(), args=arguments(tmp_path), train_dataset=train, eval_dataset={"val": val.loader()})
    trainer = Trainer(model=recorder(), args=arguments(tmp_path), train_dataset=train, eval_dataset=val)
    with pytest.raises(TypeError, match=refused("eval_dataset", "eval_dataset")):
        trainer.evaluate(val.loader())
    with pytest.raises(TypeError, match=refused("test_dataset", "test_dataset")):
        trainer.predict(val.loader())


def test_trainer_leaves_other_datasets_to_transformers(tmp_path):
    rows = [{"input_ids": [2, 5, 6, 3], "attention_mask": [1, 1, 1, 1], "labels": i % 2} for i in range(16)]
    model = transformers.BertForSequenceClassification(bert_config())
    trainer = Trainer(
        model=model,
        args=arguments(tmp_path, max_steps=2, per_device_train_batch_size=4, remove_unused_columns=False),
        train_dataset=rows,
        eval_dataset=rows,
    )
    assert isinstance(trainer.get_train_dataloader(), torch.utils.data.DataLoader)
    assert trainer.evaluate()["eval_samples_per_second"] > 0
    assert "eval_samples" not in trainer.evaluate()


@pytest.mark.parametrize(
    "module, package, extra",
    [("padpipe.hf", "transformers", "hf"), ("padpipe.integrations.lightning", "lightning", "lightning")],
)
def test_an_adapter_without_its_framework_names_the_extra(module, package, extra):
    code = f"import sys; sys.modules[{package!r}] = None; import {module}"
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1] == (
        f"padpipe._optional.MissingDependencyError: {module} needs the {package} package, which is not installed: "
        f"pip install 'padpipe[{extra}]' (or: pip install {package})"
    )


# -- two processes ----------------------------------------------------------------------------------
# One torchrun launch (scripts/hf_ddp_run.py) runs every DDP case of the Trainer, one after another: the
# padded run with evaluation (dataloader_num_workers=2), num_train_epochs (test_hf_epochs.py's subject) and
# the one-row filler. The test that starts it needs the launch's time too.
DDP = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def ddp(mrpc, tmp_path_factory) -> Path:
    """The launch's folder: ``trainer/``, ``epochs/`` and ``filler/``, each with ``rank0.json`` and ``rank1.json``."""
    out = tmp_path_factory.mktemp("hf_ddp")
    filler = write_mrpc(out / "mrpc_one_row", train_rows=1, val_rows=2)
    torchrun("hf_ddp_run.py", str(mrpc), str(filler), str(out), timeout=600)
    return out


def records(ddp: Path, run: str) -> list[dict]:
    return [json.loads((ddp / run / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.fixture(scope="module")
def ranks(ddp) -> list[dict]:
    return records(ddp, "trainer")


@DDP
def test_trainer_ddp_reads_every_row_at_most_once_per_epoch_with_equal_steps(ranks):
    per_rank = [by_epoch(rank["steps"]) for rank in ranks]
    assert sorted(per_rank[0]) == sorted(per_rank[1]) == [0, 1, 2]  # 60 steps: two epochs and part of a third
    for epoch in (0, 1, 2):
        assert len(per_rank[0][epoch]) == len(per_rank[1][epoch])
        rows = [i for rank in per_rank for step in rank[epoch] for i in step["idx"]]
        assert len(rows) == len(set(rows))
        if epoch < 2:
            assert len(rows) >= TRAIN_ROWS - 50  # stop_first held back at most one batch of one rank
    assert [s["idx"] for s in per_rank[0][0]] != [s["idx"] for s in per_rank[0][1]]


@DDP
def test_trainer_ddp_resumes_from_its_checkpoint_with_the_same_batches_and_losses(ranks):
    for rank in ranks:
        resumed = [(s["idx"], s["batch"]) for s in rank["resumed_steps"]]
        assert len(resumed) == 30
        assert resumed == [(s["idx"], s["batch"]) for s in rank["steps"][30:]]
        assert [step for step, _ in rank["losses"]] == [10, 20, 30, 40, 50, 60]
        assert rank["resumed_losses"] == rank["losses"]  # with 2 worker processes: dropout draws the same masks


@DDP
def test_trainer_ddp_predicts_in_row_order_gathered_from_both_ranks(ranks, mrpc):
    assert [rank["eval_steps"] for rank in ranks] == [6, 5]  # unequal evaluation steps: no per-step collective
    for rank in ranks:
        assert np.array_equal(rank["label_ids"], labels(mrpc))
        np.testing.assert_allclose(rank["predictions"], rank["reference"], atol=1e-6)
        reference = torch.tensor(rank["reference"])
        loss = torch.nn.functional.cross_entropy(reference, torch.tensor(labels(mrpc))).item()
        assert rank["eval_metrics"]["eval_loss"] == pytest.approx(loss, abs=1e-5)
        assert rank["eval_metrics"]["eval_samples"] == rank["test_metrics"]["test_samples"] == VAL_ROWS


@DDP
def test_trainer_ddp_train_metrics_count_the_rows_of_both_ranks(ranks):
    trained = sum(len(step["idx"]) for rank in ranks for step in rank["steps"])
    for rank in ranks:
        assert rank["train_metrics"]["train_samples"] == trained


def test_trainer_passes_packed_batches_with_hf_flash_attention_names(tmp_path):
    seen = []

    class Llama(transformers.LlamaForCausalLM):
        def forward(self, input_ids=None, attention_mask=None, position_ids=None, labels=None, **kwargs):
            if self.training:  # the training steps (padpipe's packing check runs in eval mode first)
                seen.append(sorted(k for k in kwargs if k != "num_items_in_batch"))
            return super().forward(
                input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, labels=labels, **kwargs
            )

    config = transformers.LlamaConfig(
        vocab_size=8000,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    packed = pp.read_jsonl(pp.examples.SAMPLE_JSONL).tokenize(pp.examples.tokenizer()).pack(128, batch_size=2)
    Trainer(model=Llama(config), args=arguments(tmp_path, max_steps=3), train_dataset=packed).train()
    assert seen == [["cu_seq_lens_k", "cu_seq_lens_q", "max_length_k", "max_length_q", "seq_idx", "use_cache"]] * 3


def test_trainer_warns_once_that_predictions_without_row_index_come_in_batch_order(mrpc, tmp_path):
    rows = pq.read_table(mrpc / "validation-00000-of-00001.parquet").to_pylist()
    val = (
        pp.from_iterable(rows)
        .tokenize(pp.examples.tokenizer(), fields=("sentence1", "sentence2"), max_length=128)
        .bucket(32, buffer_size=400)
        .pad()
    )  # no row_index: batches grouped by length
    trainer = Trainer(model=recorder(), args=arguments(tmp_path))
    with pytest.warns(
        UserWarning,
        match=r"^predict\(\) on a padpipe pipeline whose batches have no `row_index` "
        r"column returns predictions and label_ids in the pipeline's batch order",
    ):
        out = trainer.predict(val)
    assert not np.array_equal(out.label_ids, labels(mrpc))  # the warning is true: not the rows' order
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        trainer.predict(val)  # once
        trainer.predict(glue("mrpc", "validation", pp.examples.tokenizer(), data=mrpc))  # row order: no warning


def test_trainer_refuses_eval_batches_it_cannot_return_in_row_order(mrpc, tmp_path):
    val = glue("mrpc", "validation", pp.examples.tokenizer(), data=mrpc)
    trainer = Trainer(model=recorder(), args=arguments(tmp_path, eval_do_concat_batches=False), eval_dataset=val)
    with pytest.raises(
        ValueError,
        match=r"^`eval_do_concat_batches` must be True to evaluate a padpipe pipeline "
        r"\(its outputs come back as arrays in row order\), but is False instead\.$",
    ):
        trainer.evaluate()


@pytest.mark.parametrize("accumulate, moves", [(None, 0), (2, 5)])
def test_trainer_moves_eval_outputs_to_the_cpu_every_eval_accumulation_steps(
    mrpc, tmp_path, monkeypatch, accumulate, moves
):
    val = glue("mrpc", "validation", pp.examples.tokenizer(), data=mrpc, batch_size=30)  # 11 batches
    calls = []
    original = transformers.trainer_pt_utils.EvalLoopContainer.to_cpu_and_numpy
    monkeypatch.setattr(
        transformers.trainer_pt_utils.EvalLoopContainer,
        "to_cpu_and_numpy",
        lambda self: calls.append(id(self)) or original(self),
    )
    trainer = Trainer(
        model=recorder(),
        args=arguments(tmp_path, eval_accumulation_steps=accumulate),
        compute_metrics=accuracy,
        eval_dataset=val,
    )
    assert trainer.evaluate()["eval_samples"] == VAL_ROWS
    assert len(calls) == 4 * moves + 4  # every 2 batches for each of the 4 containers, then once at the end


def test_trainer_reports_a_nan_eval_loss_when_no_batch_loss_is_finite(mrpc, tmp_path):
    class Broken(transformers.BertForSequenceClassification):
        def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, labels=None):
            out = super().forward(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids, labels=labels
            )
            out.loss = out.loss * float("nan")
            return out

    val = glue("mrpc", "validation", pp.examples.tokenizer(), data=mrpc)
    trainer = Trainer(model=Broken(bert_config()), args=arguments(tmp_path), eval_dataset=val)
    metrics = trainer.evaluate()
    assert np.isnan(metrics["eval_loss"]) and metrics["eval_samples"] == VAL_ROWS


@DDP
def test_trainer_ddp_zeroes_a_filler_and_counts_no_row_of_it(ddp):
    """One training row for two ranks: each epoch one rank trains on a filler; its loss is 0, train_samples 2."""
    ranks = records(ddp, "filler")
    seen = [step for rank in ranks for step in rank["seen"]]
    assert sorted(filler for filler, _ in seen) == [False, False, True, True]  # two epochs, one step each a rank
    assert all(loss == 0 for filler, loss in seen if filler) and all(loss > 0 for filler, loss in seen if not filler)
    assert [rank["train_metrics"]["train_samples"] for rank in ranks] == [2, 2]  # the real row, once an epoch


@DDP
def test_num_train_epochs_under_ddp_counts_optimizer_steps_per_rank_and_resumes_exactly(ddp):
    """Two ranks, gradient accumulation 2: steps per epoch are ceil(this rank's batches / 2), equal on both."""
    ranks = records(ddp, "epochs")
    assert ranks[0]["batches"] == ranks[1]["batches"]
    steps = 2 * math.ceil(ranks[0]["batches"] / 2)
    for rank in ranks:
        assert rank["global_step"] == rank["max_steps"] == steps
        assert len(rank["steps"]) == 2 * rank["batches"]
        assert rank["resumed_weights"] == rank["weights"]
        resumed = [(s["idx"], s["batch"]) for s in rank["resumed_steps"]]
        assert resumed == [(s["idx"], s["batch"]) for s in rank["steps"][-len(resumed) :]]
    for epoch in (0, 1):
        rows = [i for rank in ranks for s in rank["steps"] if s["epoch"] == epoch for i in s["idx"]]
        assert len(rows) == len(set(rows)) and len(rows) >= TRAIN_ROWS - 50  # stop_first: at most a batch held back
