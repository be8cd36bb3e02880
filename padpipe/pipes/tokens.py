"""The tokens stage: rows that already hold token ids (a list column) enter as tokens, not tokenized again
(:class:`TokenColumns`, stateless: resume is the upstream reader's position).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from padpipe.chunks import ID_DTYPE, TYPE_ID_DTYPE, TokenChunk
from padpipe.errors import DataError, check_int, positive
from padpipe.pipes.pieces import exclusive_cumsum
from padpipe.stats import PipelineStats
from padpipe.tokenizer.rows import LABELS, ROW_ID_COLUMNS, pass_through

logger = logging.getLogger("padpipe.tokens")

TYPE_IDS, MASK = "token_type_ids", "attention_mask"
ID_RANGE = (0, int(np.iinfo(ID_DTYPE).max))
TYPE_ID_RANGE = (0, int(np.iinfo(TYPE_ID_DTYPE).max))


def tokens_options(*, column: str, type_ids: str | None, max_length: int | None, pad_id: int | None) -> dict[str, Any]:
    """Check the tokens stage's settings and return its options.

    Example:
        >>> tokens_options(column="input_ids", type_ids=None, max_length=0, pad_id=None)
        Traceback (most recent call last):
        ...
        ValueError: `max_length` must be greater than zero, but is 0 instead.
    """
    for name, value in (("column", column), ("type_ids", type_ids)):
        if not (isinstance(value, str) or (value is None and name == "type_ids")):
            raise TypeError(f"`{name}` must be a column name, but is {value!r} instead.")
    positive("max_length", max_length, allow_none=True)
    if pad_id is not None:
        check_int("pad_id", pad_id)
    return {"column": column, "type_ids": type_ids, "max_length": max_length, "pad_id": pad_id}


class TokenColumns:
    """Turn a record batch whose ``column`` holds token ids (lists of ints) into a :class:`TokenChunk`.

    Read along with the ids, where the batch has them: ``type_ids`` (default: a ``token_type_ids``
    column), one per token; ``attention_mask``, whose 0 tokens (an earlier tokenization's padding)
    are dropped with their type ids and labels (the column itself goes: pad and pack build their
    own); ``labels`` as a list column, token-level labels kept aligned with the ids (labels of only
    0 and 1 where the ids are not are logged once: a 0/1 mask such as ``assistant_masks`` passed as
    labels would train the model to predict ids 0 and 1). Rows longer than ``max_length`` keep
    their first tokens (a trailing EOS is cut with the rest). The other columns pass through as with
    ``tokenize()``, ``label`` renamed to ``labels``. A column of the wrong type, a null, an id
    outside ``[0, 2**31 - 1]``, a type id outside ``[0, 127]`` or a list whose length differs from
    the row's ids raises :class:`~padpipe.errors.DataError` naming the column, the row and its
    ``idx``/``id``.

    Args:
        column: The list column of token ids.
        type_ids: The list column of token type ids; default: ``token_type_ids`` when present.
        max_length: Keep at most this many tokens per row; ``None`` keeps all.
        stats: Counters to report into (``tokens`` time, ``tokens.rows``, ``tokens.tokens``).

    Example:
        >>> import pyarrow as pa
        >>> batch = pa.RecordBatch.from_pylist([{"input_ids": [2, 7, 3], "label": 1}, {"input_ids": [2, 3], "label": 0}])
        >>> chunk = TokenColumns(max_length=2)(batch)
        >>> chunk.ids.tolist(), chunk.offsets.tolist(), chunk.columns["labels"].to_pylist()
        ([2, 7, 2, 3], [0, 2, 4], [1, 0])
    """  # noqa: E501

    def __init__(
        self,
        *,
        column: str = "input_ids",
        type_ids: str | None = None,
        max_length: int | None = None,
        stats: PipelineStats | None = None,
    ) -> None:
        tokens_options(column=column, type_ids=type_ids, max_length=max_length, pad_id=None)
        self.column, self.type_ids, self.max_length = column, type_ids, max_length
        self.stats = stats if stats is not None else PipelineStats()
        self._warned_mask = False  # labels that look like a 0/1 mask: logged once

    def __call__(self, batch: pa.RecordBatch) -> TokenChunk:
        """Convert one record batch (thread-safe: no state is kept between calls)."""
        with self.stats.timer("tokens"):
            if not isinstance(batch, pa.RecordBatch):
                raise TypeError(f"tokens expects a pyarrow.RecordBatch, but got {type(batch).__name__} instead.")
            names = batch.schema.names
            for name in (self.column, self.type_ids):
                if name is not None and name not in names:
                    raise DataError(
                        f"tokens: column {name!r} is not in the data; expected one of the columns {names!r}."
                    )
            ids, offsets = _list_values(batch, self.column, ID_RANGE, "token ids")
            aligned: dict[str, np.ndarray] = {}  # flat per-token arrays, kept in step with the ids
            type_column = self.type_ids or (TYPE_IDS if TYPE_IDS in names else None)
            if type_column is not None:
                aligned[type_column] = self._aligned(batch, type_column, offsets, TYPE_ID_RANGE, "token type ids")
            if LABELS in names and _is_list(batch.schema.field(LABELS).type):
                aligned[LABELS] = self._aligned(batch, LABELS, offsets, None, "token-level labels")
                if not self._warned_mask and _looks_like_a_mask(aligned[LABELS], ids):
                    self._warned_mask = True
                    logger.warning(_mask_as_labels(aligned[LABELS], ids, self.column))
            if MASK in names:
                keep = self._aligned(batch, MASK, offsets, (0, 1), "attention mask values") != 0
                if not keep.all():
                    ids, offsets, aligned = _select(keep, ids, offsets, aligned)
            if self.max_length is not None and len(ids) and int(np.diff(offsets).max()) > self.max_length:
                position = np.arange(len(ids)) - np.repeat(offsets[:-1], np.diff(offsets))
                ids, offsets, aligned = _select(position < self.max_length, ids, offsets, aligned)
            columns = pass_through(batch, tuple(c for c in (self.column, type_column, MASK) if c) + tuple(aligned))
            if LABELS in aligned:
                columns[LABELS] = pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(aligned[LABELS]))
            type_ids = aligned[type_column].astype(TYPE_ID_DTYPE) if type_column else None
            chunk = TokenChunk(ids.astype(ID_DTYPE, copy=False), offsets, type_ids, columns)
            self.stats.add("tokens.rows", chunk.num_rows)
            self.stats.add("tokens.tokens", chunk.num_tokens)
            return chunk

    def _aligned(
        self, batch: pa.RecordBatch, name: str, offsets: np.ndarray, bounds: tuple[int, int] | None, what: str
    ) -> np.ndarray:
        values, own = _list_values(batch, name, bounds, what)
        bad = np.flatnonzero(own != offsets)
        if len(bad):  # the first row whose end differs is the first whose length does
            row = int(bad[0]) - 1
            raise DataError(
                f"tokens: column {name!r} at row {row}{_where(batch, row)} has {int(own[row + 1] - own[row])} "
                f"values but {self.column!r} has {int(offsets[row + 1] - offsets[row])}; expected one per token."
            )
        return values

    def __repr__(self) -> str:
        return f"TokenColumns(column={self.column!r}, type_ids={self.type_ids!r}, max_length={self.max_length!r})"


def _looks_like_a_mask(labels: np.ndarray, ids: np.ndarray) -> bool:
    """Every label 0 or 1 while the ids are not: a 0/1 mask, not the ids to predict (nor -100)."""
    return len(labels) > 0 and labels.min() >= 0 and labels.max() <= 1 and not (ids.min() >= 0 and ids.max() <= 1)


def _mask_as_labels(labels: np.ndarray, ids: np.ndarray, column: str) -> str:
    """The warning for labels that look like a 0/1 mask, with the first values of each."""
    shown = 8
    head = [int(v) for v in labels[:shown]]
    return (
        f"tokens: column {LABELS!r} holds only 0 and 1 in this chunk (its first values {head}, where {column!r} "
        f"holds {[int(v) for v in ids[:shown]]}): it looks like a 0/1 mask (e.g. assistant_masks) passed as labels, "
        "which trains the model to predict ids 0 and 1. Token-level labels are the ids to predict, -100 where no "
        "loss is taken: labels = [id if m else -100 for id, m in zip(input_ids, mask)]. (Classes of a token "
        "classification model: ignore this; logged once.)"
    )


def _is_list(kind: pa.DataType) -> bool:
    """Any Arrow list type (list views too: a ``labels`` column not read as lists would pass as a class label)."""
    return (
        pa.types.is_list(kind)
        or pa.types.is_large_list(kind)
        or pa.types.is_fixed_size_list(kind)
        or pa.types.is_list_view(kind)
        or pa.types.is_large_list_view(kind)
    )


def _where(batch: pa.RecordBatch, row: int) -> str:
    name = next((c for c in ROW_ID_COLUMNS if c in batch.schema.names), None)
    return f" of the chunk ({name}={batch.column(name)[row].as_py()!r})" if name else " of the chunk"


def _list_values(
    batch: pa.RecordBatch, name: str, bounds: tuple[int, int] | None, what: str
) -> tuple[np.ndarray, np.ndarray]:
    """The flat values and row offsets of list column ``name``, checked: no nulls, integers within ``bounds``.

    Booleans are taken too for the attention mask only.
    """
    column = batch.column(name)
    kind = column.type
    item = kind.value_type if _is_list(kind) else None
    if item is None or not (pa.types.is_integer(item) or (name == MASK and pa.types.is_boolean(item))):
        raise DataError(f"tokens: column {name!r} has type {kind}; expected a list of integers ({what}).")
    if column.null_count:
        row = int(np.flatnonzero(pc.is_null(column).to_numpy(zero_copy_only=False))[0])
        raise DataError(f"tokens: column {name!r} at row {row}{_where(batch, row)} is None; expected a list of {what}.")
    offsets = exclusive_cumsum(pc.list_value_length(column).to_numpy(zero_copy_only=False).astype(np.int64))
    flat = pc.list_flatten(column)
    values = flat.to_numpy(zero_copy_only=False)
    position, found = None, ""
    if flat.null_count:
        position, found = int(np.flatnonzero(pc.is_null(flat).to_numpy(zero_copy_only=False))[0]), "a null"
    elif bounds is not None and len(values) and (values.min() < bounds[0] or values.max() > bounds[1]):
        position = int(np.flatnonzero((values < bounds[0]) | (values > bounds[1]))[0])
        found = str(int(values[position]))
    if position is not None:
        row = int(np.searchsorted(offsets, position, side="right")) - 1
        expected = what if bounds is None else f"{what} in [{bounds[0]}, {bounds[1]}]"
        raise DataError(f"tokens: column {name!r} at row {row}{_where(batch, row)} holds {found}; expected {expected}.")
    return values, offsets


def _select(
    keep: np.ndarray, ids: np.ndarray, offsets: np.ndarray, aligned: dict[str, np.ndarray]
) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """Keep the tokens where ``keep`` is true, in every per-token array; rows keep their order."""
    row = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
    new = exclusive_cumsum(np.bincount(row[keep], minlength=len(offsets) - 1))
    return ids[keep], new, {name: values[keep] for name, values in aligned.items()}
