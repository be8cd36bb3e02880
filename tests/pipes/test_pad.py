"""Padder: exact padded layouts (right/left, multiples, static), pass-through columns, stats, resume."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import torch
from torch.nn.utils.rnn import pad_sequence

from padpipe.chunks import TokenChunk
from padpipe.errors import DataError
from padpipe.pipes.pad import Padder, padded_length
from padpipe.stats import PipelineStats
from tests.contract import check_node_resume
from tests.pipes.nodes import ListNode, token_chunks

PAD = 0


def collate(chunk: TokenChunk, **kwargs) -> dict:
    kwargs.setdefault("pad_id", PAD)
    node = Padder(ListNode([chunk]), **kwargs)
    node.reset(None)
    return next(node)


def reference(chunk: TokenChunk, width: int, side: str) -> torch.Tensor:
    """Padding done one row at a time with torch's own helper."""
    rows = [torch.tensor(chunk.row(i).tolist()) for i in range(chunk.num_rows)]
    if side == "left":
        rows = [r.flip(0) for r in rows]
    out = pad_sequence(rows, batch_first=True, padding_value=PAD)
    out = torch.nn.functional.pad(out, (0, width - out.shape[1]), value=PAD)
    return out.flip(1) if side == "left" else out


def test_pad_works() -> None:
    chunk = TokenChunk.from_lists([[5, 6, 7], [8], [9, 10]])
    out = collate(chunk)
    assert out["input_ids"].tolist() == [[5, 6, 7], [8, 0, 0], [9, 10, 0]]
    assert out["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0], [1, 1, 0]]
    assert out["input_ids"].dtype == torch.int64 and out["attention_mask"].dtype == torch.int64
    assert sorted(out) == ["attention_mask", "input_ids"]


def test_pad_works_on_the_left() -> None:
    out = collate(TokenChunk.from_lists([[5, 6, 7], [8], [9, 10]]), side="left", pad_to_multiple_of=4)
    assert out["input_ids"].tolist() == [[0, 5, 6, 7], [0, 0, 0, 8], [0, 0, 9, 10]]
    assert out["attention_mask"].tolist() == [[0, 1, 1, 1], [0, 0, 0, 1], [0, 0, 1, 1]]


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("multiple", [None, 1, 8, 64])
def test_pad_works_like_padding_each_row(side: str, multiple: int | None) -> None:
    lengths = np.random.default_rng(0).integers(1, 50, size=33)
    chunk = TokenChunk.concat(token_chunks(lengths, 10, type_ids=True))
    out = collate(chunk, side=side, pad_to_multiple_of=multiple)
    width = -(-int(lengths.max()) // (multiple or 1)) * (multiple or 1)
    assert out["input_ids"].shape == (33, width)
    assert torch.equal(out["input_ids"], reference(chunk, width, side))
    assert out["attention_mask"].sum(1).tolist() == lengths.tolist()
    types = TokenChunk(chunk.type_ids.astype(np.int32), chunk.offsets)
    assert torch.equal(out["token_type_ids"], reference(types, width, side))
    assert out["rid"].tolist() == list(range(33))


def test_pad_works_with_pad_to_length_and_int32() -> None:
    out = collate(
        TokenChunk.from_lists([[5, 6], [7]]), pad_to_length=5, pad_to_multiple_of=4, dtype=torch.int32, pad_id=1
    )
    assert out["input_ids"].tolist() == [[5, 6, 1, 1, 1], [7, 1, 1, 1, 1]]
    assert out["input_ids"].dtype == torch.int32 and out["attention_mask"].dtype == torch.int64


def test_pad_works_on_pass_through_columns() -> None:
    columns = {
        "labels": pa.array([[1, 2, 3], [4]]),
        "idx": pa.array([7, 8], pa.int32()),
        "score": pa.array([0.5, 1.5]),
        "flag": pa.array([True, False]),
        "name": pa.array(["a", "b"]),
    }
    out = collate(TokenChunk.from_lists([[5, 6, 7], [8]], columns), side="left", label_pad_id=-100)
    assert out["labels"].tolist() == [[1, 2, 3], [-100, -100, 4]] and out["labels"].dtype == torch.int64
    assert out["idx"].tolist() == [7, 8] and out["idx"].dtype == torch.int64
    assert out["score"].tolist() == [0.5, 1.5] and out["score"].dtype == torch.float32
    assert out["flag"].tolist() == [True, False] and out["flag"].dtype == torch.bool
    assert out["name"] == ["a", "b"]
    right = collate(TokenChunk.from_lists([[5, 6, 7], [8]], {"labels": pa.array([[1, 2, 3], [4]])}))
    assert right["labels"].tolist() == [[1, 2, 3], [4, -100, -100]]


def test_pad_works_on_sliced_label_lists() -> None:
    chunk = TokenChunk.from_lists([[1, 2], [3], [4, 5, 6]], {"labels": pa.array([[1, 2], [3], [4, 5, 6]])}).take([2, 1])
    assert collate(chunk)["labels"].tolist() == [[4, 5, 6], [3, -100, -100]]


def test_pad_works_and_records_stats() -> None:
    stats = PipelineStats()
    collate(TokenChunk.from_lists([[1, 2, 3], [4]]), pad_to_multiple_of=8, stats=stats)
    snap = stats.snapshot()
    assert (snap.rows, snap.batches, snap.real_tokens, snap.padded_tokens) == (2, 1, 4, 16)
    assert snap.padding_efficiency == 0.25 and "pad" in snap.seconds


def test_padded_length_works() -> None:
    assert padded_length(np.array([0, 1, 8, 9]), pad_to_multiple_of=8, pad_to_length=None).tolist() == [0, 8, 8, 16]
    assert padded_length(np.array([3, 9]), pad_to_multiple_of=None, pad_to_length=12).tolist() == [12, 12]
    assert padded_length(np.array([3, 9]), pad_to_multiple_of=None, pad_to_length=None).tolist() == [3, 9]


def test_pad_raises_error_when_a_row_is_longer_than_pad_to_length() -> None:
    with pytest.raises(ValueError, match=r"^pad: a row of 3 tokens is longer than `pad_to_length`=2; tokenize with"):
        collate(TokenChunk.from_lists([[1, 2, 3]]), pad_to_length=2)


def test_pad_raises_error_when_a_column_has_an_unsupported_type() -> None:
    chunk = TokenChunk.from_lists([[1]], {"meta": pa.array([{"a": 1}])})
    with pytest.raises(TypeError, match=r"^pad: column 'meta' has type struct<a: int64>, which pad\(\) cannot"):
        collate(chunk)
    with pytest.raises(TypeError, match=r"^pad: column 'spans' has type list<item: int64>"):
        collate(TokenChunk.from_lists([[1]], {"spans": pa.array([[1]])}))


def test_pad_raises_error_when_labels_do_not_match_the_tokens() -> None:
    chunk = TokenChunk.from_lists([[1, 2], [3]], {"labels": pa.array([[1, 2], [3, 4]])})
    with pytest.raises(DataError, match=r"^pad: batch row 1 has 2 token-level labels but 1 tokens; expected one"):
        collate(chunk)


def test_pad_raises_error_when_a_column_has_nulls() -> None:
    with pytest.raises(DataError, match=r"^pad: column 'idx' has 1 null values; expected a value in every row\.$"):
        collate(TokenChunk.from_lists([[1], [2]], {"idx": pa.array([1, None])}))


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"pad_id": None}, TypeError, r"^`pad_id` must be an int, but is None instead\.$"),
        (
            {"pad_id": 0, "side": "up"},
            ValueError,
            r"^`side` must be one of \('right', 'left'\), but is 'up' instead\.$",
        ),
        ({"pad_id": 0, "pad_to_multiple_of": 0}, ValueError, r"^`pad_to_multiple_of` must be greater than zero"),
        ({"pad_id": 0, "pad_to_length": -1}, ValueError, r"^`pad_to_length` must be greater than zero"),
        ({"pad_id": 0, "label_pad_id": 1.5}, TypeError, r"^`label_pad_id` must be an int, but is 1\.5 instead\.$"),
        ({"pad_id": 0, "dtype": torch.float32}, ValueError, r"^`dtype` must be one of \(torch\.int64, torch\.int32\)"),
    ],
)
def test_pad_raises_error_when_an_argument_is_bad(kwargs: dict, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        Padder(ListNode([]), **kwargs)


def test_pad_saves_and_restores_its_state() -> None:
    chunks = token_chunks([3, 1, 4, 1, 5, 9, 2, 6, 5], 2, type_ids=True)
    items = check_node_resume(lambda: Padder(ListNode(chunks), pad_id=PAD, side="left", pad_to_multiple_of=4))
    assert len(items[0]) == 5 and items[0] == items[1]
