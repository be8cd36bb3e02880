"""split_batch and merge_batches, its inverse, for padded and packed batches as the stages make them."""

from __future__ import annotations

import torch

import padpipe as pp
from padpipe.runtime.batch_cut import merge_batches, split_batch


def same(a: dict, b: dict) -> bool:
    return set(a) == set(b) and all(
        torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k] for k in a
    )


def rows(n: int) -> list[dict]:
    return [{"text": " ".join(["word"] * (1 + i % 7)), "rid": i} for i in range(n)]


def test_merge_batches_undoes_split_batch_on_packed_batches():
    pipe = pp.from_iterable(rows(40)).tokenize(pp.examples.tokenizer(), max_length=16).pack(32, batch_size=4)
    for batch in pipe.loader():
        halves = split_batch(batch)
        if halves is not None:
            assert same(merge_batches(*halves), batch)
            joined = merge_batches(halves[0], halves[0])
            assert int(joined["cu_seq_lens_q"][-1]) == joined["input_ids"].numel()
            assert joined["seq_idx"].max() == len(joined["cu_seq_lens_q"]) - 2


def test_merge_batches_undoes_split_batch_on_padded_batches_of_one_width():
    pipe = pp.from_iterable(rows(24)).tokenize(pp.examples.tokenizer(), max_length=16).batch(6).pad(pad_to_length=16)
    for batch in pipe.loader():
        assert same(merge_batches(*split_batch(batch)), batch)


def test_merge_batches_refuses_what_would_need_padding_again():
    assert merge_batches({"x": torch.ones(2, 3)}, {"x": torch.ones(1, 4)}) is None
    assert merge_batches({"x": torch.ones(2, 3), "k": 1}, {"x": torch.ones(1, 3), "k": 2}) is None
    assert merge_batches({"x": torch.ones(2, 3)}, {"y": torch.ones(1, 3)}) is None
    assert merge_batches([1], [2]) is None
