"""The CUDA branch of the device stage on the CPU: every CUDA call goes to a logging fake (fake_cuda.py).

These check what a GPU run cannot show by its results alone: the order of the calls for each
batch (pin, copy on the side stream, an event after the last copy, the consumer's wait before
the batch is returned, ``record_stream`` on every tensor), that no CUDA call happens at recipe
build, loader construction or in worker processes, which device a rank copies to, and that
``to_cuda`` refuses to run anywhere but last, in the main process.
"""

from __future__ import annotations

import collections
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

import padpipe as pp
from padpipe.pipes import device_backend
from padpipe.pipes.batch_tensors import iter_tensors
from padpipe.pipes.device import DevicePrefetcher
from tests.contract import normalize
from tests.pipes.fake_cuda import DeviceTensor, FakeCuda
from tests.pipes.nodes import ListNode
from tests.pipes.test_device import ToyBatches, reference, toy_pipeline
from tests.worker_errors import raises_in_workers

Pair = collections.namedtuple("Pair", ["ids", "mask"])


@pytest.fixture
def fake() -> Any:
    with device_backend.use(FakeCuda()) as backend:
        yield backend


def check_batch_calls(fake: FakeCuda, batch: Any, calls: list[tuple]) -> None:
    """``calls`` (the log when ``batch`` was returned) hold this batch's copies, event, wait and records, in order."""
    ids = {id(t) for t in iter_tensors(batch)}
    copies = [i for i, c in enumerate(calls) if c[0] == "copy" and id(c[2]) in ids]
    assert len(copies) == len(ids)  # every tensor copied once
    pinned = [
        next(j for j in range(i - 1, -1, -1) if calls[j][0] == "pin" and calls[j][1] is calls[i][1]) for i in copies
    ]
    assert all(j < i for j, i in zip(pinned, copies))  # pinned, then copied (the consumer's calls may come between)
    assert {calls[i][4].name for i in copies} == {"side:cuda:0"}  # on the side stream
    event_at = next(i for i in range(copies[-1], len(calls)) if calls[i][0] == "event")
    event, stream = calls[event_at][1:]
    assert stream.name == "side:cuda:0"  # recorded on the side stream, after the batch's last copy
    waits = [i for i, c in enumerate(calls) if c[0] == "wait" and c[2] == event]
    assert len(waits) == 1 and calls[waits[0]][1].name == "consumer:cuda:0"  # the consumer waits before return
    recorded = {id(c[1]) for c in calls[waits[0] :] if c[0] == "record" and c[2].name == "consumer:cuda:0"}
    assert recorded == ids  # every tensor is marked as used on the consumer's stream


@pytest.mark.timeout(30)
def test_to_cuda_orders_pin_copy_event_wait_and_record_for_every_batch(fake: FakeCuda) -> None:
    node = DevicePrefetcher(ToyBatches(6), prefetch=2, device="cuda:0")
    for epoch in range(2):
        node.reset(None)
        got = []
        for _ in range(6):
            batch = next(node)
            check_batch_calls(fake, batch, list(fake.calls))
            assert all(isinstance(t, DeviceTensor) for t in iter_tensors(batch))
            got.append(normalize(batch))
        assert got == reference(6, 2)[epoch]
    assert fake.names().count("new_stream") == 1  # one side stream, made at the first reset


@pytest.mark.timeout(30)
def test_to_cuda_copies_aliased_tensors_once_and_keeps_container_types(fake: FakeCuda) -> None:
    from transformers import BatchEncoding

    bounds = torch.tensor([0, 3, 4], dtype=torch.int32)
    items = [
        {"input_ids": torch.ones(1, 4), "cu_seq_lens_q": bounds, "cu_seq_lens_k": bounds, "max_length_q": 3},
        Pair(torch.ones(2), torch.zeros(2)),
        BatchEncoding({"input_ids": torch.ones(1, 2), "attention_mask": torch.ones(1, 2)}),
        collections.UserDict({"x": torch.ones(1)}),
    ]
    node = DevicePrefetcher(ListNode(items), prefetch=2, device="cuda:0")
    node.reset(None)
    packed = next(node)
    assert packed["cu_seq_lens_q"] is packed["cu_seq_lens_k"] and packed["max_length_q"] == 3
    assert [c[0] for c in fake.calls if c[0] in ("pin", "copy") and c[1] is bounds] == ["pin", "copy"]  # once
    for expected_type, item in zip((Pair, BatchEncoding, collections.UserDict), node):
        assert type(item) is expected_type
        assert all(isinstance(t, DeviceTensor) for t in iter_tensors(item))
    assert fake.names().count("copy") == fake.names().count("pin") == 2 + 2 + 2 + 1


