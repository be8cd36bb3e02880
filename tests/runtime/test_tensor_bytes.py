"""Worker batches and states travel as bytes: exact tensors back, no shared memory, only changed state resent."""

from __future__ import annotations

import collections
import gc
import json
import sys
import weakref
from multiprocessing.reduction import ForkingPickler

import numpy as np
import pytest
import torch
import torch.multiprocessing  # noqa: F401  (registers the reductions DataLoader workers pickle tensors with)
from torchdata.stateful_dataloader.incremental_state import _IncrementalState

import padpipe as pp
from padpipe.runtime.tensor_bytes import BytesIterator, TensorBytes, as_bytes, tensor_from_bytes
from padpipe.runtime.workers import import_what_workers_import
from padpipe.state import CHECKSUM_KEY


def through_a_worker_pipe(value):
    """``value`` pickled as a DataLoader worker's queue pickles it, and unpickled in the receiving process."""
    return ForkingPickler.loads(ForkingPickler.dumps(value))


BASE = torch.arange(24).reshape(4, 6)
TENSORS = {
    "int64": BASE,
    "int32 column": BASE.to(torch.int32)[:, 2],  # not contiguous
    "transposed": BASE.t(),
    "every other row": BASE[::2],
    "bool": BASE % 3 == 0,
    "uint8": BASE.to(torch.uint8),
    "float16": BASE.to(torch.float16) / 7,
    "bfloat16": BASE.to(torch.bfloat16) / 7,  # no NumPy dtype
    "float64": BASE.double() / 3,
    "complex conj view": torch.complex(BASE.float(), -BASE.float()).conj(),
    "negative view": torch.complex(BASE.float(), BASE.float())._neg_view(),
    "0-d": torch.tensor(7),
    "empty": torch.zeros(0, 3, dtype=torch.int32),
}


@pytest.mark.parametrize("name", TENSORS)
def test_a_tensor_sent_as_bytes_arrives_equal_in_memory_of_its_own(name):
    tensor = TENSORS[name]
    back = through_a_worker_pipe(TensorBytes(tensor))
    assert type(back) is torch.Tensor and back.dtype == tensor.dtype and back.shape == tensor.shape
    assert torch.equal(back, tensor.resolve_conj().resolve_neg())
    assert not back.is_shared() and back.is_contiguous()


def test_torch_would_send_the_same_tensor_through_shared_memory():
    """What as_bytes avoids: torch's own reduction moves a tensor into a shared-memory file per send."""
    assert through_a_worker_pipe(BASE.clone()).is_shared()


def test_as_bytes_converts_plain_cpu_tensors_in_dicts_lists_and_tuples_and_keeps_everything_else():
    grad = torch.ones(2, requires_grad=True)
    param = torch.nn.Parameter(torch.ones(2))
    ordered = collections.OrderedDict(ids=torch.ones(2))
    value = {"ids": BASE, "spans": [BASE[0], (BASE[1], 3)], "n": 2, "name": "x", "grad": grad, "param": param}
    value["ordered"] = ordered
    sent = as_bytes(value)
    assert isinstance(sent["ids"], TensorBytes) and isinstance(sent["spans"][0], TensorBytes)
    assert isinstance(sent["spans"][1], tuple) and isinstance(sent["spans"][1][0], TensorBytes)
    assert sent["spans"][1][1] == 3 and sent["n"] == 2 and sent["name"] == "x"
    assert sent["grad"] is grad and sent["param"] is param and sent["ordered"] is ordered  # travel as torch sends them
    back = through_a_worker_pipe(sent)
    assert torch.equal(back["ids"], BASE) and torch.equal(back["spans"][1][0], BASE[1])
    assert back["grad"].requires_grad and isinstance(back["param"], torch.nn.Parameter)


def test_a_tensor_found_twice_arrives_as_one_tensor():
    """A packed batch's ``cu_seq_lens_q`` is its ``cu_seq_lens_k``: the device stage copies it once."""
    lens = torch.tensor([0, 3, 7], dtype=torch.int32)
    back = through_a_worker_pipe(as_bytes({"cu_seq_lens_q": lens, "cu_seq_lens_k": lens, "other": lens.clone()}))
    assert back["cu_seq_lens_q"] is back["cu_seq_lens_k"] and back["other"] is not back["cu_seq_lens_q"]
    assert torch.equal(back["cu_seq_lens_q"], lens) and torch.equal(back["other"], lens)


