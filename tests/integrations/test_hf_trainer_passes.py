"""padpipe.hf.Trainer at pass boundaries: accumulation windows, exact resume, epochs and token counts (one process)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

import padpipe as pp  # noqa: E402
from padpipe.hf import Trainer  # noqa: E402
from padpipe.recipes.glue import glue  # noqa: E402
from tests.integrations.tiny import (  # noqa: E402
    VOCAB,
    bert_config,
    packed,
    recording_bert,
    texts,
    tiny_llama,
    write_mrpc,
)

pytestmark = pytest.mark.timeout(300)
PASS = 11  # packed() batches per pass: not a multiple of 2, 3 or 4


@pytest.fixture(scope="module")
def mrpc(tmp_path_factory) -> Path:
    return write_mrpc(tmp_path_factory.mktemp("hf") / "mrpc")


def arguments(out: Path, **changes) -> transformers.TrainingArguments:
    options = dict(
        max_steps=12,
        learning_rate=1e-3,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        save_strategy="no",
        logging_steps=1,
        seed=0,
    )
    return transformers.TrainingArguments(str(out), **{**options, **changes})


class Windows(transformers.TrainerCallback):
    """Each micro-batch the model trains on, and the gradient and micro-batch count at each optimizer step."""

    def __init__(self, model) -> None:
        self.inputs, self.grads, self.ends = [], [], []
        model.register_forward_pre_hook(self.record, with_kwargs=True)
        self.model = model

    def record(self, module, args, kwargs):
        if module.training:
            self.inputs.append({k: v for k, v in kwargs.items() if k != "num_items_in_batch"})

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self.grads.append(torch.cat([p.grad.flatten() for p in self.model.parameters()]).clone())
        self.ends.append(len(self.inputs))


def token_mean_gradient(model, window: list[dict]) -> torch.Tensor:
    """The gradient of the window's loss summed over its predicted tokens, divided by their count."""
    model.zero_grad()
    items = sum(int(b["labels"][:, 1:].ne(-100).sum()) for b in window)
    for batch in window:
        logits = model(**{k: v for k, v in batch.items() if k != "labels"}).logits[:, :-1]
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, VOCAB), batch["labels"][:, 1:].reshape(-1), ignore_index=-100, reduction="sum"
        )
        (loss / items).backward()
    return torch.cat([p.grad.flatten() for p in model.parameters()])


