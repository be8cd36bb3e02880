"""Crafted states, checksums recomputed: each is one line naming the stage and key, in bounded time and memory.

The attacks that got raw errors before (issue 30.6): a reader row of 5,000 digits (``ValueError:
Exceeds the limit (4300 digits)``), a list nested 100,000 deep in settings or in a buffer
(``RecursionError``), random bytes as a shuffle segment's Arrow IPC (``OSError``) and a string
offset patched past its data (``ArrowInvalid``), a layout claiming 2 or 10**9 workers on a state
saved with none (``KeyError: 'epoch'``), and a huge string as a reader's file, echoed whole into
the message. Each is forged as an attacker would: edited, then every checksum above it recomputed.
"""

from __future__ import annotations

import copy
import functools
import re
import tracemalloc
import zlib
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import padpipe as pp
from padpipe import Consumer
from padpipe.chunks import record_batch_from_bytes
from padpipe.state import CHECKSUM_KEY, MAX_DEPTH, StateMismatchError, checksum
from padpipe.state_walk import show

LONG = 50_000_000  # the study's 1 GB string, smaller to stay fast


@pytest.fixture(scope="module")
def pipe(tmp_path_factory) -> pp.Pipeline:
    path = tmp_path_factory.mktemp("attacks") / "data.parquet"
    texts = [f"row {i} " * (1 + i % 7) for i in range(300)]
    pq.write_table(pa.table({"text": texts, "rid": np.arange(300)}), path, row_group_size=25)
    reader = pp.read_parquet(str(path), chunk_rows=16).shuffle(buffer_size=64, seed=1)
    return reader.tokenize(pp.examples.tokenizer(), max_length=32).batch(8).pad()


@pytest.fixture(scope="module")
def saved(pipe) -> dict:
    """A loader state after 3 batches (no worker processes)."""
    loader = pipe.loader()
    it = iter(loader)
    for _ in range(3):
        next(it)
    return copy.deepcopy(loader.state_dict())


def path_to(state: Any, found: Callable[[dict], bool], path: tuple = ()) -> tuple | None:
    """The keys down to the first dict ``found`` accepts."""
    if isinstance(state, dict):
        if found(state):
            return path
        items: Any = state.items()
    elif isinstance(state, list):
        items = enumerate(state)
    else:
        return None
    for key, value in items:
        inner = path_to(value, found, (*path, key))
        if inner is not None:
            return inner
    return None


def forged(state: dict, path: tuple, edit: Callable[[Any], None]) -> dict:
    """``state`` with ``edit`` applied to the dict at ``path``, it and every sealed dict above resealed."""
    out = copy.deepcopy(state)
    edit(functools.reduce(lambda v, k: v[k], path, out))  # after the copy: deep values are never copied
    for n in range(len(path), -1, -1):
        node = functools.reduce(lambda v, k: v[k], path[:n], out)
        if isinstance(node, dict) and CHECKSUM_KEY in node:
            node[CHECKSUM_KEY] = checksum(node)
    return out


def reader_at(state: dict) -> tuple:
    return path_to(state, lambda d: "unit" in d and "row" in d)


def shuffle_at(state: dict) -> tuple:
    return path_to(state, lambda d: "segments" in d and "live" in d)


def deep(levels: int) -> list:
    value: list = []
    for _ in range(levels):
        value = [value]
    return value


def refused(pipe: pp.Pipeline, state: Any, pattern: str, **loader: Any) -> str:
    """Load ``state`` and start the epoch: the one-line ``StateMismatchError`` (matched), its message."""
    fresh = pipe.loader(**loader)
    with pytest.raises(StateMismatchError, match=pattern) as caught:
        fresh.load_state_dict(state)
        next(iter(fresh))
    message = str(caught.value)
    assert "\n" not in message and len(message) < 500, message[:600]
    return message


def test_a_reader_row_of_5000_digits_is_refused_by_its_size_never_converted(pipe, saved):
    state = forged(saved, reader_at(saved), lambda r: r.update(row=10**4999))
    refused(
        pipe,
        state,
        r"^ParquetReader state is invalid: 'row' must be an int >= 0 of at most 64 bits, but is an int of 16607 bits "
        r"instead\.$",
    )