def test_tensors_arrive_on_the_cpu_whatever_default_device_the_receiving_process_set():
    sent = ForkingPickler.dumps(as_bytes({"ids": BASE}))
    with torch.device("meta"):
        back = ForkingPickler.loads(sent)
    assert back["ids"].device.type == "cpu" and torch.equal(back["ids"], BASE)


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors is in prototype stage")
@pytest.mark.parametrize("layout", [torch.strided, torch.jagged])
def test_a_nested_tensor_travels_as_torch_sends_it(layout):
    nested = torch.nested.nested_tensor([torch.ones(2), torch.ones(3)], layout=layout)
    assert as_bytes({"x": nested})["x"] is nested


def test_equal_tensor_bytes_compare_equal_and_any_difference_does_not():
    one = TensorBytes(BASE)
    assert one == TensorBytes(BASE.clone()) and [one] == [TensorBytes(BASE.clone())]
    assert one != TensorBytes(BASE.to(torch.int32))  # the same values, another dtype
    assert one != TensorBytes(BASE.reshape(6, 4))  # the same bytes, another shape
    other = BASE.clone()
    other[3, 5] = -1
    assert one != TensorBytes(other) and one != BASE  # a tensor is no TensorBytes
    with pytest.raises(TypeError, match="unhashable"):
        hash(one)


def test_torchdata_resends_only_the_state_parts_that_changed():
    """StatefulDataLoader's workers send the difference between consecutive states, leaf by leaf: compared with
    ``==``, which a list of tensors cannot answer (so torch sent every tensor of it after every step)."""
    before = {"buffer": [BASE, BASE + 1], "ready": BASE[0], "count": 3}
    after = {"buffer": [BASE, BASE + 1], "ready": BASE[1], "count": 3}
    assert set(_IncrementalState(before).generate_delta(after)) == {("buffer",), ("ready",)}
    delta = _IncrementalState(as_bytes(before)).generate_delta(as_bytes(after))
    assert set(delta) == {("ready",)} and delta[("ready",)] == TensorBytes(BASE[1])


def test_bytes_iterator_sends_batches_and_states_as_bytes_and_loads_states_as_given():
    class Counting:
        loaded = None

        def __next__(self):
            return {"ids": torch.tensor([1, 2])}

        def state_dict(self):
            return {"buffer": [torch.tensor([3])]}

        def load_state_dict(self, state):
            self.loaded = state

    inner = Counting()
    it = BytesIterator(inner)
    assert iter(it) is it and next(it) == {"ids": TensorBytes(torch.tensor([1, 2]))}
    assert it.state_dict() == {"buffer": [TensorBytes(torch.tensor([3]))]}
    state = {"buffer": [torch.tensor([4])]}
    it.load_state_dict(state)
    assert inner.loaded is state


class States:
    """An iterator whose next state is whatever the test sets."""

    state: dict = {}

    def __next__(self):
        raise StopIteration

    def state_dict(self):
        return self.state

    def load_state_dict(self, state):
        raise AssertionError("not called")


def sealed(rows: torch.Tensor) -> dict:
    return {"ipc": rows, CHECKSUM_KEY: f"{int(rows.sum()):08x}"}


def test_a_sealed_dict_met_again_is_sent_as_the_same_object_and_torchdata_resends_nothing_of_it():
    """The shuffle buffer's rows: the same sealed dicts in every state until they leave the buffer."""
    inner = States()
    it = BytesIterator(inner)
    first, second = sealed(torch.arange(1000)), sealed(torch.arange(5))
    inner.state = {"segments": [first], "live": torch.tensor([1, 2])}
    sent = it.state_dict()
    tracker = _IncrementalState(sent)
    inner.state = {"segments": [first], "live": torch.tensor([2])}
    again = it.state_dict()
    assert again["segments"][0] is sent["segments"][0]  # not converted again
    assert set(tracker.generate_delta(again)) == {("live",)}  # the rows are not resent
    inner.state = {"segments": [first, second], "live": torch.tensor([2, 1000])}
    grown = it.state_dict()
    assert grown["segments"][0] is sent["segments"][0] and grown["segments"][1] == as_bytes(second)
    assert set(tracker.generate_delta(grown)) == {("segments",), ("live",)}
    back = through_a_worker_pipe(grown)  # what the main process gets: the rows themselves
    assert torch.equal(back["segments"][0]["ipc"], torch.arange(1000)) and back["segments"][1][CHECKSUM_KEY]


