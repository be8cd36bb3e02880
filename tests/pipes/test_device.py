"""Tests of DevicePrefetcher (padpipe/pipes/device.py) and its background thread (threads.py).

The upstream is a tiny in-file node over dicts of tensors with epoch/state semantics, so these
tests do not depend on the reader, tokenizer or pad stages.
"""

from __future__ import annotations

import copy
import gc
import threading
import time
import traceback
from typing import Any

import pytest
import torch
from torchdata.nodes import BaseNode

import padpipe as pp
from padpipe.errors import DataError
from padpipe.pipeline import TENSORS, Pipeline, Stage
from padpipe.pipes.device import DevicePrefetcher
from padpipe.state import StateMismatchError, check_state, make_state
from tests.contract import check_loader_resume, check_node_resume, normalize

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised without CUDA")


def make_batch(i: int) -> dict[str, Any]:
    """Batch ``i``: padded ids, a mask, strings that must pass through, and a nested dict."""
    length = 2 + i % 3
    ids = torch.arange(2 * length, dtype=torch.int64).reshape(2, length) + 100 * i
    return {
        "input_ids": ids,
        "attention_mask": torch.ones(2, length, dtype=torch.int64),
        "id": [f"row{2 * i}", f"row{2 * i + 1}"],
        "extra": {"labels": torch.tensor([i % 2, (i + 1) % 2])},
    }


def _explode_at_item(index: int) -> None:
    raise DataError(f"toy.parquet row {index}: column 'text' is None; expected a string.")


class ToyBatches(BaseNode[dict]):
    """``num_items`` batches per epoch; epoch ``e`` starts at item ``e`` (so epochs differ)."""

    def __init__(self, num_items: int, *, fail_at: int | None = None, delay: float = 0.0) -> None:
        super().__init__()
        self.num_items, self.fail_at, self.delay = num_items, fail_at, delay
        self._epoch, self._pos = -1, 0

    def reset(self, initial_state: dict | None = None) -> None:
        super().reset(initial_state)
        if initial_state is None:
            self._epoch, self._pos = self._epoch + 1, 0
        else:
            check_state("toy", initial_state, version=1, settings={"num_items": self.num_items})
            self._epoch, self._pos = initial_state["epoch"], initial_state["pos"]

    def next(self) -> dict:
        if self._pos >= self.num_items:
            raise StopIteration
        if self.delay:
            time.sleep(self.delay)
        if self._pos == self.fail_at:
            _explode_at_item(self._pos)
        self._pos += 1
        return make_batch((self._pos - 1 + self._epoch) % self.num_items)

    def get_state(self) -> dict:
        return make_state(version=1, settings={"num_items": self.num_items}, epoch=self._epoch, pos=self._pos)


def toy_pipeline(num_items: int) -> Pipeline:
    """A facade pipeline whose source already yields tensors, so .prefetch()/.to_cuda() apply."""
    return Pipeline(
        Stage("toy", lambda upstream, ctx, **kw: ToyBatches(**kw), {"num_items": num_items}), output=TENSORS
    )


def reference(num_items: int, epochs: int) -> list[list[Any]]:
    node = ToyBatches(num_items)
    out = []
    for _ in range(epochs):
        node.reset(None)
        out.append([normalize(b) for b in node])
    return out


def prefetch_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name == "padpipe-prefetch"}


@pytest.mark.timeout(30)
@pytest.mark.parametrize("prefetch", [1, 2, 16])
def test_prefetch_works(prefetch: int) -> None:
    node = DevicePrefetcher(ToyBatches(7), prefetch=prefetch)
    got = []
    for _ in range(2):
        node.reset(None)
        got.append([normalize(b) for b in node])
    assert got == reference(7, 2)
    assert got[0] != got[1]


@pytest.mark.timeout(30)
def test_prefetch_works_through_the_pipeline_facade() -> None:
    loader = toy_pipeline(5).prefetch(3).loader()
    got = [[normalize(b) for b in loader] for _ in range(2)]
    assert got == reference(5, 2)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("prefetch", [1, 3])
def test_prefetch_saves_and_restores_its_state(prefetch: int) -> None:
    items = check_node_resume(lambda: DevicePrefetcher(ToyBatches(6), prefetch=prefetch), epochs=2)
    assert items == reference(6, 2)


@pytest.mark.timeout(60)
def test_prefetch_saves_and_restores_its_state_through_the_loader() -> None:
    check_loader_resume(lambda: toy_pipeline(5).prefetch(2).loader(), epochs=2)


@pytest.mark.timeout(30)
def test_prefetch_state_is_the_consumers_position_not_the_threads() -> None:
    node = DevicePrefetcher(ToyBatches(10), prefetch=4)
    node.reset(None)
    assert node.state_dict()["source"]["pos"] == 0
    next(node)
    time.sleep(0.3)  # the thread has read 4-5 items ahead by now
    assert node.state_dict()["source"] == make_state(version=1, settings={"num_items": 10}, epoch=0, pos=1)
    for _ in range(9):
        next(node)
    with pytest.raises(StopIteration):
        next(node)
    assert node.state_dict()["source"]["pos"] == 10


