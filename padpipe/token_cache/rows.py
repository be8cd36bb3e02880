"""The rows a cached pipeline passes from its reader to ``tokenize``: source columns plus hidden token columns.

The reader emits every row with the hidden columns, text or cached, so the stages between see one schema:

* ``__padpipe_ids`` (list of the cache's id type): a cached row's ids, null for a text row; and
  ``__padpipe_type_ids`` (list of int8, for tokenizers that make them) likewise. With a chat cache,
  ``__padpipe_ids`` holds the token rows a conversation became (a list of lists), ``__padpipe_trained``
  whether each token is trained, ``__padpipe_counts`` its counters (:mod:`padpipe.token_cache.chat_rows`);
* ``__padpipe_state`` (int8): :data:`TEXT` (tokenize it), :data:`CACHED`, or :data:`BAD` (its text was bad:
  dropped and counted as ``tokenize.bad_text``, as when it was tokenized);
* ``__padpipe_ref`` (int64): ``unit << 40 | position`` (the session's unit number; a row number or JSONL byte
  offset), ``-1`` when it cannot be cached; kept on tokenize's chunks, so a bucketizer's state can name rows.

A segment file holds the same columns, with ``__padpipe_pos`` (the position) in place of the reference and
the text columns as nulls.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from padpipe.buffers import REF
from padpipe.chunks import ID_DTYPE, TYPE_ID_DTYPE, TokenChunk, exclusive_cumsum
from padpipe.readers.jsonl import JsonlReader

IDS, TYPE_IDS, STATE = "__padpipe_ids", "__padpipe_type_ids", "__padpipe_state"
TRAINED, COUNTS = "__padpipe_trained", "__padpipe_counts"
COUNTS_TYPE = pa.map_(pa.string(), pa.int64())
POS = JsonlReader.POSITION_COLUMN
HIDDEN = (IDS, TYPE_IDS, TRAINED, COUNTS, STATE, REF, POS)
TEXT, CACHED, BAD = 0, 1, 2
UNIT_SHIFT = 40
POSITION_MASK = (1 << UNIT_SHIFT) - 1


def ids_type(vocab_size: int) -> pa.DataType:
    """The smallest integer type every id of a ``vocab_size`` vocabulary fits.

    Example:
        >>> ids_type(30_522), ids_type(200), ids_type(128_256)
        (DataType(uint16), DataType(uint8), DataType(int32))
    """
    if vocab_size <= 1 << 8:
        return pa.uint8()
    return pa.uint16() if vocab_size <= 1 << 16 else pa.int32()


def hidden_types(id_type: pa.DataType, *, type_ids: bool, chat: bool) -> dict[str, pa.DataType]:
    """The hidden token columns a cache's rows carry (null on a row still to tokenize), by name.

    Example:
        >>> list(hidden_types(pa.uint16(), type_ids=True, chat=False).values())
        [ListType(list<item: uint16>), ListType(list<item: int8>)]
        >>> [str(t) for t in hidden_types(pa.uint16(), type_ids=False, chat=True).values()]
        ['list<item: list<item: uint16>>', 'list<item: list<item: bool>>', 'map<string, int64>']
    """
    if chat:
        return {IDS: pa.list_(pa.list_(id_type)), TRAINED: pa.list_(pa.list_(pa.bool_())), COUNTS: COUNTS_TYPE}
    return {IDS: pa.list_(id_type), **({TYPE_IDS: pa.list_(pa.int8())} if type_ids else {})}


def refs(unit: int, positions: np.ndarray) -> pa.Array:
    """References ``unit << 40 | position``; ``unit < 0`` (or a position ``< 0``) gives ``-1`` (not cacheable)."""
    positions = np.asarray(positions, np.int64)
    if unit < 0:
        return pa.array(np.full(len(positions), -1, np.int64))
    return pa.array(np.where(positions < 0, -1, (np.int64(unit) << UNIT_SHIFT) | positions))


def split_refs(ref: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(units, positions)`` of references (``-1`` for both where a row has none).

    Example:
        >>> [a.tolist() for a in split_refs(np.array([(3 << 40) | 17, -1]))]
        [[3, -1], [17, -1]]
    """
    ref = np.asarray(ref, np.int64)
    none = ref < 0
    return np.where(none, -1, ref >> UNIT_SHIFT), np.where(none, -1, ref & POSITION_MASK)


