"""WeightedMixer: row-level weighted mixing, its stop criteria, epochs and exact resume."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

import padpipe as pp
from padpipe.graph import start_at_epoch
from padpipe.pipes.mix import WeightedMixer
from padpipe.stats import PipelineStats
from tests.contract import check_node_resume
from tests.pipes.nodes import ListNode, check_rows, token_chunks

B = 100_000  # ids of source "b" start here


def rows(base: int, n: int, size: int, *, shuffled: bool = False) -> ListNode:
    """``n`` rows with ids ``base + i`` in batches of ``size``; ``shuffled`` permutes them per epoch."""

    def epoch_items(epoch: int) -> list[pa.RecordBatch]:
        ids = np.arange(base, base + n)
        if shuffled:
            ids = np.random.default_rng(epoch).permutation(ids)
        return [pa.record_batch({"i": ids[s : s + size]}) for s in range(0, n, size)]

    return ListNode(epoch_items)


def mixer(na=2000, nb=300, *, stop="all_exhausted", weights=None, seed=0, chunk_rows=128, shuffled=False, stats=None):
    sources = {"a": rows(0, na, 7, shuffled=shuffled), "b": rows(B, nb, 50, shuffled=shuffled)}
    return WeightedMixer(
        sources, weights=weights or {"a": 0.7, "b": 0.3}, seed=seed, stop=stop, chunk_rows=chunk_rows, stats=stats
    )


def ids(node) -> np.ndarray:
    return np.concatenate([b.column("i").to_numpy() for b in node])


def test_mix_works():
    node = mixer()
    sizes = [b.num_rows for b in node]
    assert sizes[:-1] == [128] * (len(sizes) - 1) and sum(sizes) == 2300
    node.reset(None)
    got = ids(node)
    assert sorted(got.tolist()) == list(range(2000)) + list(range(B, B + 300))  # every row exactly once
    assert got[got < B].tolist() == list(range(2000))  # each source's own order is kept


def test_mix_follows_the_weights_row_by_row_whatever_the_chunk_sizes():
    got = ids(mixer(20_000, 20_000, stop="first_exhausted", chunk_rows=1000))
    share = float(np.mean(got < B))
    assert len(got) > 25_000 and abs(share - 0.7) < 0.01
    got = ids(mixer(20_000, 300, stop="cycle", weights={"a": 1, "b": 3}, chunk_rows=1000))
    assert abs(float(np.mean(got < B)) - 0.25) < 0.01


def test_mix_stops_at_the_first_exhausted_source():
    got = ids(mixer(stop="first_exhausted"))
    assert sorted(got[got >= B].tolist()) == list(range(B, B + 300))
    a = got[got < B].tolist()
    assert a == list(range(len(a))) and 300 < len(a) < 2000  # "a" was cut short where "b" ran out


def test_mix_cycles_sources_until_every_one_ran_out():
    stats = PipelineStats()
    got = ids(mixer(stop="cycle", stats=stats))
    assert got[got < B].tolist() == list(range(2000))  # "a" ran out last: the epoch ends there
    counts = np.bincount(got[got >= B] - B, minlength=300)
    assert counts.min() >= 2 and stats.snapshot().counters["mix.b.restarts"] >= 2


def test_mix_is_deterministic_per_seed_and_epoch():
    a, b = mixer(shuffled=True), mixer(shuffled=True)
    first = [ids(a) for _ in range(3) if a.reset(None) is None]
    assert all(np.array_equal(x, ids(b)) for x in first if b.reset(None) is None)
    assert not np.array_equal(first[0], first[1])
    assert not np.array_equal(ids(mixer(seed=1)), ids(mixer(seed=0)))


@pytest.mark.parametrize("stop", ["all_exhausted", "cycle"])
def test_mix_reads_the_same_epoch_when_started_there_directly(stop):
    node = mixer(stop=stop, shuffled=True)
    epochs = [ids(node) for _ in range(3) if node.reset(None) is None]
    fresh = mixer(stop=stop, shuffled=True)
    start_at_epoch(fresh, 2)
    fresh.reset(None)
    assert np.array_equal(ids(fresh), epochs[2])


def test_mix_works_with_token_chunks():
    a, b = token_chunks([3, 1, 2, 5, 4] * 4, 3), token_chunks([2, 2, 6] * 5, 4)
    for chunk in b:  # row ids 100.. for "b"
        chunk.columns["rid"] = pa.array(chunk.columns["rid"].to_numpy() + 100)
    b = [pp.TokenChunk((c.ids + 100_000).astype(np.int32), c.offsets, None, c.columns) for c in b]
    node = WeightedMixer({"a": ListNode(a), "b": ListNode(b)}, weights={"a": 1, "b": 1}, chunk_rows=8)
    out = list(node)
    rids = [r for chunk in out for r in check_rows(chunk)]
    assert sorted(rids) == list(range(20)) + list(range(100, 115))


def test_mix_raises_error_when_weights_are_bad():
    with pytest.raises(
        ValueError, match=r"^`weights\['b'\]` must be a number greater than zero, but is -0.5 instead\.$"
    ):
        mixer(weights={"a": 1.0, "b": -0.5})
    with pytest.raises(ValueError, match=r"^`weights\['a'\]` must be a number greater than zero, but is 0 instead\.$"):
        mixer(weights={"a": 0, "b": 1})
    with pytest.raises(
        ValueError,
        match=r"^`weights` must have exactly the keys \['a', 'b'\], but misses \['b'\] and has extra \['c'\] instead\.$",
    ):
        mixer(weights={"a": 1, "c": 1})
    with pytest.raises(
        ValueError,
        match=r"^`stop` must be one of \('all_exhausted', 'first_exhausted', 'cycle'\), but is 'never' instead\.$",
    ):
        mixer(stop="never")


def test_mix_raises_error_when_sources_yield_different_columns():
    other = ListNode([pa.record_batch({"j": [1, 2]})])
    node = WeightedMixer({"a": rows(0, 10, 5), "b": other}, weights={"a": 1, "b": 1}, chunk_rows=20)
    with pytest.raises(
        pp.DataError,
        match=r"^mix: pipeline 'b' yields \('records', \('j',\)\); expected \('records', \('i',\)\) as pipeline 'a' does",
    ):
        list(node)


def test_mix_raises_error_when_state_has_other_weights():
    state = mixer().state_dict()
    with pytest.raises(
        pp.StateMismatchError,
        match=r"^WeightedMixer state doesn't match this pipeline: setting 'weights' found \{'a': 0.7, 'b': 0.3\} instead of \{'a': 1.0, 'b': 1.0\}\.$",
    ):
        mixer(weights={"a": 1, "b": 1}).reset(state)


@pytest.mark.parametrize("stop", ["all_exhausted", "first_exhausted", "cycle"])
def test_mix_saves_and_restores_its_state(stop):
    check_node_resume(lambda: mixer(40, 12, stop=stop, chunk_rows=6, shuffled=True), epochs=2)
