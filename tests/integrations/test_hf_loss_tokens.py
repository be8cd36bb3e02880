"""padpipe.hf.Trainer takes each window's ``num_items_in_batch`` from the loader (``accumulation_steps``), not HF's recount."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from padpipe.hf import Trainer  # noqa: E402
from padpipe.integrations.hf_train import Batch, counts_as_hf  # noqa: E402
from tests.integrations.tiny import packed, tiny_llama  # noqa: E402

pytestmark = pytest.mark.timeout(300)


def arguments(out, **changes) -> transformers.TrainingArguments:
    options = dict(max_steps=5, report_to=[], use_cpu=True, disable_tqdm=True, save_strategy="no", seed=0)
    return transformers.TrainingArguments(str(out), **{**options, **changes})


def test_trainer_uses_the_loaders_count_of_each_window_which_is_hfs_own(tmp_path):
    calls = []

    class Spy(Trainer):
        def _get_num_items_in_batch(self, batch_samples, device):
            items = super()._get_num_items_in_batch(batch_samples, device)
            hf = transformers.Trainer._get_num_items_in_batch(self, [dict(b) for b in batch_samples], device)
            calls.append((len(batch_samples), [b.loss_items for b in batch_samples], items, hf))
            return items

    trainer = Spy(model=tiny_llama(), args=arguments(tmp_path, gradient_accumulation_steps=3), train_dataset=packed())
    trainer.train()
    assert [n for n, *_ in calls] == [3, 3, 3, 2, 0, 3]  # 11 batches per pass: a short last window, HF's look past
    assert calls[4][2:] == (None, None)  # the pass's end, and the next pass
    for _, loaded, items, hf in calls[:4] + calls[5:]:
        assert all(b is not None and int(b) == int(items) for b in loaded), "the loader's count is the one used"
        assert int(items) == int(hf) > 0
    assert all("num_items_in_batch" not in b for b in trainer._padpipe_train), "the model gets HF's argument only"


def test_trainer_counts_with_hf_where_hf_would_not_sum_over_the_ranks_alike(tmp_path):
    trainer = Trainer(model=tiny_llama(), args=arguments(tmp_path), train_dataset=packed())
    assert counts_as_hf(trainer)
    trainer.get_tp_size = lambda: 2  # tensor parallelism: HF divides its count by that
    assert not counts_as_hf(trainer)
    batch = next(iter(trainer.get_train_dataloader()))
    assert isinstance(batch, Batch) and batch.loss_items is None  # the loader counts nothing; HF counts


def test_trainer_refuses_naming_the_attribute_when_a_release_drops_loss_shifts_labels(tmp_path):
    trainer = Trainer(model=tiny_llama(), args=arguments(tmp_path), train_dataset=packed())
    assert isinstance(trainer._loss_shifts_labels, bool)  # set in Trainer.__init__ since transformers 5.11
    del trainer._loss_shifts_labels
    with pytest.raises(ImportError, match=r"^padpipe\.hf needs transformers\.Trainer's `_loss_shifts_labels`"):
        trainer.get_train_dataloader()