@pytest.mark.parametrize("where", ["settings", "buffer"])
def test_a_list_nested_100000_deep_is_refused_naming_where_it_is(pipe, saved, where):
    if where == "settings":
        state = forged(saved, reader_at(saved), lambda r: r["settings"].update(seed=deep(100_000)))
        inside = r"(source/){6}settings/seed/0/0/0/\.\.\."
    else:
        segment = (*shuffle_at(saved), "segments", 0)
        state = forged(saved, segment, lambda s: s.update(ipc=deep(100_000)))
        inside = r"(source/){5}segments/0/ipc/0/0/0/\.\.\."
    refused(
        pipe,
        state,
        rf"^PipelineLoader state is invalid: 'root/{inside}' must be plain data nested at most 256 levels deep, but "
        r"is nested deeper instead\.$",
    )


def test_a_stage_refuses_its_own_value_nested_deeper_than_the_limit_by_name(pipe, saved):
    reader = pipe.build().source
    while not hasattr(reader, "rest_of_epoch"):
        reader = reader.source
    state = functools.reduce(lambda v, k: v[k], reader_at(saved), saved)
    for levels, ok in ((MAX_DEPTH - 2, True), (100_000, False)):  # a dict, then levels + 1 lists
        edited = forged(state, (), lambda r, n=levels: r["settings"].update(seed=deep(n)))
        pattern = (
            r"^ParquetReader state doesn't match this pipeline: setting 'seed' found \[\[\[\[\[\.\.\.\]\]\]\]\] instead "
            r"of 1\.$"
            if ok
            else r"^ParquetReader state is invalid: 'settings' must be plain data nested at most 32 levels deep, but "
            r"is nested deeper instead\.$"
        )
        with pytest.raises(StateMismatchError, match=pattern):
            reader.reset(edited)


@pytest.mark.parametrize("seed", range(8))
def test_random_bytes_as_a_shuffle_segment_are_refused_as_unreadable_arrow(pipe, saved, seed):
    def edit(segment: dict) -> None:
        size = len(segment["ipc"])
        segment["ipc"] = torch.from_numpy(np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8))

    state = forged(saved, (*shuffle_at(saved), "segments", 0), edit)
    refused(
        pipe,
        state,
        r"^ShuffleBuffer state is invalid: 'segments': a saved record batch is not readable Arrow IPC \([^\n]+\)$",
    )


def text_offsets_patched(ipc: torch.Tensor, by: int) -> torch.Tensor:
    """The IPC stream with its string column's last offset moved ``by`` bytes past the data."""
    data = bytes(ipc.numpy())
    column = record_batch_from_bytes(data).column("text")
    offsets = np.frombuffer(column.buffers()[1], np.int32)[column.offset : column.offset + len(column) + 1]
    at = data.find(offsets.tobytes())
    assert at > 0 and data.find(offsets.tobytes(), at + 1) < 0, "the offsets are found once in the stream"
    patched = offsets.copy()
    patched[-1] += by
    data = data[:at] + patched.tobytes() + data[at + len(patched) * 4 :]
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def test_a_string_offset_patched_past_its_data_is_refused_without_reading_past_it(pipe, saved):
    state = forged(
        saved, (*shuffle_at(saved), "segments", 0), lambda s: s.update(ipc=text_offsets_patched(s["ipc"], LONG))
    )
    tracemalloc.start()
    try:
        refused(
            pipe,
            state,
            r"^ShuffleBuffer state is invalid: 'segments': a saved record batch is not readable Arrow IPC \(.*offset.*\)$",
        )
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 20 << 20, f"{peak >> 20} MiB"


@pytest.mark.parametrize("workers", [2, 10**9])
def test_a_layout_claiming_workers_a_state_saved_without_them_never_had_is_refused(pipe, saved, workers):
    state = forged(saved, (), lambda s: s.update(layout=[0, 1, workers]))
    pattern = (
        r"^PipelineLoader state is invalid: 'layout' says 2 worker process\(es\) a rank, but its root is no state of "
        r"them \(WorkerProcesses state doesn't match this pipeline: setting 'num_workers' found '<missing>' instead "
        r"of 2\.\)$"
        if workers == 2
        else r"^PipelineLoader state is invalid: 'layout' must be a list of 3 items, each an int from 0 to 1048576, "
        r"but is 1000000000 at index 2 instead\.$"
    )
    refused(pipe, state, pattern)


