"""States are plain data, loadable with ``torch.load(weights_only=True)``, and checked fully when loaded.

Covers the helper in ``padpipe/state.py`` (specs, checksum), plain-data states of every stage
(issue 7 part 5), corrupted and partial states (issue 13.5) with a property test that corrupts
random leaves, and resume across ``num_threads`` (13.11) and changed tokenize settings (13.4).
"""

from __future__ import annotations

import copy
import functools
import io
import json
import pickle
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import padpipe as pp
from padpipe.state import (
    Array,
    Int,
    ListOf,
    Rng,
    StateMismatchError,
    check_state,
    checksum,
    load_value,
    make_state,
    plain,
)
from tests.contract import normalize

WORDS = "alpha beta gamma delta the cat sat on a mat and ran far away over hills".split()
TOK = pp.examples.TOKENIZER_JSON


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> str:
    """300 texts of 1..30 words (``text``, and reversed as ``other``) with a ``rid`` column, in row groups of 25."""
    rng = np.random.default_rng(3)
    texts = [" ".join(rng.choice(WORDS, rng.integers(1, 30))) for _ in range(300)]
    path = tmp_path_factory.mktemp("state") / "data.parquet"
    table = pa.table({"text": texts, "other": [t[::-1] for t in texts], "rid": np.arange(300)})
    pq.write_table(table, path, row_group_size=25)
    return str(path)


def pipelines(path: str) -> dict[str, pp.Pipeline]:
    tok = lambda p, **kw: p.tokenize(TOK, max_length=kw.pop("max_length", 48), **kw)  # noqa: E731
    reader = pp.read_parquet(path, chunk_rows=16)
    return {
        "bucket": tok(reader.shuffle(buffer_size=64, seed=1)).bucket(max_tokens=256, buffer_size=80).pad(),
        "batch": tok(reader, num_threads=1).batch(7).pad(pad_to_multiple_of=8).prefetch(2),
        "pack": tok(reader.shuffle(buffer_size=40, seed=2)).pack(64, batch_size=2, buffer_size=16),
        "mix": pp.mix({"a": tok(reader), "b": tok(pp.read_parquet(path, chunk_rows=10))}, seed=4, chunk_rows=12)
        .bucket(batch_size=5, buffer_size=30)
        .pad(),
        "jsonl": tok(pp.read_jsonl(pp.examples.SAMPLE_JSONL, chunk_rows=32), max_length=32).batch(16).pad(),
    }


def leaves(value: Any, path: tuple = ()) -> list[tuple[tuple, Any]]:
    if isinstance(value, dict):
        return [leaf for k, v in value.items() for leaf in leaves(v, path + (k,))]
    if isinstance(value, list):
        return [leaf for i, v in enumerate(value) for leaf in leaves(v, path + (i,))]
    return [(path, value)]


def run(loader, steps: int) -> Any:
    """Take ``steps`` batches from a new epoch of ``loader``; return the iterator (the rest of that epoch)."""
    it = iter(loader)
    for _ in range(steps):
        next(it)
    return it


def rest_of_epoch(batches) -> list[Any]:
    """What is left of an epoch: of an iterator from :func:`run`, or of a loader that had a state loaded."""
    return [normalize(b) for b in batches]


# -- the helper ---------------------------------------------------------------------------------------
def test_check_state_raises_error_naming_the_stage_and_key() -> None:
    state = make_state(version=2, settings={"seed": 1}, unit=3, live=torch.arange(4))
    fields = {"unit": Int(0, 2), "live": Array(torch.int64)}
    with pytest.raises(
        StateMismatchError, match=r"^reader state is invalid: 'unit' must be an int from 0 to 2, but is 3 instead\.$"
    ):
        check_state("reader", state, version=2, settings={"seed": 1}, fields=fields)
    with pytest.raises(StateMismatchError, match=r"^reader state is invalid: key 'row' is missing\.$"):
        check_state("reader", state, version=2, settings={"seed": 1}, fields={**fields, "row": Int(0)})
    with pytest.raises(StateMismatchError, match=r"^reader state is invalid: unexpected key 'live'\.$"):
        check_state("reader", state, version=2, settings={"seed": 1}, fields={"unit": Int(0)})
    with pytest.raises(
        StateMismatchError, match=r"^reader state must be a dict saved by padpipe, but is a list instead\.$"
    ):
        check_state("reader", [1], version=2, settings={})
    with pytest.raises(
        StateMismatchError,
        match=r"^reader state is invalid: 'live' must be a 1-D int64 tensor with values from 0 to 2, but is values from 0 to 3 instead\.$",
    ):
        load_value("reader", "live", state["live"], Array(torch.int64, lo=0, hi=2))
    with pytest.raises(
        StateMismatchError,
        match=r"^r state is invalid: 'x' must be a list of 2 items, each an int >= 0, but is -1 at index 1 instead\.$",
    ):
        load_value("r", "x", [1, -1], ListOf(Int(0), length=2))
    with pytest.raises(
        StateMismatchError,
        match=r"^r state is invalid: 'rng' must be a PCG64 generator state, but is \{'a': 1\} instead\.$",
    ):
        load_value("r", "rng", {"a": 1}, Rng())


