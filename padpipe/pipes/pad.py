"""Pad-collate: a batch of token rows becomes a dict of ``[B, L]`` tensors, vectorized."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import torch
from torchdata.nodes import BaseNode

from padpipe.chunks import TokenChunk
from padpipe.errors import DataError, check_bool, check_int, one_of, positive
from padpipe.state import Child, StateSchema
from padpipe.stats import PipelineStats

_ID_DTYPES = {torch.int64: np.int64, torch.int32: np.int32}
LABELS = "labels"


def padded_length(lengths: np.ndarray, *, pad_to_multiple_of: int | None, pad_to_length: int | None) -> np.ndarray:
    """The padded length of rows (or batches) whose longest row has ``lengths`` tokens.

    With ``pad_to_length`` every value is that length; otherwise ``lengths`` rounded up to a
    multiple of ``pad_to_multiple_of`` (when set).

    Example:
        >>> padded_length(np.array([0, 5, 8, 9]), pad_to_multiple_of=8, pad_to_length=None).tolist()
        [0, 8, 8, 16]
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    if pad_to_length is not None:
        return np.full_like(lengths, pad_to_length)
    if pad_to_multiple_of is None:
        return lengths
    return -(-lengths // pad_to_multiple_of) * pad_to_multiple_of


def check_pad_options(
    *,
    pad_id: int,
    side: str,
    pad_to_multiple_of: int | None,
    pad_to_length: int | None,
    label_pad_id: int,
    dtype: torch.dtype,
) -> None:
    """Raise ``ValueError``/``TypeError`` for padding settings that cannot work.

    Example:
        >>> check_pad_options(pad_id=0, side="up", pad_to_multiple_of=None, pad_to_length=None,
        ...                   label_pad_id=-100, dtype=torch.int64)
        Traceback (most recent call last):
        ...
        ValueError: `side` must be one of ('right', 'left'), but is 'up' instead.
    """
    check_int("pad_id", pad_id)
    check_int("label_pad_id", label_pad_id)
    one_of("side", side, ("right", "left"))
    positive("pad_to_multiple_of", pad_to_multiple_of, allow_none=True)
    positive("pad_to_length", pad_to_length, allow_none=True)
    one_of("dtype", dtype, tuple(_ID_DTYPES))


class Padder(BaseNode[dict[str, Any]]):
    """Pad each token batch to ``[B, L]`` tensors: ``L`` is its longest row, rounded up.

    Output keys: ``input_ids`` (``dtype``), ``attention_mask`` (``int64``), ``token_type_ids`` when
    the chunk has type ids, and the pass-through columns: integers as ``int64``, floats as
    ``float32``, booleans as ``bool``, token-level ``labels`` lists as ``[B, L]`` ``int64`` padded
    with ``label_pad_id``, strings as lists (any other type: ``TypeError``). One masked assignment
    per array, no per-row loop.

    Args:
        source: Upstream node yielding one :class:`~padpipe.chunks.TokenChunk` per batch.
        pad_id: Id written into padding slots of ``input_ids``.
        side: ``"right"``, or ``"left"`` (real tokens end at column ``L - 1``).
        pad_to_multiple_of: Round ``L`` up to a multiple of this.
        pad_to_length: Use this fixed ``L`` for every batch; a longer row raises ``ValueError``.
        label_pad_id: Fill value for token-level labels.
        dtype: ``torch.int64`` or ``torch.int32`` for ``input_ids`` and ``token_type_ids``.
        ids_as_labels: Where the chunk has no ``labels`` column, give ``labels``: the ids, with
            ``label_pad_id`` at padding (what a causal LM trains on).
        stats: Counters to report into (batches, real and padded tokens, time under ``"pad"``).

    Example:
        >>> from torchdata.nodes import IterableWrapper
        >>> chunk = TokenChunk.from_lists([[5, 6, 7], [8]], {"labels": [1, 0]})
        >>> out = next(Padder(IterableWrapper([chunk]), pad_id=0, side="left"))
        >>> out["input_ids"].tolist(), out["attention_mask"].tolist(), out["labels"].tolist()
        ([[5, 6, 7], [0, 0, 8]], [[1, 1, 1], [0, 0, 1]], [1, 0])
    """

    STATE = StateSchema("Padder", 2, source=Child())

    def __init__(
        self,
        source: BaseNode[TokenChunk],
        *,
        pad_id: int,
        side: str = "right",
        pad_to_multiple_of: int | None = None,
        pad_to_length: int | None = None,
        label_pad_id: int = -100,
        dtype: torch.dtype = torch.int64,
        ids_as_labels: bool = False,
        stats: PipelineStats | None = None,
    ) -> None:
        super().__init__()
        check_pad_options(
            pad_id=pad_id,
            side=side,
            pad_to_multiple_of=pad_to_multiple_of,
            pad_to_length=pad_to_length,
            label_pad_id=label_pad_id,
            dtype=dtype,
        )
        check_bool("ids_as_labels", ids_as_labels)
        self.source, self.pad_id, self.side, self.label_pad_id = source, pad_id, side, label_pad_id
        self.pad_to_multiple_of, self.pad_to_length = pad_to_multiple_of, pad_to_length
        self.dtype, self.ids_as_labels = dtype, ids_as_labels
        self.stats = stats or PipelineStats()

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        super().reset(initial_state)
        self.source.reset(None if initial_state is None else self.STATE.check(initial_state, {}).source)

    def next(self) -> dict[str, Any]:
        chunk = next(self.source)
        with self.stats.timer("pad"):
            return self._collate(chunk)

    def get_state(self) -> dict[str, Any]:
        return self.STATE.make({}, source=self.source.state_dict())

    # -- collate ------------------------------------------------------------------------------------
    def _collate(self, chunk: TokenChunk) -> dict[str, Any]:
        lengths = chunk.lengths
        rows = chunk.num_rows
        longest = int(lengths.max()) if rows else 0
        if self.pad_to_length is not None and longest > self.pad_to_length:
            raise ValueError(
                f"pad: a row of {longest} tokens is longer than `pad_to_length`={self.pad_to_length}; "
                "tokenize with max_length <= pad_to_length or raise pad_to_length."
            )
        rule = {"pad_to_multiple_of": self.pad_to_multiple_of, "pad_to_length": self.pad_to_length}
        width = int(padded_length(np.array([longest]), **rule)[0])
        columns = np.arange(width, dtype=np.int64)
        if self.side == "right":
            mask = columns < lengths[:, None]
        else:
            mask = columns >= (width - lengths)[:, None]
        ids_dtype = _ID_DTYPES[self.dtype]
        out: dict[str, Any] = {
            "input_ids": torch.from_numpy(self._fill(mask, chunk.ids, self.pad_id, ids_dtype)),
            "attention_mask": torch.from_numpy(mask.astype(np.int64)),
        }
        if chunk.type_ids is not None:
            out["token_type_ids"] = torch.from_numpy(self._fill(mask, chunk.type_ids, 0, ids_dtype))
        for name, column in chunk.columns.items():
            out[name] = self._column(name, column, mask, lengths)
        if self.ids_as_labels and LABELS not in out:
            out[LABELS] = torch.from_numpy(self._fill(mask, chunk.ids, self.label_pad_id, np.int64))
        real = int(lengths.sum())
        self.stats.record_batch(rows=rows, real_tokens=real, padded_tokens=rows * width)
        return out

    @staticmethod
    def _fill(mask: np.ndarray, values: np.ndarray, fill: int, dtype: type) -> np.ndarray:
        out = np.full(mask.shape, fill, dtype=dtype)
        out[mask] = values  # row-major order of the mask matches the flat order of the rows
        return out

    def _column(self, name: str, column: pa.Array, mask: np.ndarray, lengths: np.ndarray) -> Any:
        if isinstance(column, pa.ChunkedArray):
            column = column.combine_chunks()
        kind = column.type
        if pa.types.is_string(kind) or pa.types.is_large_string(kind):
            return column.to_pylist()
        if column.null_count:
            raise DataError(f"pad: column {name!r} has {column.null_count} null values; expected a value in every row.")
        if pa.types.is_boolean(kind):
            return torch.from_numpy(column.to_numpy(zero_copy_only=False).astype(np.bool_))
        if pa.types.is_integer(kind):
            return torch.from_numpy(column.to_numpy(zero_copy_only=False).astype(np.int64))
        if pa.types.is_floating(kind):
            return torch.from_numpy(column.to_numpy(zero_copy_only=False).astype(np.float32))
        if name == LABELS and (pa.types.is_list(kind) or pa.types.is_large_list(kind)):
            return torch.from_numpy(self._token_labels(column, mask, lengths))
        raise TypeError(
            f"pad: column {name!r} has type {kind}, which pad() cannot turn into a tensor; expected integers, "
            "floats, booleans, strings, or token-level `labels` lists. Drop or convert the column before pad()."
        )

    def _token_labels(self, column: pa.Array, mask: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        counts = column.value_lengths().to_numpy(zero_copy_only=False)
        bad = np.flatnonzero(counts != lengths)
        if len(bad):
            row = int(bad[0])
            raise DataError(
                f"pad: batch row {row} has {int(counts[row])} token-level labels but {int(lengths[row])} tokens; "
                "expected one label per token."
            )
        values = column.flatten()
        if values.null_count or not (pa.types.is_integer(values.type) or pa.types.is_boolean(values.type)):
            raise DataError(f"pad: token-level labels must be non-null integers, but are {column.type} instead.")
        return self._fill(mask, values.to_numpy(zero_copy_only=False), self.label_pad_id, np.int64)