def test_a_huge_string_as_a_readers_file_is_refused_by_its_length_in_small_memory(pipe, saved):
    state = forged(saved, reader_at(saved), lambda r: r.update(file="x" * LONG))
    tracemalloc.start()
    try:
        refused(
            pipe,
            state,
            rf"^ParquetReader state is invalid: 'file' must be a str of at most 65536 characters, but is a str of "
            rf"{LONG} characters instead\.$",
        )
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 20 << 20, f"{peak >> 20} MiB"  # was: the whole string in the message, three times over


def test_a_huge_string_anywhere_is_walked_in_pieces_and_shown_short():
    value = {"file": "é" * LONG, "n": 10**5000}
    tracemalloc.start()
    try:
        sealed = checksum(value)
        shown = show(value, 80)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, f"{peak >> 20} MiB"
    assert re.fullmatch(r"[0-9a-f]{8}", sealed) and checksum(value) == sealed
    assert shown == ("{'file': '" + "é" * 80)[:77] + "..."
    assert show({"n": 10**5000}) == "{'n': an int of 16610 bits}"


def test_a_huge_token_cache_folder_in_a_state_is_shown_short(tmp_path):
    path = tmp_path / "data.parquet"
    pq.write_table(pa.table({"text": [f"row {i} " * (1 + i % 7) for i in range(300)]}), path, row_group_size=25)
    reader = pp.read_parquet(str(path), chunk_rows=16).shuffle(buffer_size=64, seed=1)
    cached = reader.tokenize(pp.examples.tokenizer(), max_length=32, cache=str(tmp_path / "cache")).batch(8).pad()
    list(cached.loader())  # fills the cache: buffered rows are then saved as references
    loader = cached.loader()
    next(iter(loader))
    state = loader.state_dict()
    references = path_to(state, lambda d: "folders" in d)
    refused(
        cached,
        forged(state, references, lambda r: r["folders"].__setitem__(0, "x" * LONG)),
        r"^ShuffleBuffer state is invalid: 'segments': token cache references name the folder 'x{116}\.\.\., which "
        r"is not a unit folder of the token cache at '[^']+' \(expected '[0-9a-f]+/' and 20 hex digits, the folders "
        r"this cache writes\); this state was not made by this pipeline\.$",
    )


def test_a_chain_of_100000_nested_states_is_refused_before_anything_walks_it(pipe, saved):
    def edit(state: dict) -> None:
        chain: dict = {"version": 1, "settings": {}}
        for _ in range(100_000):
            chain = {"version": 1, "settings": {}, "source": chain, CHECKSUM_KEY: "00000000"}
        state["source"] = chain

    refused(
        pipe,
        forged(saved, ("root",), edit),
        r"^PipelineLoader state is invalid: 'root/source/source/source/source/source/source/source/source/source/"
        r"source/source/\.\.\.' must be plain data nested at most 256 levels deep, but is nested deeper instead\.$",
    )


def test_an_elastic_resume_checks_each_readers_state_before_sharing_its_rest(pipe):
    states = []
    for rank in range(2):
        loader = pipe.loader(consumer=Consumer(rank=rank, world_size=2))
        for _, _ in zip(range(3), loader):
            pass
        states.append(loader.state_dict())
    states[0] = forged(states[0], reader_at(states[0]), lambda r: r.update(row={"x": 1}))
    refused(
        pipe,
        states,
        r"^ParquetReader state is invalid: 'row' must be an int >= 0, but is \{'x': 1\} instead\.$",
        consumer=Consumer(rank=0, world_size=3),
    )


