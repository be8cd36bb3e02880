"""Pins on the private transformers.Trainer hooks padpipe.hf relies on: each failure names the hook that changed."""

from __future__ import annotations

import inspect
import os
from types import SimpleNamespace

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

import padpipe as pp  # noqa: E402
from padpipe.checkpoints import CHECKPOINT, PART_KEYS  # noqa: E402
from padpipe.hf import LOADER_STATE, Trainer  # noqa: E402
from padpipe.integrations.hf_hooks import HOOKS, check_hooks  # noqa: E402
from padpipe.integrations.hf_train import Batch, TrainBatches  # noqa: E402
from padpipe.state import Child, StateMismatchError, StateSchema  # noqa: E402
from tests.integrations.tiny import packed, tiny_llama  # noqa: E402

pytestmark = pytest.mark.timeout(300)


def arguments(out, **changes) -> transformers.TrainingArguments:
    options = dict(
        max_steps=4, report_to=[], use_cpu=True, disable_tqdm=True, save_strategy="no", logging_steps=100, seed=0
    )
    return transformers.TrainingArguments(str(out), **{**options, **changes})


@pytest.mark.parametrize("hook", sorted(HOOKS))
def test_transformers_trainer_has_each_hook_with_its_parameters(hook):
    found = tuple(inspect.signature(getattr(transformers.Trainer, hook)).parameters)[1:]
    assert found == HOOKS[hook], f"transformers.Trainer.{hook} changed its parameters: {found}"


def test_check_hooks_names_the_hook_that_changed():
    class Changed(transformers.Trainer):
        def _run_epoch(self, model, epoch):  # an upgrade that renamed the loop's arguments
            pass

    with pytest.raises(
        ImportError,
        match=r"^padpipe\.hf needs transformers\.Trainer\._run_epoch\(model, epoch, "
        r"train_dataloader, .*\(transformers 5\.18 to 5\.25\), but transformers 9\.0 has "
        r"_run_epoch\(model, epoch\) instead",
    ):
        check_hooks(Changed, "9.0")