@pytest.mark.timeout(120)
def test_to_cuda_makes_no_cuda_call_before_the_loader_starts_nor_in_workers(fake: FakeCuda) -> None:
    rows = [{"text": " ".join(["word"] * (1 + i % 4))} for i in range(16)]
    plain = pp.from_iterable(rows).tokenize(pp.examples.tokenizer()).batch(2).pad()
    expected = [normalize(b) for b in plain.loader(num_workers=2, multiprocessing_context="fork")]
    fake.forbidden = True  # recipe, loader construction: a CUDA call here raises
    loader = plain.to_cuda().loader(num_workers=2, multiprocessing_context="fork")
    fake.forbidden = False  # workers are forked after the side stream exists; a call in one raises there
    got = list(loader)
    assert all(isinstance(t, DeviceTensor) for b in got for t in iter_tensors(b))
    assert [normalize(b) for b in got] == expected
    assert fake.names()[:2] == ["current_device", "new_stream"]


@pytest.mark.timeout(120)
def test_to_cuda_raises_error_when_it_runs_in_a_dataloader_worker(fake: FakeCuda) -> None:
    pipe = toy_pipeline(4).to_cuda()
    with raises_in_workers(
        RuntimeError,
        match=r"to_cuda\(\) must run in the main process, but it is running in a "
        r"DataLoader worker: give the DataLoader the pipeline without \.to_cuda\(\)",
    ):
        next(iter(DataLoader(pipe, batch_size=None, num_workers=1, multiprocessing_context="fork")))


def test_to_cuda_raises_error_when_a_stage_follows_it(fake: FakeCuda) -> None:
    pipe = toy_pipeline(3).to_cuda()
    with pytest.raises(
        ValueError,
        match=r"^to_cuda\(\) must be the last stage, but \.prefetch\(\) follows it: "
        r"add it before \.to_cuda\(\)\.$",
    ):
        pipe.prefetch(4)
    with pytest.raises(ValueError, match=r"^to_cuda\(\) must be the last stage, but \.mine\(\) follows it"):
        pipe.add_stage("mine", lambda up, ctx: up, output="tensors")
    with pytest.raises(ValueError, match=r"^to_cuda\(\) must be the last stage, but \.to_cuda\(\) follows it"):
        pipe.to("cuda")
    assert toy_pipeline(3).prefetch(4).to_cuda().stages[-1].name == "to_cuda"


@pytest.mark.parametrize(
    ("local_rank", "devices", "current", "given", "expected"),
    [
        ("1", 2, 0, "cuda", "cuda:1"),
        (None, 2, 1, "cuda", "cuda:1"),
        ("1", 2, 1, "cuda:0", "cuda:0"),
        ("3", 1, 0, "cuda", "cuda:0"),
    ],
)
def test_to_cuda_copies_to_the_local_rank_device_by_default(
    monkeypatch, local_rank, devices, current, given, expected
) -> None:
    if local_rank is None:
        monkeypatch.delenv("LOCAL_RANK", raising=False)
    else:
        monkeypatch.setenv("LOCAL_RANK", local_rank)
    with device_backend.use(FakeCuda(devices=devices, current=current)) as fake:
        node = DevicePrefetcher(ToyBatches(2), prefetch=1, device=given)
        next(node)
    assert {c[3] for c in fake.calls if c[0] == "copy"} == {torch.device(expected)}
    assert [c[1] for c in fake.calls if c[0] == "new_stream"] == [torch.device(expected)]


def test_to_cuda_raises_error_when_local_rank_names_a_device_it_cannot_see(monkeypatch) -> None:
    monkeypatch.setenv("LOCAL_RANK", "3")
    with device_backend.use(FakeCuda(devices=2)):
        node = DevicePrefetcher(ToyBatches(2), prefetch=1, device="cuda")
        with pytest.raises(
            ValueError,
            match=r"^to_cuda\(\): LOCAL_RANK is 3 but this process sees 2 CUDA device\(s\); "
            r"pass the device, e\.g\. \.to_cuda\('cuda:0'\)\.$",
        ):
            node.reset(None)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mask_dtype", [torch.bfloat16, torch.bool])
def test_to_cuda_builds_the_block_mask_on_the_gpu_after_pack(fake: FakeCuda, mask_dtype: torch.dtype) -> None:
    rows = [{"text": " ".join(["word"] * (1 + i % 7))} for i in range(30)]
    pipe = (
        pp.from_iterable(rows)
        .tokenize(pp.examples.tokenizer())
        .pack(16, batch_size=2, block_mask=True, mask_dtype=mask_dtype)
    )
    expected = [normalize(b) for b in pipe.loader()]
    got = list(pipe.to_cuda().loader())
    assert [normalize(b) for b in got] == expected and len(expected) > 3
    assert all(isinstance(b["attention_mask"], DeviceTensor) for b in got)
    assert max(c[1].dim() for c in fake.calls if c[0] == "copy") == 2  # no [B, 1, L, L] tensor pinned or copied


def test_prefetch_raises_error_when_block_mask_has_no_device() -> None:
    with pytest.raises(
        ValueError,
        match=r"^`block_mask` must be None or, with a CUDA device, one of \(torch\.float32, "
        r".*\), but is torch\.float32 with device None instead\.$",
    ):
        DevicePrefetcher(ToyBatches(2), prefetch=1, block_mask=torch.float32)