def recursive_crc(value: Any, crc: int, top: bool = False) -> int:
    """The CRC walk states were sealed with before it became iterative (the reference for compatibility)."""
    if isinstance(value, Mapping):
        if not top and CHECKSUM_KEY in value:
            return zlib.crc32(b"C" + str(value[CHECKSUM_KEY]).encode(), crc)
        crc = zlib.crc32(b"D%d" % len(value), crc)
        for key in sorted(value, key=str):
            crc = recursive_crc(value[key], zlib.crc32(b"K" + str(key).encode(), crc))
        return crc
    if isinstance(value, (list, tuple)):
        crc = zlib.crc32(b"L%d" % len(value), crc)
        for item in value:
            crc = recursive_crc(item, crc)
        return crc
    if isinstance(value, torch.Tensor):
        return -1  # not compared: every sealed dict above a tensor is compared by its own checksum
    if value is None or isinstance(value, bool):
        return zlib.crc32(repr(value).encode(), crc)
    if isinstance(value, int):
        return zlib.crc32(b"I%d" % value, crc)
    if isinstance(value, float):
        return zlib.crc32(b"F" + repr(value).encode(), crc)
    return zlib.crc32(b"S" + value.encode("utf-8", "surrogatepass"), crc)


def test_states_sealed_before_the_walk_became_iterative_keep_their_checksums(saved):
    def sealed_dicts(value: Any) -> list[dict]:
        inner = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
        own = [value] if isinstance(value, dict) and CHECKSUM_KEY in value else []
        return own + [d for v in inner for d in sealed_dicts(v)]

    def has_tensor(value: Any) -> bool:
        if isinstance(value, torch.Tensor):
            return True
        if isinstance(value, dict):
            return CHECKSUM_KEY not in value and any(map(has_tensor, value.values()))
        return isinstance(value, list) and any(map(has_tensor, value))

    compared = 0
    for node in sealed_dicts(saved):
        own = {k: v for k, v in node.items() if k != CHECKSUM_KEY}
        assert checksum(node) == node[CHECKSUM_KEY]
        if not any(map(has_tensor, own.values())):
            assert f"{recursive_crc(own, 0, top=True):08x}" == node[CHECKSUM_KEY]
            compared += 1
    assert compared >= 6


@pytest.mark.parametrize(
    ("where", "edit", "pattern"),
    [
        (
            "steps",
            lambda s: s.update(stopped="yes"),
            r"^EqualSteps lockstep state is invalid: 'stopped' must be a bool",
        ),
        ("steps", lambda s: s.update(held={"x": 1}), r"^EqualSteps lockstep state is invalid: 'held' must be a list"),
        ("reader", lambda r: r.update(epoch="9" * 5000), r"^reader state is invalid: 'epoch' must be an int >= 0"),
    ],
)
def test_an_elastic_resume_checks_equal_steps_and_the_epoch_before_planning(pipe, where, edit, pattern):
    """The states of another layout are planned from before any stage loads them: each part is checked first."""
    states = []
    for rank in range(2):
        loader = pipe.loader(consumer=Consumer(rank=rank, world_size=2))
        for _, _ in zip(range(3), loader):
            pass
        states.append(loader.state_dict())
    path = ("root", "lockstep") if where == "steps" else reader_at(states[0])
    states[0] = forged(states[0], path, edit)
    refused(pipe, states, pattern, consumer=Consumer(rank=0, world_size=3))


@pytest.mark.parametrize("compression", ["zstd", "lz4"])
def test_a_compressed_record_batch_in_a_state_is_refused_before_it_is_inflated(compression: str) -> None:
    """12.8 kB of ZSTD-compressed IPC inflated to 760 MB before its refusal: a compressed body (which padpipe never
    writes) is refused from its metadata alone (found by review)."""
    import io

    import pyarrow as pa

    from padpipe.chunks import record_batch_from_bytes, record_batch_to_bytes

    batch = pa.record_batch({"ids": pa.array([0] * 100_000, pa.int64())})
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, batch.schema, options=pa.ipc.IpcWriteOptions(compression=compression)) as writer:
        writer.write(batch)
    assert len(sink.getvalue()) < 20_000
    with pytest.raises(
        StateMismatchError, match=r"^a saved record batch is not readable Arrow IPC \(its body is compr"
    ):
        record_batch_from_bytes(sink.getvalue())
    assert record_batch_from_bytes(record_batch_to_bytes(batch)).equals(batch)