def test_the_no_length_loop_iterates_each_epoch_anew_and_steps_at_steps_in_epoch(tmp_path):
    """``_run_epoch``/``set_initial_training_values``: without a length, one ``iter`` per epoch and
    ``steps_in_epoch = max_steps * gradient_accumulation_steps`` (:class:`PassLength` stands in for it)."""
    pipe = packed(6)  # 3 batches per pass
    steps = []

    class Spy(Trainer):
        def _run_epoch(self, **kwargs):
            steps.append((kwargs["epoch"], int(kwargs["steps_in_epoch"]), kwargs["num_update_steps_per_epoch"]))
            super()._run_epoch(**kwargs)

    ends = []

    class Ends(transformers.TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            ends.append(trainer._padpipe_train.read)

    trainer = Spy(
        model=tiny_llama(),
        args=arguments(tmp_path, gradient_accumulation_steps=2),
        train_dataset=pipe,
        callbacks=[Ends()],
    )
    trainer.train()
    assert steps == [(0, 8, 4), (1, 8, 4)], "transformers.Trainer._run_epoch: the loop without a length changed"
    assert ends == [2, 3, 2, 3], (
        "transformers.Trainer._run_epoch no longer steps at `step + 1 == steps_in_epoch`: "
        "a pass's short last window gets no optimizer step"
    )


def test_a_resumed_epoch_reloads_the_rng_state_and_starts_at_the_epoch_padpipe_gives(tmp_path):
    """``_init_training_state`` returns the epoch to go on with; ``_run_epoch`` reloads the RNG states of
    the checkpoint when it skips no batches; ``_save_checkpoint`` writes ``checkpoint-<step>``."""
    pipe = packed(6)
    Trainer(model=tiny_llama(), args=arguments(tmp_path / "run", save_strategy="epoch"), train_dataset=pipe).train()
    checkpoint = tmp_path / "run" / "checkpoint-3"
    assert (checkpoint / LOADER_STATE).is_file() and (checkpoint / "trainer_state.json").is_file(), (
        "transformers.Trainer._save_checkpoint no longer saves into checkpoint-<global_step>"
    )
    calls = []

    class Spy(Trainer):
        def _load_rng_state(self, checkpoint):
            calls.append(("rng", checkpoint))
            super()._load_rng_state(checkpoint)

        def _run_epoch(self, **kwargs):
            calls.append(("epoch", kwargs["epoch"]))
            super()._run_epoch(**kwargs)

    Spy(model=tiny_llama(), args=arguments(tmp_path / "resumed"), train_dataset=pipe).train(str(checkpoint))
    assert calls == [("epoch", 1), ("rng", str(checkpoint))], (
        "transformers.Trainer._init_training_state/_run_epoch: a resume no longer starts at the returned epoch "
        "and reloads the RNG states when no batches are skipped"
    )


def test_get_batch_samples_takes_what_the_pass_has_and_tokens_are_tracked_per_batch(tmp_path):
    """``get_batch_samples`` stops at the iterator's end; ``_track_num_input_tokens`` gets the batch
    objects it returned; ``_finalize_training`` logs ``train_runtime`` through ``log``."""
    trainer = Trainer(model=tiny_llama(), args=arguments(tmp_path, max_steps=3), train_dataset=packed(6))
    one = Batch(input_ids=torch.ones(1, 2, dtype=torch.long))
    batches, _ = trainer.get_batch_samples(iter([one]), 4, torch.device("cpu"))
    assert batches == [one] and batches[0] is one, "transformers.Trainer.get_batch_samples changed"
    seen = []
    original = transformers.Trainer._track_num_input_tokens

    def spy(self, inputs):
        seen.append(type(inputs))
        return original(self, inputs)

    trainer._track_num_input_tokens = spy.__get__(trainer)
    metrics = trainer.train().metrics
    assert seen and set(seen) == {Batch}, (
        "transformers.Trainer._track_num_input_tokens no longer gets the batches get_batch_samples returned"
    )
    assert metrics["train_samples"] == trainer._padpipe_train.rows, (
        "transformers.Trainer._finalize_training no longer logs train_runtime through Trainer.log"
    )


def test_num_items_are_gathered_only_while_average_tokens_across_devices_is_set():
    """``_get_num_items_in_batch`` reads ``args.average_tokens_across_devices`` at each call (padpipe's
    evaluation turns it off for the loop: ranks take different numbers of evaluation steps)."""
    gathered: list = []
    fake = SimpleNamespace(
        model_accepts_loss_kwargs=True,
        compute_loss_func=None,
        _loss_shifts_labels=False,
        args=SimpleNamespace(average_tokens_across_devices=True, world_size=2, n_gpu=0),
        accelerator=SimpleNamespace(gather=lambda t: gathered.append(t) or t.repeat(2)),
        get_tp_size=lambda: 1,
        get_cp_size=lambda: 1,
        get_sp_size=lambda: 1,
    )
    batches = [{"labels": torch.tensor([[1, 2, -100]])}]
    assert int(transformers.Trainer._get_num_items_in_batch(fake, batches, torch.device("cpu"))) == 4
    fake.args.average_tokens_across_devices = False
    assert int(transformers.Trainer._get_num_items_in_batch(fake, batches, torch.device("cpu"))) == 2
    assert len(gathered) == 1, (
        "transformers.Trainer._get_num_items_in_batch no longer reads args.average_tokens_across_devices at each call"
    )


def test_wrap_model_for_evaluation_leaves_a_one_process_model_as_it_is(tmp_path):
    model = tiny_llama()
    trainer = Trainer(model=model, args=arguments(tmp_path))
    assert trainer._wrap_model(model, training=False) is model, "transformers.Trainer._wrap_model changed"


def test_train_batches_state_at_a_pass_end_resumes_with_the_next_pass():
    class Loader(list):
        def checkpoint(self, *, untrained=0):
            return {"position": "saved", "untrained": untrained}

        def load_state_dict(self, state):
            self.loaded = state

    batches = TrainBatches(Loader([{"input_ids": torch.ones(1, 2)}]), dict)
    assert len(list(batches)) == 1 and batches.ended
    state = batches.state_dict()
    again = TrainBatches(Loader(), dict)
    again.load_state_dict(state)
    assert (again.epoch, again.offset, again.loader.loaded) == (1, 0, {"position": "saved", "untrained": 0})


def ids(batches) -> list[list[list[int]]]:
    return [b["input_ids"].tolist() for b in batches]


def test_train_batches_save_loader_checkpoint_with_the_batch_read_ahead_and_resume_exactly():
    pipe = pp.from_iterable([{"text": f"row {i} " * (1 + i % 5)} for i in range(20)])
    pipe = pipe.tokenize(pp.examples.tokenizer()).batch(3).pad()
    whole = ids(TrainBatches(pipe.loader(), dict))
    loader = pipe.loader()
    loader.keep_untrained(1)
    batches = TrainBatches(loader, dict)
    it = iter(batches)
    first = [next(it), next(it)]
    state = batches.state_dict()  # reads the third batch ahead: the checkpoint holds it as not trained
    assert state["version"] == TrainBatches.STATE.version and (state["batches"], state["ended"]) == (2, False)
    checkpoint = state["checkpoint"]
    assert set(checkpoint) == set(loader.checkpoint(untrained=1)) and checkpoint["version"] == CHECKPOINT.version
    assert [set(one) for one in checkpoint["ranks"]] == [set(PART_KEYS)] and len(checkpoint["ranks"][0]["ahead"]) == 1
    assert ids(first) + ids(it) == whole  # saving changed nothing for the run that saved
    again = TrainBatches(pipe.loader(), dict)
    again.load_state_dict(state)
    assert ids(again) == whole[2:] and again.offset == 2


def test_train_batches_refuse_an_older_padpipes_state_by_its_version():
    """padpipe before loader.checkpoint() saved one state a rank (version 1): refused, not read."""
    pipe = pp.from_iterable([{"text": f"row {i} " * (1 + i % 5)} for i in range(20)])
    pipe = pipe.tokenize(pp.examples.tokenizer()).batch(3).pad()
    loader = pipe.loader()
    it = iter(loader)
    next(it), next(it)
    old = StateSchema("padpipe.hf.Trainer", 1, loader=Child(), **TrainBatches.PASS).make(
        {}, loader=loader.state_dict(), epoch=0, batches=2, ended=False
    )
    with pytest.raises(
        StateMismatchError, match=r"^padpipe.hf.Trainer state doesn't match .* version found 1 instead of 2"
    ):
        TrainBatches(pipe.loader(), dict).load_state_dict(old)