def test_check_state_raises_error_when_a_value_was_changed_in_range() -> None:
    state = make_state(version=2, settings={}, unit=1)
    edited = {**state, "unit": 2}
    assert check_state("reader", state, version=2, settings={}, fields={"unit": Int(0, 5)}) == {"unit": 1}
    with pytest.raises(
        StateMismatchError,
        match=r"^reader state is invalid: its checksum is '[0-9a-f]{8}', but its values give '[0-9a-f]{8}'; it was changed after it was saved\.$",
    ):
        check_state("reader", edited, version=2, settings={}, fields={"unit": Int(0, 5)})


def test_checksum_is_the_same_after_json_and_torch_round_trips() -> None:
    state = make_state(version=1, settings={"fields": ("a", "b"), "w": 0.1}, big=2**127, rows=[1, 2])
    assert checksum(json.loads(json.dumps(state))) == state["checksum"]
    with_tensor = make_state(version=1, settings={}, ids=torch.arange(5, dtype=torch.int32))
    buffer = io.BytesIO()
    torch.save(with_tensor, buffer)
    buffer.seek(0)
    assert checksum(torch.load(buffer, weights_only=True)) == with_tensor["checksum"]


def test_plain_raises_error_for_objects() -> None:
    assert plain({"a": (np.int64(1), np.float32(0.5))}) == {"a": [1, 0.5]}
    with pytest.raises(TypeError, match=r"^state values must be plain data, but bytes b'x' is not\.$"):
        plain({"a": b"x"})


# -- plain-data states (issue 7, part 5) --------------------------------------------------------------
@pytest.mark.slow  # seconds alone: make test runs it, test-fast leaves it out
def test_loader_state_is_plain_data_and_loads_with_weights_only(data, tmp_path) -> None:
    for name, pipe in pipelines(data).items():
        loader = pipe.loader()
        it = run(loader, 3)
        state = loader.state_dict()
        kinds = {type(v) for _, v in leaves(state)}
        assert kinds <= {str, int, float, bool, type(None), torch.Tensor}, (name, kinds)
        assert all(isinstance(k, str) for path, _ in leaves(state) for k in path if not isinstance(k, int))
        torch.save({"model": {"w": torch.ones(2)}, "loader": state}, tmp_path / f"{name}.pt")
        loaded = torch.load(tmp_path / f"{name}.pt", weights_only=True)["loader"]
        fresh = pipe.loader()
        fresh.load_state_dict(loaded)
        assert rest_of_epoch(fresh) == rest_of_epoch(it), name


def test_loader_state_without_buffers_survives_json(data) -> None:
    pipe = pp.read_parquet(data, chunk_rows=25).tokenize(TOK, max_length=16).batch(25).pad()
    loader = pipe.loader()
    it = run(loader, 4)
    text = json.dumps(loader.state_dict())
    fresh = pipe.loader()
    fresh.load_state_dict(json.loads(text))
    assert rest_of_epoch(fresh) == rest_of_epoch(it)


# -- corrupted and partial states (13.5) --------------------------------------------------------------
def reader_state(state: dict) -> dict:
    node = state["root"]
    while "unit" not in node:
        node = node["source"]
    return node


def resume(pipe: pp.Pipeline, state: dict) -> list[Any]:
    fresh = pipe.loader()
    fresh.load_state_dict(state)
    return rest_of_epoch(fresh)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda r: r.update(unit=-5),
            r"^ParquetReader state is invalid: 'unit' must be an int >= 0, but is -5 instead\.$",
        ),
        (
            lambda r: r.update(unit=10**6),
            r"^ParquetReader state is invalid: 'unit' must be an int from 0 to 12, but is 1000000 instead\.$",
        ),
        (
            lambda r: r.update(row=10**6),
            r"^ParquetReader state is invalid: 'row' must be an int from 0 to 25, but is 1000000 instead\.$",
        ),
        (
            lambda r: r.update(epoch="7"),
            r"^ParquetReader state is invalid: 'epoch' must be an int >= 0, but is '7' instead\.$",
        ),
        (lambda r: r.pop("row"), r"^ParquetReader state is invalid: key 'row' is missing\.$"),
        (lambda r: r.update(row=r["row"] - 1), r"^ParquetReader state is invalid: its checksum is"),
    ],
)
def test_resume_raises_error_when_the_reader_state_is_corrupt(data, edit, message) -> None:
    pipe = pipelines(data)["bucket"]
    loader = pipe.loader()
    run(loader, 3)
    state = copy.deepcopy(loader.state_dict())
    edit(reader_state(state))
    with pytest.raises(StateMismatchError, match=message):
        resume(pipe, state)


