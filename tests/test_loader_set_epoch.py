"""PipelineLoader.set_epoch: the next iter reads that epoch from its start, in this process and in workers."""

from __future__ import annotations

import pytest

import padpipe as pp


def epochs_pipe() -> pp.Pipeline:
    rows = [{"text": " ".join(["w"] * (i % 7 + 1))} for i in range(60)]
    return pp.from_iterable(rows).shuffle(buffer_size=60, seed=0).tokenize(pp.examples.tokenizer()).batch(8).pad()


def ids(epoch) -> list[list[int]]:
    return [b["input_ids"].flatten().tolist() for b in epoch]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("workers", [0, 2])
def test_set_epoch_reads_that_epoch_and_drops_a_loaded_state(workers):
    pipe = epochs_pipe()
    loader = pipe.loader(num_workers=workers)
    first = iter(loader)
    next(first)
    state = loader.state_dict()  # mid-epoch 0
    rest = [ids(loader) for _ in range(3)]  # epochs 1, 2, 3
    again = pipe.loader(num_workers=workers)
    again.load_state_dict(state)
    again.set_epoch(2)
    assert ids(again) == rest[1] != rest[0] and again.epoch == 2  # epoch 2 whole: the loaded position dropped
    assert ids(again) == rest[2]  # then epoch 3, as ever


@pytest.mark.parametrize("epoch", [-1, True, 1.0])
def test_set_epoch_raises_error_when_epoch_is_not_an_int_from_0(epoch):
    with pytest.raises(ValueError, match=rf"^`epoch` must be an int >= 0, but is {epoch!r} instead\.$"):
        epochs_pipe().loader().set_epoch(epoch)


def test_set_epoch_saves_and_restores_its_state_before_that_epoch():
    pipe = epochs_pipe()
    loader = pipe.loader()
    outside = [ids(loader) for _ in range(3)]
    read = pipe.loader()
    next(iter(read))  # inside epoch 0
    read.set_epoch(2)
    state = read.state_dict()  # before epoch 2, not inside epoch 0
    again = pipe.loader()
    again.load_state_dict(state)
    assert ids(again) == outside[2] and again.epoch == 2


def test_an_iter_that_returned_no_batch_leaves_its_epoch_unspent():
    pipe = epochs_pipe()
    plain = pipe.loader()
    outside = [ids(plain) for _ in range(2)]
    loader = pipe.loader()
    iter(loader)  # a framework checking that the loader iterates (Lightning does): no batch taken
    assert ids(loader) == outside[0] and loader.epoch == 0  # epoch 0 still
    assert not loader.in_epoch  # the loop ended it
    assert ids(loader) == outside[1] and loader.epoch == 1  # the next iter: epoch 1


def test_trained_counts_what_a_loop_fetched_ahead():
    loader = epochs_pipe().loader()
    loader.keep_untrained(1)
    it = iter(loader)
    next(it), next(it)
    assert loader.untrained == 2 and loader.in_epoch
    loader.trained()
    assert loader.untrained == 1
    loader.trained(5)
    assert loader.untrained == 0
    with pytest.raises(ValueError, match=r"^`count` must be an int >= 0, but is -1 instead\.$"):
        loader.trained(-1)
