"""``Held``: the one store of batches a layer has in hand, saved on the CPU and restored on the layer's device."""

from __future__ import annotations

import pytest
import torch
from torchdata.nodes import IterableWrapper

import padpipe as pp
from padpipe.runtime.consumer_graph import ConsumerGraph
from padpipe.runtime.equal_steps import EqualSteps
from padpipe.runtime.held import Held, Untrained
from padpipe.runtime.lockstep import Lockstep
from padpipe.runtime.loss_tokens import LossTokens
from padpipe.sharing.consumer import Consumer
from padpipe.stats import PipelineStats


def test_held_works_as_a_list_oldest_first():
    held = Held([{"x": torch.tensor([1])}])
    held.append({"x": torch.tensor([2])})
    held += [{"x": torch.tensor([3])}]
    assert [int(held.pop(0)["x"]) for _ in range(2)] == [1, 2] and len(held) == 1


def test_held_saves_and_restores_its_batches():
    held = Held([{"x": torch.arange(3)}, {"y": torch.ones(2)}])
    saved = held.saved()
    assert type(saved) is list and all(t.device.type == "cpu" for b in saved for t in b.values())
    held.clear()
    again = Held()  # no device: the batches stay where the state has them
    again.restore(saved)
    assert [sorted(b) for b in again] == [["x"], ["y"]] and torch.equal(again[0]["x"], torch.arange(3))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_held_saves_on_the_cpu_and_restores_on_its_device():
    held = Held([{"x": torch.arange(3, device="cuda")}], device=torch.device("cuda"))
    saved = held.saved()
    assert saved[0]["x"].device.type == "cpu" and held[0]["x"].device.type == "cuda"
    again = Held(device=torch.device("cuda"))
    again.restore(saved)
    assert again[0]["x"].device.type == "cuda"


def test_every_layer_keeps_its_held_batches_in_a_held():
    pipe = pp.from_iterable([{"text": "a"}]).tokenize(pp.examples.tokenizer()).batch(1).pad()
    lockstep = Lockstep("balance", None, PipelineStats())
    tokens = LossTokens(IterableWrapper([]), steps=2)
    graph = ConsumerGraph(pipe, Consumer(), PipelineStats())
    steps = EqualSteps(IterableWrapper([]), policy="off")
    steps.reset()
    stores = [lockstep.held, lockstep.ring, tokens._window, graph._batches, Untrained().restored, steps._step.held]
    assert all(isinstance(store, Held) for store in stores)
