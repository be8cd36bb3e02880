"""The columnar unit that flows between tokenized stages (raw stages pass ``pyarrow.RecordBatch`` objects): many
rows of token ids, stored flat. Gathering, concatenating and saving chunks are vectorized, never a loop over rows.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from padpipe.state import Spec, StateMismatchError, seal, unseal
from padpipe.state_walk import show

ID_DTYPE = np.int32
TYPE_ID_DTYPE = np.int8


def exclusive_cumsum(values: np.ndarray | Sequence[int]) -> np.ndarray:
    """``[0, v0, v0 + v1, ...]`` as ``int64`` (offsets from lengths).

    Example:
        >>> exclusive_cumsum(np.array([3, 2])).tolist()
        [0, 3, 5]
    """
    out = np.zeros(len(values) + 1, dtype=np.int64)
    np.cumsum(values, out=out[1:])
    return out


def segments(starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The flat positions of the segments ``[starts[r], starts[r] + lengths[r])`` laid end to end, and their offsets.

    Example:
        >>> index, offsets = segments(np.array([2, 0]), np.array([3, 2]))
        >>> index.tolist(), offsets.tolist()
        ([2, 3, 4, 0, 1], [0, 3, 5])
    """
    offsets = exclusive_cumsum(lengths)
    # position j of segment r is starts[r] + j
    return np.arange(int(offsets[-1]), dtype=np.int64) + np.repeat(starts - offsets[:-1], lengths), offsets


@dataclass(frozen=True)
class TokenChunk:
    """Tokenized rows: row ``i`` is ``ids[offsets[i]:offsets[i + 1]]``.

    Args:
        ids: Flat ``int32`` token ids of all rows.
        offsets: ``int64`` array of ``num_rows + 1`` offsets; ``offsets[0] == 0``.
        type_ids: Flat ``int8`` token type ids aligned with ``ids``, or ``None`` when the tokenizer
            makes none.
        columns: Pass-through columns (labels, row ids, ...), each an Arrow array of ``num_rows``.

    Example:
        >>> c = TokenChunk.from_lists([[2, 7, 3], [2, 3]])
        >>> c.num_rows, c.lengths.tolist(), c.row(0).tolist()
        (2, [3, 2], [2, 7, 3])
    """

    ids: np.ndarray
    offsets: np.ndarray
    type_ids: np.ndarray | None = None
    columns: dict[str, pa.Array] = field(default_factory=dict)

    @property
    def num_rows(self) -> int:
        """Number of rows in the chunk."""
        return len(self.offsets) - 1

    @property
    def lengths(self) -> np.ndarray:
        """Token count of every row (``int64``)."""
        return np.diff(self.offsets)

    @property
    def num_tokens(self) -> int:
        """Total number of real tokens."""
        return int(self.offsets[-1])

    def row(self, i: int) -> np.ndarray:
        """Token ids of row ``i`` (a view)."""
        return self.ids[self.offsets[i] : self.offsets[i + 1]]

    def take(self, rows: np.ndarray | Sequence[int]) -> TokenChunk:
        """Rows ``rows`` in that order, as a new chunk (vectorized gather).

        Example:
            >>> TokenChunk.from_lists([[1], [2, 2], [3, 3, 3]]).take([2, 0]).lengths.tolist()
            [3, 1]
        """
        rows = np.asarray(rows, dtype=np.int64)
        index, offsets = segments(self.offsets[rows], self.lengths[rows])
        type_ids = None if self.type_ids is None else self.type_ids[index]
        indices = pa.array(rows, type=pa.int64())
        columns = {name: col.take(indices) for name, col in self.columns.items()}
        return TokenChunk(self.ids[index], offsets, type_ids, columns)

    @staticmethod
    def concat(chunks: Sequence[TokenChunk]) -> TokenChunk:
        """Concatenate chunks row-wise; all must carry the same columns and type-id presence.

        Example:
            >>> a = TokenChunk.from_lists([[1, 2]]); b = TokenChunk.from_lists([[3]])
            >>> TokenChunk.concat([a, b]).offsets.tolist()
            [0, 2, 3]
        """
        if len(chunks) == 1:
            return chunks[0]
        if not chunks:
            return TokenChunk.empty()
        ids = np.concatenate([c.ids for c in chunks])
        offsets = exclusive_cumsum(np.concatenate([c.lengths for c in chunks]))
        has_types = chunks[0].type_ids is not None
        type_ids = np.concatenate([c.type_ids for c in chunks]) if has_types else None
        names = list(chunks[0].columns)
        columns = {n: pa.concat_arrays([_as_array(c.columns[n]) for c in chunks]) for n in names}
        return TokenChunk(ids, offsets, type_ids, columns)

    @staticmethod
    def empty() -> TokenChunk:
        """A chunk with no rows."""
        return TokenChunk(np.zeros(0, ID_DTYPE), np.zeros(1, np.int64))

    @staticmethod
    def from_lists(rows: Sequence[Sequence[int]], columns: dict[str, Any] | None = None) -> TokenChunk:
        """Build a chunk from Python lists of ids (tests and small inputs).

        Example:
            >>> TokenChunk.from_lists([[5, 6]], {"label": [1]}).columns["label"].to_pylist()
            [1]
        """
        offsets = exclusive_cumsum(np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows)))
        ids = np.fromiter((t for r in rows for t in r), dtype=ID_DTYPE, count=int(offsets[-1]))
        cols = {k: v if isinstance(v, pa.Array) else pa.array(v) for k, v in (columns or {}).items()}
        return TokenChunk(ids, offsets, None, cols)

    def to_state(self) -> dict[str, Any]:
        """A sealed, plain-data snapshot: ``torch`` tensors (ids, offsets, type ids, Arrow IPC bytes of the columns).

        ``torch.load(..., weights_only=True)`` loads it; :meth:`from_state` checks it fully.

        Example:
            >>> state = TokenChunk.from_lists([[1, 2], [3]]).to_state()
            >>> state["ids"], state["offsets"]
            (tensor([1, 2, 3], dtype=torch.int32), tensor([0, 2, 3]))
        """
        type_ids = None if self.type_ids is None else _copy(self.type_ids, TYPE_ID_DTYPE)
        columns = None if not self.columns else bytes_to_tensor(_columns_to_ipc(self.columns))
        ids, offsets = _copy(self.ids, ID_DTYPE), _copy(self.offsets, np.int64)
        return seal({"ids": ids, "offsets": offsets, "type_ids": type_ids, "columns": columns})

    @staticmethod
    def from_state(state: Any) -> TokenChunk:
        """Inverse of :meth:`to_state`; ``StateMismatchError`` saying what is wrong when ``state`` is not one.

        Example:
            >>> TokenChunk.from_state({"ids": [1]})
            Traceback (most recent call last):
            ...
            padpipe.state.StateMismatchError: expected a token chunk with keys ['columns', 'ids', 'offsets', 'type_ids'] and a checksum, found {'ids': [1]}
        """  # noqa: E501
        state = unseal("a token chunk", state, CHUNK_KEYS)
        ids = _tensor(state["ids"], torch.int32, "ids")
        offsets = _tensor(state["offsets"], torch.int64, "offsets")
        if not len(offsets) or offsets[0] != 0 or offsets[-1] != len(ids) or (np.diff(offsets) < 0).any():
            raise StateMismatchError(
                f"a token chunk's offsets must rise from 0 to its {len(ids)} ids, but are {offsets[:4].tolist()}... "
                f"instead"
            )
        type_ids = None if state["type_ids"] is None else _tensor(state["type_ids"], torch.int8, "type_ids")
        if type_ids is not None and len(type_ids) != len(ids):
            raise StateMismatchError(f"a token chunk has {len(type_ids)} type ids for {len(ids)} ids")
        columns: dict[str, pa.Array] = {}
        if state["columns"] is not None:
            batch = record_batch_from_bytes(_tensor(state["columns"], torch.uint8, "columns"))
            if batch.num_rows != len(offsets) - 1:
                raise StateMismatchError(f"a token chunk has {batch.num_rows} column rows for {len(offsets) - 1} rows")
            columns = {name: batch.column(i) for i, name in enumerate(batch.schema.names)}
        return TokenChunk(ids, offsets, type_ids, columns)