def test_resume_raises_error_when_a_buffer_is_cut(data) -> None:
    pipe = pipelines(data)["bucket"]
    loader = pipe.loader()
    run(loader, 3)
    state = copy.deepcopy(loader.state_dict())
    shuffle = state["root"]["source"]
    while "live" not in shuffle:  # down the chain of stages to the shuffle buffer's state
        shuffle = shuffle["source"]
    shuffle["live"] = shuffle["live"][: len(shuffle["live"]) // 2]
    with pytest.raises(StateMismatchError, match=r"^ShuffleBuffer state is invalid: its checksum is"):
        resume(pipe, state)
    del state["root"]["source"]
    with pytest.raises(StateMismatchError, match=r"^EqualSteps (lockstep )?state is invalid"):
        resume(pipe, state)


def replacements(value: Any) -> st.SearchStrategy:
    """Values to put in place of ``value``: near it, far from it, or of another type."""
    other = st.sampled_from([None, True, "x", 1.5, [], {}, -1, 10**6, torch.zeros(3, dtype=torch.int32)])
    if isinstance(value, bool):
        return st.one_of(st.just(not value), other)
    if isinstance(value, int):
        return st.one_of(st.integers(value - 3, value + 3).filter(lambda v: v != value), other)
    if isinstance(value, str):
        return st.one_of(st.just(value + "x"), st.just(value[:-1]), other)
    if isinstance(value, torch.Tensor) and value.numel():

        def bump(i: int) -> torch.Tensor:
            out = value.clone()
            out.view(-1)[i % value.numel()] += 1
            return out

        return st.one_of(
            st.integers(0, value.numel() - 1).map(bump),
            st.just(value[:-1].clone()),
            st.just(value.to(torch.float32)),
            other,
        )
    return other


class Saved:
    """A pipeline, a state saved mid-epoch and the batches that followed it (short repr for hypothesis)."""

    def __init__(self, pipe: pp.Pipeline, state: dict, expected: list[Any]) -> None:
        self.pipe, self.state, self.expected = pipe, state, expected

    def __repr__(self) -> str:
        return "Saved(bucket pipeline, state after 4 batches)"


@pytest.fixture(scope="module")
def saved(data) -> Saved:
    pipe = pipelines(data)["bucket"]
    loader = pipe.loader()
    it = run(loader, 4)
    state = pickle.loads(pickle.dumps(loader.state_dict()))
    return Saved(pipe, state, rest_of_epoch(it))


@settings(max_examples=100, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_a_corrupted_state_leaf_resumes_exactly_or_raises_state_mismatch(saved, data) -> None:
    paths = leaves(saved.state)
    path, value = paths[data.draw(st.integers(0, len(paths) - 1), label="leaf")]
    corrupted = copy.deepcopy(saved.state)
    target = corrupted
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = data.draw(replacements(value), label=f"value at {path}")
    try:
        rest = resume(saved.pipe, corrupted)
    except StateMismatchError:
        return
    assert rest == saved.expected, f"resumed silently with other batches after changing {path}"


# -- num_threads (13.11) and tokenize settings (13.4) -------------------------------------------------
def tokenized(path: str, **options: Any) -> pp.Pipeline:
    settings_ = {"max_length": 48, "num_threads": 2, **options}
    tokenizer = settings_.pop("tokenizer", TOK)
    reader = pp.read_parquet(path, chunk_rows=16).shuffle(buffer_size=64, seed=1)
    return reader.tokenize(tokenizer, **settings_).batch(8).pad()


@pytest.mark.parametrize(("saved_with", "resumed_with"), [(2, 1), (1, 2), (1, 3), (2, 4), (3, 2)])
def test_resume_is_exact_across_num_threads(data, saved_with, resumed_with) -> None:
    loader = tokenized(data, num_threads=saved_with).loader()
    it = run(loader, 5)
    state = pickle.loads(pickle.dumps(loader.state_dict()))
    assert resume(tokenized(data, num_threads=resumed_with), state) == rest_of_epoch(it)


@pytest.mark.parametrize(
    ("saved_with", "resumed_with", "message"),
    [
        ({}, {"max_length": 32}, r"setting 'max_length' found 48 instead of 32\.$"),
        (
            {"fields": ("text", "other")},
            {"fields": ("other", "text")},
            r"setting 'fields' found \['text', 'other'\] instead of \['other', 'text'\]\.$",
        ),
        ({}, {"add_special_tokens": False}, r"setting 'add_special_tokens' found True instead of False\.$"),
        ({}, {"truncation": False}, r"setting 'max_length' found 48 instead of None\.$"),
        (
            {},
            {"tokenizer": "one more token"},
            r"setting 'tokenizer' found 'vocab=8000 sha1=[0-9a-f]{16}' instead of 'vocab=8001 sha1=[0-9a-f]{16}'\.$",
        ),
    ],
)
def test_resume_raises_error_when_tokenize_settings_changed(data, saved_with, resumed_with, message) -> None:
    if resumed_with.get("tokenizer") == "one more token":
        resumed_with["tokenizer"] = pp.examples.tokenizer()
        resumed_with["tokenizer"].add_tokens(["zzzz"])
    loader = tokenized(data, **saved_with).loader()
    run(loader, 2)
    with pytest.raises(StateMismatchError, match=r"^tokenize state doesn't match this pipeline: " + message):
        resume(tokenized(data, **resumed_with), loader.state_dict())


def test_resume_raises_error_when_chunk_rows_changed(data) -> None:
    loader = tokenized(data).loader()
    run(loader, 2)
    pipe = (
        pp.read_parquet(data, chunk_rows=17).shuffle(buffer_size=64, seed=1).tokenize(TOK, max_length=48).batch(8).pad()
    )
    with pytest.raises(
        StateMismatchError,
        match=r"^ParquetReader state doesn't match this pipeline: setting 'chunk_rows' found 16 instead of 17\.$",
    ):
        resume(pipe, loader.state_dict())


def test_resume_accepts_another_on_error(data) -> None:
    loader = tokenized(data).loader()
    it = run(loader, 2)
    state = loader.state_dict()
    assert resume(tokenized(data, on_error="skip"), state) == rest_of_epoch(it)


def test_a_worker_process_loader_state_is_plain_data(data, tmp_path) -> None:
    pipe = pipelines(data)["bucket"]
    loader = pipe.loader(num_workers=2)
    it = run(loader, 3)
    state = loader.state_dict()
    assert {type(v) for _, v in leaves(state)} <= {str, int, float, bool, type(None), torch.Tensor}
    torch.save(state, tmp_path / "workers.pt")
    fresh = pipe.loader(num_workers=2)
    fresh.load_state_dict(torch.load(tmp_path / "workers.pt", weights_only=True))
    assert rest_of_epoch(fresh) == rest_of_epoch(it)


# -- hand-crafted states, checksums recomputed: refused by stage and key, never a KeyError or TypeError -------
def stage_paths(value: Any, path: tuple = ()) -> list[tuple]:
    """The paths of every stage state (a dict with a ``version``) inside a loader state."""
    found = [path] if isinstance(value, dict) and "version" in value else []
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    return found + [p for k, v in items for p in stage_paths(v, path + (k,))]


def resealed_at(state: dict, path: tuple, edit) -> dict:
    """``state`` with ``edit`` applied to the stage state at ``path``, it and every sealed state above resealed."""
    out = copy.deepcopy(state)
    edit(functools.reduce(lambda v, k: v[k], path, out))
    for n in range(len(path), -1, -1):
        node = functools.reduce(lambda v, k: v[k], path[:n], out)
        if "checksum" in node:
            node["checksum"] = checksum(node)
    return out


def first_field(stage: dict) -> str:
    return next(k for k in stage if k not in ("version", "settings", "checksum"))


EDITS = {
    "settings missing": (lambda s: s.pop("settings"), lambda s: "settings"),
    "field missing": (lambda s: s.pop(first_field(s)), first_field),
    "field renamed": (lambda s: s.update({first_field(s) + "_old": s.pop(first_field(s))}), first_field),
    "extra key": (lambda s: s.update(zzz=1), lambda s: "zzz"),
    "wrong type": (lambda s: s.update({first_field(s): 5 if isinstance(s[first_field(s)], str) else "x"}), first_field),
}


@pytest.mark.parametrize("kind", ["bucket", "pack"])
@pytest.mark.parametrize("edit", sorted(EDITS))
def test_a_resealed_hand_edited_stage_state_is_refused_naming_the_stage_and_key(data, kind, edit) -> None:
    pipe = pipelines(data)[kind]
    loader = pipe.loader()
    run(loader, 3)
    state = loader.state_dict()
    change, key_of = EDITS[edit]
    paths = stage_paths(state)
    assert len(paths) >= 6, "every stage of the graph has a state"
    for path in paths:
        stage = functools.reduce(lambda v, k: v[k], path, state)
        key = key_of(stage)
        with pytest.raises(StateMismatchError, match=rf"^\w[\w ()]* state (is invalid|doesn't match)\b.*'{key}'"):
            resume(pipe, resealed_at(state, path, change))
