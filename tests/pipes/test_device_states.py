"""GPU batches around the device stage, on the CPU: held batches in states, the packed split, bf16, step sync.

Tensors "on the GPU" are fake_cuda.DeviceTensors (mixing one with a CPU tensor raises, as ATen
does across devices); equal steps' collectives are a one-rank fake (:class:`OneRank`), so a batch
is held read ahead in the state exactly as under ``torch.distributed``.
"""

from __future__ import annotations

import io
from typing import Any

import pytest
import torch
import torch.distributed as dist

import padpipe as pp
from padpipe.pipes import device_backend
from padpipe.pipes.batch_tensors import iter_tensors, map_tensors
from padpipe.runtime import equal_steps as es
from padpipe.runtime import step_sync
from padpipe.runtime.batch_cut import split_batch
from padpipe.runtime.equal_steps import EqualSteps
from padpipe.runtime.step_sync import StepSync
from padpipe.state import checksum
from tests.contract import normalize
from tests.pipes.fake_cuda import DeviceTensor, FakeCuda, on_device
from tests.pipes.nodes import ListNode
from tests.pipes.test_device import make_batch, reference, toy_pipeline
from tests.runtime.fake_group import OneRank

CUDA = torch.device("cuda")


def saved(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` written with ``torch.save`` and read back on the CPU, as a checkpoint is."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, map_location="cpu", weights_only=True)


def all_on_device(batch: Any) -> bool:
    return all(isinstance(t, DeviceTensor) for t in iter_tensors(batch))


def test_split_batch_cuts_a_packed_batch_on_the_gpu() -> None:
    pipe = pp.read_jsonl(pp.examples.SAMPLE_JSONL).tokenize(pp.examples.tokenizer()).pack(128, batch_size=5)
    batch = next(iter(pipe.loader()))
    halves = split_batch(map_tensors(batch, on_device))  # searchsorted(gpu, cpu value) raised here
    assert [normalize(h) for h in halves] == [normalize(h) for h in split_batch(batch)]
    assert all(all_on_device(h) for h in halves)
    assert halves[1]["cu_seq_lens_q"] is halves[1]["cu_seq_lens_k"]


@pytest.mark.parametrize("device", [CUDA, None])
def test_equal_steps_saves_held_batches_on_the_cpu_and_restores_them_on_its_device(monkeypatch, device) -> None:
    monkeypatch.setattr(es, "detect_sync", lambda group=None: OneRank())
    items = [map_tensors(make_batch(i), on_device if device else lambda t: t) for i in range(4)]
    with device_backend.use(FakeCuda()) as fake:
        node = EqualSteps(ListNode(items), device=device)
        node.reset(None)
        next(node)
        state = saved(node.state_dict())
        assert [type(t) for b in state["lockstep"]["held"] for t in iter_tensors(b)] == [torch.Tensor] * 3
        again = EqualSteps(ListNode(items), device=device)
        again.reset(state)
        rest = list(again)
    assert [normalize(b) for b in rest] == [normalize(b) for b in items[1:]]
    assert all(all_on_device(b) for b in rest) is (device is not None)
    assert [c for c in fake.calls if c[0] == "move"] == ([("move", torch.device("cuda", 0))] * 3 if device else [])


@pytest.mark.timeout(60)
def test_loader_resumes_a_to_cuda_pipeline_from_a_cpu_checkpoint(monkeypatch) -> None:
    monkeypatch.setattr(es, "detect_sync", lambda group=None: OneRank())
    with device_backend.use(FakeCuda()):
        loader = toy_pipeline(5).to_cuda().loader()
        batches = iter(loader)
        next(batches), next(batches)
        state = saved(loader.state_dict())
        again = toy_pipeline(5).to_cuda().loader()
        again.load_state_dict(state)
        rest = list(again)
    assert all(all_on_device(b) for b in rest)  # the held batch too, though the checkpoint was read on the CPU
    assert [normalize(b) for b in rest] == reference(5, 1)[0][2:]


@pytest.mark.timeout(60)
def test_loader_state_holds_a_bf16_block_mask(monkeypatch) -> None:
    monkeypatch.setattr(es, "detect_sync", lambda group=None: OneRank())
    rows = [{"text": " ".join(["word"] * (1 + i % 7))} for i in range(40)]
    pipe = (
        pp.from_iterable(rows)
        .tokenize(pp.examples.tokenizer())
        .pack(16, batch_size=2, block_mask=True, mask_dtype=torch.bfloat16)
    )
    expected = [normalize(b) for b in pipe.loader()]
    loader = pipe.loader()
    batches = iter(loader)
    next(batches)
    state = saved(loader.state_dict())  # a held batch with a bf16 mask: .numpy() raised TypeError
    again = pipe.loader()
    again.load_state_dict(state)
    assert [normalize(b) for b in again] == expected[1:] and len(expected) > 3
    assert expected[0]["attention_mask"][0] == "torch.bfloat16"


def test_checksum_counts_bf16_bytes_and_keeps_older_checksums() -> None:
    mask = torch.zeros(2, 2, dtype=torch.bfloat16)
    other = mask.clone()
    other[1, 0] = torch.finfo(torch.bfloat16).min
    assert checksum({"m": mask}) == checksum({"m": mask.clone()}) != checksum({"m": other})
    assert checksum({"m": mask}) != checksum({"m": mask.view(torch.int16)})  # the dtype counts
    # values hashed through numpy before: states saved then still load
    assert checksum({"a": torch.arange(6).reshape(2, 3)}) == "17c8627b"
    assert checksum({"b": torch.tensor(True)}) == "61c97bab"
    assert checksum({"f": torch.arange(6).reshape(2, 3).t()}) == "06daa0be"


@pytest.fixture
def one_rank_world(tmp_path, monkeypatch):
    """A real gloo world of one process (torch.distributed), torn down after the test."""
    monkeypatch.setattr(step_sync, "_GLOO", [])
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_step_sync_agrees_on_cpu_tensors_in_one_gloo_group_under_nccl(one_rank_world, monkeypatch) -> None:
    made = []
    new_group = dist.new_group
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "nccl" if group is None else "gloo")
    monkeypatch.setattr(dist, "new_group", lambda **kw: made.append(kw) or new_group(**kw))
    syncs = [StepSync(), StepSync()]
    assert made == [{"backend": "gloo"}]  # created once, for every loader of this world
    assert syncs[0].group is syncs[1].group is not None
    assert syncs[0].device == torch.device("cpu")  # no CUDA tensor, no host sync each step
    assert syncs[0].gather([3, -3, 1]) == [[3, -3, 1]] and syncs[0].sum(4) == 4


def test_step_sync_uses_a_world_that_takes_cpu_tensors_as_it_is(one_rank_world, monkeypatch) -> None:
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "cpu:gloo,cuda:nccl")
    monkeypatch.setattr(dist, "new_group", lambda **kw: pytest.fail("no group needed"))
    sync = StepSync()
    assert (sync.group, sync.device) == (None, torch.device("cpu"))


@pytest.mark.timeout(60)
def test_lightning_loader_keeps_batches_fetched_ahead_on_the_cpu() -> None:
    lightning = pytest.importorskip("padpipe.integrations.lightning")
    with device_backend.use(FakeCuda()):
        loader = lightning.LightningLoader(toy_pipeline(5).to_cuda().loader())
        batches = iter(loader)
        next(batches), next(batches)  # Lightning fetches one ahead
        loader.taken()
        state = saved(loader.state_dict())
        assert [type(t) for r in state["ranks"] for b in r["ahead"] for t in iter_tensors(b)] == [torch.Tensor] * 3
        again = lightning.LightningLoader(toy_pipeline(5).to_cuda().loader())
        again.load_state_dict(state)
        rest = []
        for batch in again:
            rest.append(batch)
            again.taken()
    assert all(all_on_device(b) for b in rest)  # the restored batch too
    assert [normalize(b) for b in rest] == reference(5, 1)[0][1:]


@pytest.mark.timeout(120)
def test_elastic_resume_of_a_to_cuda_pipeline_from_cpu_checkpoints(monkeypatch, tmp_path) -> None:
    """2 ranks save (each holding a batch ahead) -> 1 rank loads both on the CPU: every row once, all on the GPU."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = str(tmp_path / "rows.parquet")
    texts = [" ".join(["word"] * (1 + i % 9)) for i in range(120)]
    pq.write_table(pa.table({"text": texts, "rid": list(range(120))}), path, row_group_size=20)
    monkeypatch.setattr(es, "detect_sync", lambda group=None: OneRank())

    def loader(rank: int, ranks: int) -> Any:
        pipe = (
            pp.read_parquet(path, chunk_rows=10).tokenize(pp.examples.tokenizer()).bucket(max_tokens=64, buffer_size=30)
        )
        return pipe.pad().to_cuda().loader(consumer=pp.Consumer(rank=rank, world_size=ranks))

    with device_backend.use(FakeCuda()):
        states, seen = [], []
        for rank in range(2):
            old = loader(rank, 2)
            batches = iter(old)
            seen += [r for _ in range(2) for r in next(batches)["rid"].tolist()]
            states.append(saved(old.state_dict()))  # GPU tensors in a state would not load here
        assert [len(s["root"]["lockstep"]["held"]) for s in states] == [1, 1]
        new = loader(0, 1)
        new.load_state_dict(states)
        rest = list(new)
    assert sorted(seen + [r for b in rest for r in b["rid"].tolist()]) == list(range(120))
    assert all(all_on_device(b) for b in rest)