@pytest.mark.parametrize("steps", [2, 3, 4])
def test_trainer_steps_once_per_accumulation_window_of_each_pass(tmp_path, steps):
    pipe = packed()
    loader = pipe.loader()
    passes = [list(loader) for _ in range(3)]
    assert [len(p) for p in passes] == [PASS] * 3
    windows = [p[i : i + steps] for p in passes for i in range(0, PASS, steps)]  # the short last one of each pass too
    max_steps = 2 * -(-PASS // steps) + 1  # two passes and one step into the third
    model = tiny_llama()
    seen = Windows(model)
    trainer = Trainer(
        model=model,
        args=arguments(tmp_path, max_steps=max_steps, learning_rate=0.0, gradient_accumulation_steps=steps),
        train_dataset=pipe,
        callbacks=[seen],
    )
    trainer.train()
    assert trainer.model_accepts_loss_kwargs  # Llama's loss divides by num_items_in_batch: nothing to change
    sizes = [len(w) for w in windows[:max_steps]]
    assert [b - a for a, b in zip([0, *seen.ends], seen.ends)] == sizes
    for batch, expected in zip(seen.inputs, [b for w in windows for b in w]):
        assert torch.equal(batch["input_ids"], expected["input_ids"])
    model.train()
    for step, grad in enumerate(seen.grads):  # learning rate 0: every window's gradient at the same weights
        window = seen.inputs[seen.ends[step] - sizes[step] : seen.ends[step]]
        torch.testing.assert_close(grad, token_mean_gradient(model, window), rtol=1e-4, atol=1e-7)


def bert_run(out: Path, train: pp.Pipeline, resume: str | None = None, **options) -> tuple[list, dict]:
    """Train a tiny BERT (dropout on); its per-step logs and final weights."""
    model = recording_bert(seed=0 if resume is None else 1)
    trainer = Trainer(model=model, args=arguments(out, **options), train_dataset=train)
    trainer.train(resume_from_checkpoint=resume)
    timing = ("train_runtime", "train_tokens_per_second")
    logs = [{k: v for k, v in e.items() if k not in timing} for e in trainer.state.log_history if "loss" in e]
    return logs, {k: v.clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize(
    "steps, save, checkpoint",
    [
        (5, dict(save_strategy="epoch"), 3),  # after the short window that ends pass 0 (12 = 5 + 5 + 2)
        (5, dict(save_strategy="steps", save_steps=1), 4),  # inside pass 1
        (4, dict(save_strategy="steps", save_steps=3), 3),  # after pass 0's last full window, before its end is seen
    ],
)
def test_trainer_resumes_bit_for_bit_at_every_kind_of_checkpoint(mrpc, tmp_path, steps, save, checkpoint):
    train = glue("mrpc", "train", pp.examples.tokenizer(), data=mrpc, max_tokens=8192)  # 12 batches per pass
    options = dict(max_steps=8, gradient_accumulation_steps=steps, include_num_input_tokens_seen="non_padding")
    full, weights = bert_run(tmp_path / "full", train, **options, **save)
    logs, resumed = bert_run(
        tmp_path / "resumed", train, str(tmp_path / "full" / f"checkpoint-{checkpoint}"), **options
    )
    assert [e["step"] for e in logs] == list(range(1, 9))  # the checkpoint's history, then the resumed steps'
    assert logs == full  # loss, grad_norm, learning rate, epoch, tokens seen: all equal
    assert all(torch.equal(weights[k], resumed[k]) for k in weights)


def test_trainer_resumes_bit_for_bit_with_worker_processes(mrpc, tmp_path):
    before = torch.get_rng_state()
    train = glue("mrpc", "train", pp.examples.tokenizer(), data=mrpc, max_tokens=8192)
    loader = train.loader(num_workers=2)
    assert sum(1 for _ in loader) == 14 and torch.equal(torch.get_rng_state(), before)  # workers leave it alone
    options = dict(max_steps=5, gradient_accumulation_steps=5, dataloader_num_workers=2)  # 5, 5, 4 + 5, 5: two passes
    full, weights = bert_run(tmp_path / "full", train, save_strategy="steps", save_steps=1, **options)
    for checkpoint in (3, 4):  # at pass 0's end and inside pass 1
        logs, resumed = bert_run(
            tmp_path / f"resumed{checkpoint}", train, str(tmp_path / "full" / f"checkpoint-{checkpoint}"), **options
        )
        assert logs == full
        assert all(torch.equal(weights[k], resumed[k]) for k in weights)


@pytest.mark.parametrize("kind", ["pad", "pack", "block_mask"])
@pytest.mark.parametrize("setting", ["all", "non_padding"])
def test_trainer_counts_real_tokens_seen_for_every_batch_kind(mrpc, tmp_path, kind, setting):
    if kind == "pad":
        pipe, model = glue("mrpc", "train", pp.examples.tokenizer(), data=mrpc, max_tokens=8192), recording_bert()
    else:
        pipe, model = packed(block_mask=kind == "block_mask"), tiny_llama()
    loader = pipe.loader()
    batches = list(loader)
    expected = loader.stats().real_tokens
    assert expected < sum(b["input_ids"].numel() for b in batches)  # there is padding to leave out
    trainer = Trainer(
        model=model,
        args=arguments(tmp_path, max_steps=len(batches), include_num_input_tokens_seen=setting),
        train_dataset=pipe,
    )
    trainer.train()
    assert trainer.state.num_input_tokens_seen == expected


def test_trainer_divides_the_glue_recipe_models_batch_mean_loss_by_the_window(mrpc, tmp_path, caplog):
    train = glue("mrpc", "train", pp.examples.tokenizer(), data=mrpc, max_tokens=8192)
    config = bert_config()
    config.hidden_dropout_prob = config.attention_probs_dropout_prob = 0.0
    model = transformers.BertForSequenceClassification(config)  # takes **kwargs, ignores num_items_in_batch
    seen = Windows(model)
    trainer = Trainer(
        model=model,
        args=arguments(tmp_path, max_steps=3, learning_rate=0.0, gradient_accumulation_steps=5),
        train_dataset=train,
        callbacks=[seen],
    )
    with caplog.at_level("WARNING", logger="padpipe.hf"):
        trainer.train()
    assert trainer.model_accepts_loss_kwargs is False and model.accepts_loss_kwargs is False
    assert len(caplog.records) == 1 and caplog.records[0].getMessage().startswith(
        "BertForSequenceClassification.forward takes **kwargs but its loss ignores `num_items_in_batch` "
        "(transformers#47688)"
    )
    assert seen.ends == [5, 10, 12]
    model.train()
    for end, size, grad in zip(seen.ends, (5, 5, 2), seen.grads):
        model.zero_grad()
        for batch in seen.inputs[end - size : end]:  # each batch's mean loss over its rows, over the window's batches
            (model(**batch).loss / size).backward()
        expected = torch.cat([p.grad.flatten() for p in model.parameters()])
        torch.testing.assert_close(grad, expected, rtol=1e-4, atol=1e-7)


def test_trainer_trains_what_transformers_trains_on_a_sized_loader_step_by_step(tmp_path):
    pipe = pp.from_iterable(texts(17)).tokenize(pp.examples.tokenizer()).pack(64, batch_size=4)  # the same each pass
    batches = list(pipe.loader())
    assert len(batches) == PASS

    class Sized(transformers.Trainer):  # HF's own loader over the same batches, in order
        def _get_train_sampler(self, *args, **kwargs):
            return torch.utils.data.SequentialSampler(self.train_dataset)

    options = dict(max_steps=9, gradient_accumulation_steps=3, remove_unused_columns=False)  # 4 steps per pass
    runs = []
    for trainer_class, data, more in ((Trainer, pipe, {}), (Sized, batches, dict(per_device_train_batch_size=1))):
        model = tiny_llama()
        trainer = trainer_class(
            model=model,
            args=arguments(tmp_path / trainer_class.__name__, **options, **more),
            train_dataset=data,
            data_collator=lambda rows: rows[0],
        )
        trainer.train()
        logs = [
            (e["step"], e["loss"], e["grad_norm"], e["learning_rate"]) for e in trainer.state.log_history if "loss" in e
        ]
        runs.append((logs, model.state_dict()))
    (ours, ours_weights), (theirs, their_weights) = runs
    assert [step for step, *_ in ours] == list(range(1, 10))
    assert ours == theirs
    assert all(torch.equal(ours_weights[k], their_weights[k]) for k in ours_weights)


def test_an_epoch_ends_with_its_pass_not_after_max_steps_empty_turns(tmp_path):
    calls = []

    class Counting(Trainer):
        def get_batch_samples(self, epoch_iterator, num_batches, device):
            out = super().get_batch_samples(epoch_iterator, num_batches, device)
            calls.append(len(out[0]))
            return out

    class StopAfterTwoPasses(transformers.TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            control.should_training_stop = state.global_step == 2 * PASS
            return control

    trainer = Counting(
        model=tiny_llama(),
        args=arguments(tmp_path, max_steps=10**7, logging_steps=10**6),  # a streaming user's "until stopped"
        train_dataset=packed(),
        callbacks=[StopAfterTwoPasses()],
    )
    trainer.train()
    # each pass: its PASS windows, then one empty call that ends the epoch (HF alone turns 10**7 times)
    assert calls == [1] * PASS + [0] + [1] * PASS
    assert trainer.state.global_step == 2 * PASS