def test_a_sealed_dict_that_left_the_state_is_let_go():
    inner = States()
    it = BytesIterator(inner)
    rows = torch.arange(10)
    gone = weakref.ref(rows)
    inner.state = {"segments": [sealed(rows)]}
    it.state_dict()
    del rows
    inner.state = {"segments": [sealed(torch.arange(3))]}
    it.state_dict()
    gc.collect()
    assert gone() is None


def test_tensor_from_bytes_reads_the_bytes_of_any_dtype():
    data = TensorBytes(TENSORS["bfloat16"]).data
    assert torch.equal(tensor_from_bytes(torch.bfloat16, (4, 6), data), TENSORS["bfloat16"])
    assert tensor_from_bytes(torch.int64, (0,), b"").shape == (0,)


@pytest.mark.parametrize("workers", [1, 2])
def test_loader_workers_deliver_batches_in_ordinary_memory_equal_to_the_main_process_ones(workers):
    rows = [{"text": " ".join(["word"] * (1 + i % 9)), "idx": i} for i in range(60)]
    pipe = pp.from_iterable(rows, chunk_rows=10).tokenize(pp.examples.tokenizer()).batch(7).pad()
    main = list(pipe.loader())
    loader = pipe.loader(num_workers=workers)
    served = list(loader)
    assert sorted(i for b in served for i in b["idx"].tolist()) == list(range(60))
    by_first_row = {int(b["idx"][0]): b for b in main}
    for batch in served:
        assert all(not t.is_shared() for t in batch.values())  # no shared-memory file per tensor
        if workers == 1:  # one worker reads the rank's share in the main process's order: the same batches
            expected = by_first_row[int(batch["idx"][0])]
            assert all(torch.equal(batch[k], expected[k]) for k in expected)


def test_import_what_workers_import_imports_pandas_where_pyarrow_would():
    """pyarrow imports pandas at its first conversion: done before forking, the workers never import it again.
    (If a pyarrow release stops doing so, this fails: then the function has nothing left to do.)"""
    pytest.importorskip("pandas")
    import_what_workers_import()
    assert "pandas" in sys.modules


@pytest.mark.filterwarnings("ignore:chat... the chat template does not render the reasoning")  # Llama 3.1: counted
@pytest.mark.parametrize("model", ["qwen3", "llama3_1"])
def test_packed_chats_under_a_real_template_come_from_a_worker_as_from_the_main_process_and_resume_exactly(
    model, tmp_path
):
    """Multi-turn chats with reasoning and tool calls under a real template, packed with masked labels: one worker
    serves the main process's batches exactly (ids, positions, labels, ``cu_seq_lens``), and its states resume
    exactly."""
    pytest.importorskip("transformers")
    from tests.chat import real_templates as rt
    from tests.contract import check_loader_resume, normalize

    path = tmp_path / "chats.jsonl"
    path.write_text("".join(json.dumps({"messages": c}) + "\n" for c in rt.conversations(model, 40, seed=3)))
    pipe = pp.read_jsonl(str(path), chunk_rows=8).chat(rt.tokenizer(model), max_length=512).pack(512, batch_size=2)
    loader = pipe.loader()
    main = [normalize(b) for b in loader]
    assert loader.stats().skipped == {}
    assert [normalize(b) for b in pipe.loader(num_workers=1)] == main
    check_loader_resume(lambda: pipe.loader(num_workers=1), steps=[0, 3])


def test_long_documents_packed_by_two_workers_train_every_token_once():
    """Documents of very uneven length, EOS-joined and packed by two workers: the labels' token histogram of an
    epoch is the corpus's predictions (every token but each document's first, cut ones too), as with no worker."""
    rng = np.random.default_rng(5)
    words = "the cat sat on a mat and then ran far away".split()
    docs = [" ".join(rng.choice(words, size=int(n))) for n in rng.pareto(1.2, 60) * 20 + 1]
    pipe = pp.from_iterable([{"text": d} for d in docs], chunk_rows=7).tokenize(pp.examples.tokenizer())
    pipe = pipe.pack(64, batch_size=4)

    def label_histogram(loader) -> collections.Counter:
        return collections.Counter(t for b in loader for t in b["labels"][b["labels"] != -100].tolist())

    tok = pp.examples.tokenizer()
    expected = collections.Counter(t for d in docs for t in tok.encode(d).ids[1:])
    assert sum(expected.values()) > 1000 and max(len(tok.encode(d).ids) for d in docs) > 64
    assert label_histogram(pipe.loader()) == expected
    assert label_histogram(pipe.loader(num_workers=2)) == expected