CHUNK_KEYS = ("ids", "offsets", "type_ids", "columns")
RECORDS_KEYS = ("ipc",)


def _copy(array: np.ndarray, dtype: Any) -> torch.Tensor:
    return torch.from_numpy(np.array(array, dtype=dtype, copy=True))


def _tensor(value: Any, dtype: torch.dtype, name: str) -> np.ndarray:
    if not isinstance(value, torch.Tensor) or value.dtype != dtype or value.dim() != 1:
        found = (
            f"a {value.dtype} tensor of shape {list(value.shape)}" if isinstance(value, torch.Tensor) else show(value)
        )
        raise StateMismatchError(f"a token chunk's {name!r} must be a 1-D {dtype} tensor, but is {found}")
    return _own_copy(value)


def _own_copy(value: torch.Tensor) -> np.ndarray:
    """The tensor's values in memory of their own: a view would dangle once torch moves the tensor's
    storage (``share_memory_()`` when a DataLoader worker sends the state it was loaded from)."""
    return value.detach().cpu().numpy().copy()


def bytes_to_tensor(data: bytes) -> torch.Tensor:
    """Bytes as a 1-D ``uint8`` tensor (how Arrow IPC buffers travel in plain-data states).

    Example:
        >>> bytes_to_tensor(b"ab")
        tensor([97, 98], dtype=torch.uint8)
    """
    return torch.from_numpy(np.frombuffer(data, dtype=np.uint8).copy())