def as_text_rows(batch: pa.RecordBatch, ref: pa.Array, hidden: dict[str, pa.DataType]) -> pa.RecordBatch:
    """A source batch as rows still to tokenize: null ``hidden`` columns, state :data:`TEXT`, references ``ref``."""
    n = batch.num_rows
    if POS in batch.schema.names:
        batch = batch.drop_columns([POS])
    columns = {name: pa.nulls(n, kind) for name, kind in hidden.items()}
    columns[STATE] = pa.array(np.zeros(n, np.int8))
    columns[REF] = ref
    for name, column in columns.items():
        batch = batch.append_column(name, column)
    return batch


def as_cached_rows(table: pa.Table | pa.RecordBatch, unit: int) -> pa.RecordBatch:
    """Rows of a segment file as reader rows: the position column becomes a reference into ``unit``."""
    if isinstance(table, pa.Table):
        batches = table.combine_chunks().to_batches()
        batch = batches[0] if batches else pa.RecordBatch.from_pylist([], schema=table.schema)
    else:
        batch = table
    positions = batch.column(POS).to_numpy()
    return batch.drop_columns([POS]).append_column(REF, refs(unit, positions))


def lists(values: np.ndarray, offsets: np.ndarray, value_type: pa.DataType) -> pa.Array:
    """Flat values split at ``offsets`` as an Arrow list array of ``value_type``."""
    flat = pa.array(np.asarray(values).astype(value_type.to_pandas_dtype(), copy=False), value_type)
    return pa.ListArray.from_arrays(pa.array(np.asarray(offsets, np.int32)), flat)


def flat(column: pa.Array, dtype: type) -> tuple[np.ndarray, np.ndarray]:
    """``(values, offsets)`` of a non-null list array, offsets from 0, values as ``dtype``."""
    column = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    offsets = column.offsets.to_numpy().astype(np.int64)
    values = column.values.to_numpy(zero_copy_only=False)[offsets[0] : offsets[-1]]
    return values.astype(dtype), offsets - offsets[0]


def chunk_of(rows: pa.RecordBatch, columns: dict[str, pa.Array]) -> TokenChunk:
    """The cached rows ``rows`` (every state :data:`CACHED`) as a token chunk with ``columns``."""
    ids, offsets = flat(rows.column(IDS), ID_DTYPE)
    type_ids = None
    if TYPE_IDS in rows.schema.names:
        type_ids = flat(rows.column(TYPE_IDS), TYPE_ID_DTYPE)[0]
    return TokenChunk(ids, offsets, type_ids, columns)


def segment_rows(
    rows: pa.RecordBatch, chunk: TokenChunk, fields: Sequence[str], id_type: pa.DataType, good: np.ndarray
) -> pa.RecordBatch:
    """What a segment file stores for freshly tokenized ``rows``: text nulled, ids, state, position.

    ``good`` marks the rows ``chunk`` holds (in order); the others had bad text and are stored
    as :data:`BAD` with no ids.
    """
    lengths = np.zeros(rows.num_rows, np.int64)
    lengths[good] = chunk.lengths
    offsets = exclusive_cumsum(lengths)
    columns = {IDS: lists(chunk.ids, offsets, id_type)}
    if chunk.type_ids is not None:
        columns[TYPE_IDS] = lists(chunk.type_ids, offsets, pa.int8())
    return segment_of(rows, fields, columns, np.where(good, CACHED, BAD))


def segment_of(
    rows: pa.RecordBatch, fields: Sequence[str], columns: dict[str, pa.Array], state: np.ndarray
) -> pa.RecordBatch:
    """Reader ``rows`` as a segment file stores them: ``fields`` nulled, the hidden ``columns``, the rows' ``state``
    and their positions (from their references)."""
    n = rows.num_rows
    out = without_hidden(rows)
    for name in fields:
        i = out.schema.get_field_index(name)
        if i >= 0:
            out = out.set_column(i, out.schema.field(i), pa.nulls(n, out.schema.field(i).type))
    for name, column in {**columns, STATE: pa.array(state.astype(np.int8))}.items():
        out = out.append_column(name, column)
    return out.append_column(POS, pa.array(split_refs(rows.column(REF).to_numpy())[1]))


def without_hidden(batch: pa.RecordBatch) -> pa.RecordBatch:
    """``batch`` without the hidden columns."""
    return batch.drop_columns([c for c in HIDDEN if c in batch.schema.names])


def state_of(batch: pa.RecordBatch) -> np.ndarray:
    """The rows' states (:data:`TEXT`, :data:`CACHED`, :data:`BAD`)."""
    return pc.fill_null(batch.column(STATE), TEXT).to_numpy(zero_copy_only=False)