@pytest.mark.timeout(30)
def test_prefetch_reraises_upstream_error_with_its_traceback() -> None:
    node = DevicePrefetcher(ToyBatches(8, fail_at=3), prefetch=2)
    node.reset(None)
    assert [normalize(next(node)) for _ in range(3)] == reference(8, 1)[0][:3]
    with pytest.raises(DataError, match=r"^toy\.parquet row 3: column 'text' is None; expected a string\.$") as info:
        next(node)
    frames = "".join(traceback.format_exception(info.value))
    assert "_explode_at_item" in frames and "in next" in frames
    with pytest.raises(DataError, match=r"^toy\.parquet row 3"):  # still failed until reset
        next(node)
    assert node.state_dict()["source"]["pos"] == 3  # the last good position, resumable


@pytest.mark.timeout(30)
def test_prefetch_does_not_hang_when_abandoned_mid_epoch() -> None:
    node = DevicePrefetcher(ToyBatches(10**9), prefetch=2)
    node.reset(None)
    next(node), next(node)
    time.sleep(0.2)  # the thread is now blocked on a full queue
    node.reset(None)  # stops it, starts epoch 1
    assert normalize(next(node)) == normalize(make_batch(1))
    saved = node.state_dict()
    kept = copy.deepcopy(saved)
    node.reset(saved)
    assert saved == kept  # reset never mutates the dict it is given
    assert normalize(next(node)) == normalize(make_batch(2))


@pytest.mark.timeout(30)
def test_prefetch_thread_stops_when_the_node_is_collected() -> None:
    before = prefetch_threads()
    node = DevicePrefetcher(ToyBatches(10**9, delay=0.001), prefetch=2)
    next(node)
    started = prefetch_threads() - before
    assert len(started) == 1
    del node
    gc.collect()
    thread = started.pop()
    thread.join(timeout=10)
    assert not thread.is_alive()


def test_prefetch_raises_error_when_state_is_not_its_own() -> None:
    node = DevicePrefetcher(ToyBatches(3), prefetch=2)
    with pytest.raises(
        StateMismatchError, match=r"^DevicePrefetcher state doesn't match this pipeline: version found 9"
    ):
        node.reset({"version": 9, "settings": {}, "source": None})


def test_prefetch_raises_error_when_arguments_are_bad() -> None:
    with pytest.raises(ValueError, match=r"^`prefetch` must be greater than zero, but is 0 instead\.$"):
        DevicePrefetcher(ToyBatches(3), prefetch=0)
    with pytest.raises(ValueError, match=r"^`device` must be None, 'cpu' or a CUDA device, but is 'meta' instead\.$"):
        DevicePrefetcher(ToyBatches(3), prefetch=2, device="meta")
    with pytest.raises(TypeError, match=r"^`device` must be None, a str, an int or a torch\.device, but is 1\.5"):
        DevicePrefetcher(ToyBatches(3), prefetch=2, device=1.5)
    assert DevicePrefetcher(ToyBatches(3), prefetch=2, device="cpu").device is None


@NO_CUDA
def test_to_cuda_raises_error_when_no_cuda_device() -> None:
    message = r"^to_cuda\(\) needs a CUDA device, but torch\.cuda\.is_available\(\) is False; use \.to\('cpu'\)"
    with pytest.raises(RuntimeError, match=message):
        toy_pipeline(3).to_cuda(prefetch=2)
    with pytest.raises(RuntimeError, match=message):
        toy_pipeline(3).to("cuda")
    with pytest.raises(RuntimeError, match=message):
        DevicePrefetcher(ToyBatches(3), prefetch=2, device="cuda")


@CUDA
@pytest.mark.timeout(60)
def test_to_cuda_works() -> None:
    loader = toy_pipeline(6).to_cuda(prefetch=2).loader()
    for epoch in range(2):
        batches = list(loader)
        for batch in batches:
            assert batch["input_ids"].is_cuda and batch["extra"]["labels"].is_cuda
            assert isinstance(batch["id"], list) and isinstance(batch["id"][0], str)
        cpu = [{k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in b.items()} for b in batches]
        assert [normalize(b) for b in batches] == reference(6, 2)[epoch]
        for i, batch in enumerate(cpu):
            assert torch.equal(batch["input_ids"], make_batch((i + epoch) % 6)["input_ids"])


@CUDA
@pytest.mark.timeout(120)
def test_to_cuda_saves_and_restores_its_state() -> None:
    items = check_node_resume(lambda: DevicePrefetcher(ToyBatches(5), prefetch=2, device="cuda"), epochs=2)
    assert items == reference(5, 2)


@pytest.mark.timeout(120)
def test_prefetch_saves_and_restores_its_state_in_a_real_pipeline(tmp_path) -> None:
    for module in ("readers.parquet", "pipes.tokenize", "pipes.batch", "pipes.pad"):  # written in parallel
        pytest.importorskip(f"padpipe.{module}")
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = str(tmp_path / "pairs.parquet")
    texts = [" ".join(["word"] * (1 + i % 5)) for i in range(12)]
    pq.write_table(pa.table({"text": texts, "label": list(range(12))}), path, row_group_size=5)
    pipe = pp.read_parquet(path, chunk_rows=4).tokenize(pp.examples.tokenizer(), fields="text").batch(3).pad()
    check_loader_resume(lambda: pipe.prefetch(2).loader(), epochs=2)
    plain = [normalize(b) for b in pipe.loader()]
    assert [normalize(b) for b in pipe.prefetch(2).loader()] == plain
    assert sorted(label for b in plain for label in b["labels"][2]) == list(range(12))