def records_to_state(batch: pa.RecordBatch) -> dict[str, Any]:
    """A sealed, plain-data snapshot of a record batch (its Arrow IPC stream as a ``uint8`` tensor).

    Example:
        >>> records_from_state(records_to_state(pa.record_batch({"a": [1, 2]}))).to_pylist()
        [{'a': 1}, {'a': 2}]
    """
    return seal({"ipc": bytes_to_tensor(record_batch_to_bytes(batch))})


def records_from_state(state: Any) -> pa.RecordBatch:
    """Inverse of :func:`records_to_state`; ``StateMismatchError`` when ``state`` is not one."""
    state = unseal("a record batch", state, RECORDS_KEYS)
    value = state["ipc"]
    if not isinstance(value, torch.Tensor) or value.dtype != torch.uint8 or value.dim() != 1:
        raise StateMismatchError("a record batch's 'ipc' must be a 1-D uint8 tensor")
    return record_batch_from_bytes(_own_copy(value))


def _as_array(col: pa.Array | pa.ChunkedArray) -> pa.Array:
    return col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col


def _columns_to_ipc(columns: dict[str, pa.Array]) -> bytes:
    batch = pa.RecordBatch.from_arrays([_as_array(c) for c in columns.values()], names=list(columns))
    return record_batch_to_bytes(batch)


def record_batch_to_bytes(batch: pa.RecordBatch | pa.Table) -> bytes:
    """Serialize a record batch or table to Arrow IPC stream bytes (for state dicts)."""
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write(batch)
    return sink.getvalue()


def record_batch_from_bytes(data: bytes | np.ndarray) -> pa.RecordBatch:
    """Inverse of :func:`record_batch_to_bytes`; always one record batch (``StateMismatchError`` if unreadable)."""
    try:
        if any(_compressed(m.metadata.to_pybytes()) for m in pa.ipc.MessageReader.open_stream(pa.py_buffer(data))):
            raise ValueError("its body is compressed, which padpipe never writes (a small state could inflate to GBs)")
        table = pa.ipc.open_stream(pa.py_buffer(data)).read_all()
        table.validate(full=True)  # offsets and lengths within their buffers, before anything reads them
        if not table.num_rows:
            return pa.RecordBatch.from_pylist([], schema=table.schema)
        return table.combine_chunks().to_batches()[0]
    except (pa.ArrowException, OSError, ValueError, TypeError, struct.error, IndexError) as exc:
        raise StateMismatchError(f"a saved record batch is not readable Arrow IPC ({str(exc)[:200]})") from None


def _compressed(meta: bytes) -> bool:
    """Whether an IPC message's metadata (a flatbuffer ``Message``) declares a compressed body: its record batch
    (or dictionary batch's) ``compression`` field is set. Read by hand, as pyarrow reads a body only to inflate it."""

    def slot(table: int, index: int) -> int:  # the field's offset in its table, 0 when absent
        vtable, at = table - struct.unpack_from("<i", meta, table)[0], 4 + 2 * index
        vtable_size = struct.unpack_from("<H", meta, vtable)[0]
        return struct.unpack_from("<H", meta, vtable + at)[0] if at < vtable_size else 0

    def child(table: int, index: int) -> int | None:
        at = slot(table, index)
        return None if not at else table + at + struct.unpack_from("<I", meta, table + at)[0]

    root = struct.unpack_from("<I", meta, 0)[0]
    kind = meta[root + slot(root, 1)] if slot(root, 1) else 0  # the header union's type: 2 dictionary, 3 batch
    header = child(root, 2) if kind in (2, 3) else None
    if header is not None and kind == 2:
        header = child(header, 1)
    return header is not None and slot(header, 3) != 0


@dataclass(frozen=True)
class Chunk(Spec):
    """A sealed token-chunk buffer made by ``TokenChunk.to_state``; loads a ``TokenChunk``."""

    def load(self, value: Any) -> Any:
        return TokenChunk.from_state(value)


@dataclass(frozen=True)
class Records(Spec):
    """A sealed record-batch buffer made by ``chunks.records_to_state``; loads a ``pyarrow.RecordBatch``."""

    def load(self, value: Any) -> Any:
        return records_from_state(value)


def truncate_rows(chunk: TokenChunk, limit: int) -> TokenChunk:
    """Cut every row of ``chunk`` to at most ``limit`` tokens (and a list-valued ``labels`` column).

    Example:
        >>> truncate_rows(TokenChunk.from_lists([[1, 2, 3], [4]]), 2).ids.tolist()
        [1, 2, 4]
    """
    index, offsets = segments(chunk.offsets[:-1], np.minimum(chunk.lengths, limit))
    type_ids = None if chunk.type_ids is None else chunk.type_ids[index]
    columns = dict(chunk.columns)
    labels = columns.get("labels")
    if labels is not None and (pa.types.is_list(labels.type) or pa.types.is_large_list(labels.type)):
        columns["labels"] = pc.list_slice(labels, 0, limit)
    return TokenChunk(chunk.ids[index], offsets, type_ids, columns)
