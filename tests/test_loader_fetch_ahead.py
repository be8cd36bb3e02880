"""A loop that fetches batches ahead of its step (Lightning's): the loader's checkpoint keeps the batches not trained,
from the very first, and one saved after the loop met the epoch's end resumes them, then that epoch's end; stats count
the batches the loader returned."""

from __future__ import annotations

import time

import pytest

import padpipe as pp


def epochs_pipe() -> pp.Pipeline:
    rows = [{"text": " ".join(["w"] * (i % 7 + 1)), "n": i} for i in range(40)]
    return pp.from_iterable(rows).shuffle(buffer_size=40, seed=0).tokenize(pp.examples.tokenizer()).batch(8).pad()


def ids(batches) -> list[list[int]]:
    return [b["input_ids"].flatten().tolist() for b in batches]


@pytest.mark.parametrize("untrained", [1, 2])
def test_a_checkpoint_after_the_loop_met_the_epochs_end_resumes_the_untrained_batches_then_that_epochs_end(untrained):
    pipe = epochs_pipe()
    outside = pipe.loader()
    epochs = [ids(outside) for _ in range(2)]
    loader = pipe.loader()
    loader.keep_untrained(2)
    fetched = ids(loader)  # the loop fetched the whole epoch and met its end ...
    loader.trained(len(fetched) - untrained)  # ... and trained all but the last (a step that failed, the one ahead)
    saved = loader.checkpoint(untrained=untrained)
    again = pipe.loader()
    again.load_state_dict(saved)
    assert ids(again) == epochs[0][-untrained:] and again.epoch == 0  # epoch 0 ends with them: no batch of epoch 1
    assert ids(again) == epochs[1] and again.epoch == 1  # then epoch 1 whole, once


def test_a_checkpoint_keeps_the_first_batch_fetched_before_the_loop_said_how_many_it_fetches_ahead():
    pipe = epochs_pipe()
    everything = ids(pipe.loader())
    loader = pipe.loader()
    batches = iter(loader)
    next(batches)  # Lightning fetches the first batch before its callbacks' on_train_start
    loader.keep_untrained(2)
    next(batches)  # the step of the first batch fails with the second fetched
    again = pipe.loader()
    again.load_state_dict(loader.checkpoint(untrained=2))
    assert ids(again) == everything  # neither is lost


@pytest.mark.parametrize("ahead", [None, 2])
def test_stats_batches_are_the_batches_the_loader_returned(ahead):
    pipe = epochs_pipe() if ahead is None else epochs_pipe().prefetch(ahead)
    loader = pipe.loader()
    batches = iter(loader)
    for _ in range(3):
        next(batches)
    waited = time.monotonic()
    while ahead and loader.stats().rows <= 3 * 8 and time.monotonic() - waited < 30:
        time.sleep(0.01)  # prefetch makes batches ahead, its rows counted once made
    assert loader.stats().batches == 3  # not those made ahead
    per_epoch = 3 + sum(1 for _ in batches)
    assert loader.stats().batches == per_epoch
    assert sum(1 for _ in loader) == per_epoch and loader.stats().batches == 2 * per_epoch


def test_stats_batches_are_the_batches_trained_once_the_trainer_notes_them():
    loader = epochs_pipe().loader()
    loader.keep_untrained(1)
    batches = iter(loader)
    next(batches)
    assert loader.stats().batches == 1  # nobody noted a batch trained yet: those returned
    for _ in range(3):
        next(batches)  # a loop fetching one ahead of its step
        loader.trained()
    assert loader.stats().batches == 3  # the batch fetched ahead is not counted
    loader.set_epoch(1)  # the trainer drops it and starts another epoch
    next(iter(loader))
    loader.trained(5)  # more than it returned and did not note: only that one counts
    assert loader.stats().batches == 4
