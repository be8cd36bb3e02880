"""Bucketizer: every row once, the token budget never exceeded, padding efficiency, policies, resume."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from padpipe.chunks import TokenChunk
from padpipe.pipes.batch import FixedBatcher
from padpipe.pipes.bucket import Bucketizer
from padpipe.pipes.pad import Padder, padded_length
from padpipe.state import StateMismatchError
from padpipe.stats import PipelineStats
from tests.contract import check_node_resume
from tests.pipes.nodes import ListNode, check_rows, token_chunks

LENGTHS = [int(n) for n in np.random.default_rng(3).integers(1, 40, size=37)]


def run(chunks: list[TokenChunk], epochs: int = 1, **kwargs) -> list[list[TokenChunk]]:
    node = Bucketizer(ListNode(chunks), **kwargs)
    out = []
    for _ in range(epochs):
        node.reset(None)
        out.append(list(node))
    return out


def cost(batch: TokenChunk, multiple: int | None = None, length: int | None = None) -> int:
    longest = np.array([batch.lengths.max()])
    return batch.num_rows * int(padded_length(longest, pad_to_multiple_of=multiple, pad_to_length=length)[0])


def test_bucket_works_with_batch_size() -> None:
    (batches,) = run(token_chunks(LENGTHS, 4), batch_size=5, buffer_size=12, seed=0)
    rows = [r for b in batches for r in check_rows(b)]
    assert sorted(rows) == list(range(37))
    assert [b.num_rows for b in batches] == [5] * 7 + [2]
    assert all(np.all(np.diff(b.lengths) >= 0) for b in batches)  # sorted within a batch


def test_bucket_works_without_shuffle_in_ascending_length() -> None:
    (batches,) = run(token_chunks(LENGTHS, 4), max_tokens=64, buffer_size=100, shuffle=False)
    lengths = np.concatenate([b.lengths for b in batches])
    assert lengths.tolist() == sorted(LENGTHS)
    assert all(cost(b) <= 64 for b in batches)
    # greedy: adding the next row to any batch would break the budget
    for b, following in zip(batches, batches[1:]):
        assert (b.num_rows + 1) * int(following.lengths[0]) > 64


def test_bucket_works_across_epochs_and_seeds() -> None:
    kwargs = {"max_tokens": 80, "buffer_size": 20}
    first, second = run(token_chunks(LENGTHS, 5), epochs=2, seed=1, **kwargs)
    again = run(token_chunks(LENGTHS, 5), epochs=2, seed=1, **kwargs)
    other = run(token_chunks(LENGTHS, 5), seed=2, **kwargs)[0]

    def order(batches: list[TokenChunk]) -> list[int]:
        return [r for b in batches for r in check_rows(b)]

    assert sorted(order(first)) == sorted(order(second)) == list(range(37))
    assert order(first) != order(second)
    assert [order(first), order(second)] == [order(e) for e in again]
    assert order(other) != order(first)


@settings(max_examples=50, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 300), min_size=1, max_size=120),
    max_tokens=st.integers(40, 400),
    multiple=st.sampled_from([None, 1, 8, 32]),
    buffer_size=st.integers(1, 60),
    chunk_rows=st.integers(1, 30),
    shuffle=st.booleans(),
)
def test_bucket_works_without_ever_exceeding_max_tokens(
    lengths: list[int], max_tokens: int, multiple: int | None, buffer_size: int, chunk_rows: int, shuffle: bool
) -> None:
    stats = PipelineStats()
    (batches,) = run(
        token_chunks(lengths, chunk_rows),
        max_tokens=max_tokens,
        buffer_size=buffer_size,
        shuffle=shuffle,
        on_oversize="truncate",
        pad_to_multiple_of=multiple,
        stats=stats,
    )
    assert all(cost(b, multiple) <= max_tokens for b in batches)
    rows = [r for b in batches for r in check_rows(b)]  # truncated rows keep their first tokens
    assert sorted(rows) == list(range(len(lengths)))
    limit = max_tokens // (multiple or 1) * (multiple or 1)
    assert stats.snapshot().counters.get("bucket.truncated", 0) == sum(n > limit for n in lengths)
    out_lengths = {r: n for b in batches for r, n in zip(check_rows(b), b.lengths.tolist())}
    assert [out_lengths[r] for r in range(len(lengths))] == [min(n, limit) for n in lengths]


def test_bucket_works_with_pad_to_length() -> None:
    (batches,) = run(token_chunks(LENGTHS, 6), max_tokens=100, pad_to_length=40, on_oversize="raise")
    assert sorted(b.num_rows for b in batches) == [1] + [2] * 18
    assert all(cost(b, length=40) <= 100 for b in batches)


def padding_efficiency(node) -> float:
    stats = PipelineStats()
    padder = Padder(node, pad_id=0, stats=stats)
    padder.reset(None)
    for _ in padder:
        pass
    return stats.snapshot().padding_efficiency


def test_bucket_works_far_better_than_random_batches_on_long_tail_lengths() -> None:
    rng = np.random.default_rng(0)
    lengths = np.minimum(rng.lognormal(3.5, 0.6, size=8000).astype(np.int64) + 1, 512)
    long_rows = rng.random(8000) < 0.05
    lengths[long_rows] = rng.integers(300, 513, size=int(long_rows.sum()))
    chunks = token_chunks(lengths, 500)
    bucketed = padding_efficiency(Bucketizer(ListNode(chunks), batch_size=32, buffer_size=2000, seed=0))
    random = padding_efficiency(FixedBatcher(ListNode(chunks), batch_size=32))
    print(f"padding efficiency: bucketed {bucketed:.3f}, random batches {random:.3f}")
    assert bucketed > 0.9 and random < 0.6


def test_bucket_works_with_on_oversize_drop() -> None:
    stats = PipelineStats()
    (batches,) = run(
        token_chunks([5, 30, 9, 31, 2], 2), max_tokens=30, pad_to_multiple_of=8, on_oversize="drop", stats=stats
    )
    assert sorted(r for b in batches for r in check_rows(b)) == [0, 2, 4]
    assert stats.snapshot().skipped == {"bucket.oversize": 2}


def test_bucket_works_with_on_oversize_truncate_and_token_labels() -> None:
    stats = PipelineStats()
    chunk = TokenChunk.from_lists([[1, 2, 3, 4, 5], [6]], {"labels": pa.array([[1, 2, 3, 4, 5], [6]])})
    (batches,) = run([chunk], max_tokens=4, on_oversize="truncate", shuffle=False, stats=stats)
    assert [b.ids.tolist() for b in batches] == [[6], [1, 2, 3, 4]]
    assert [b.columns["labels"].to_pylist() for b in batches] == [[[6]], [[1, 2, 3, 4]]]
    assert stats.snapshot().counters == {"bucket.truncated": 1}


def test_bucket_raises_error_when_a_row_is_longer_than_max_tokens() -> None:
    message = (
        r"^bucket: a row of 31 tokens does not fit `max_tokens`=30: rows may have at most 24 tokens "
        r"\(after padding rules\)\. Tokenize with max_length=24 or less, or pass on_oversize='drop' or 'truncate' "
        r"to bucket\(\)\.$"
    )
    with pytest.raises(ValueError, match=message):
        run(token_chunks([5, 30, 9, 31, 2], 5), max_tokens=30, pad_to_multiple_of=8)


def test_bucket_works_with_drop_last() -> None:
    stats = PipelineStats()
    (batches,) = run(token_chunks(LENGTHS, 4), batch_size=5, buffer_size=12, drop_last=True, stats=stats)
    assert [b.num_rows for b in batches] == [5] * 7
    assert len({r for b in batches for r in check_rows(b)}) == 35
    assert stats.snapshot().skipped == {"bucket.drop_last": 2}


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({}, ValueError, r"^Pass exactly one of `batch_size` or `max_tokens` to bucket\(\)\.$"),
        ({"batch_size": 2, "max_tokens": 8}, ValueError, r"^Pass exactly one of `batch_size` or `max_tokens`"),
        ({"batch_size": 0}, ValueError, r"^`batch_size` must be greater than zero, but is 0 instead\.$"),
        ({"batch_size": 2, "buffer_size": -1}, ValueError, r"^`buffer_size` must be greater than zero"),
        ({"max_tokens": 8, "drop_last": True}, ValueError, r"^`drop_last` needs `batch_size`: with `max_tokens`"),
        ({"batch_size": 2, "shuffle": None}, TypeError, r"^`shuffle` must be a bool, but is None instead\.$"),
        ({"batch_size": 2, "seed": -3}, ValueError, r"^`seed` must be a non-negative int, but is -3 instead\.$"),
        (
            {"batch_size": 2, "on_oversize": "skip"},
            ValueError,
            r"^`on_oversize` must be one of \('raise', 'drop', 'truncate'\)",
        ),
        (
            {"max_tokens": 4, "pad_to_multiple_of": 8},
            ValueError,
            r"^`max_tokens` must be at least `pad_to_multiple_of`=8 \(the shortest padded row\), but is 4 instead\.$",
        ),
        (
            {"max_tokens": 64, "pad_to_length": 128},
            ValueError,
            r"^`max_tokens` must be at least `pad_to_length`=128 \(every row is padded to it\), but is 64 instead\.$",
        ),
    ],
)
def test_bucket_raises_error_when_an_argument_is_bad(kwargs: dict, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        Bucketizer(ListNode([]), **kwargs)


def test_bucket_raises_error_when_the_state_has_another_batch_policy() -> None:
    state = Bucketizer(ListNode(token_chunks(LENGTHS, 4)), max_tokens=64).state_dict()
    with pytest.raises(
        StateMismatchError,
        match=r"^Bucketizer state doesn't match this pipeline: setting 'max_tokens' found 64 instead of 128\.$",
    ):
        Bucketizer(ListNode(token_chunks(LENGTHS, 4)), max_tokens=128).reset(state)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"batch_size": 5, "buffer_size": 10},
        {"batch_size": 5, "buffer_size": 7, "drop_last": True, "shuffle": False},
        {"max_tokens": 60, "buffer_size": 9, "pad_to_multiple_of": 4},
        {"max_tokens": 50, "buffer_size": 100, "shuffle": False, "on_oversize": "drop"},
    ],
)
def test_bucket_saves_and_restores_its_state(kwargs: dict) -> None:
    items = check_node_resume(lambda: Bucketizer(ListNode(token_chunks(LENGTHS, 4)), seed=11, **kwargs))
    for epoch in items:
        rows = [r for _, _, _, cols in epoch for r in cols["rid"]]
        assert len(rows) == len(set(rows))
        assert len(rows) == (35 if kwargs.get("drop_last") else 37)
