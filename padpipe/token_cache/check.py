"""The checks a token-cache segment passes before a single id of it is used.

A segment's name holds its size and CRC-32, but both come from the file itself: anyone who can
write the cache location can publish a file that passes them. So, once per segment read
(vectorized, no Python loop over rows), its rows must also be what this tokenizer and these
tokenize options could have produced:

* Arrow's full validation passes (list offsets monotone and inside their buffers, valid UTF-8);
* the hidden columns have this cache's types; every row is ``CACHED`` or ``BAD`` (no ids);
* every id is ``>= 0`` and below the vocabulary size;
* every row has at most ``max_length`` tokens (plus one with ``append_eos``) when truncating;
* token type ids, when there are any, have the same lengths as the ids;
* positions are the segment's: increasing and inside ``[lo, hi)`` (all of them for row numbers).

A chat cache's segment (each row: a conversation's token rows, trained flags and counters) passes
:func:`padpipe.token_cache.chat_rows.chat_problem` instead of the id checks above (the position
checks apply alike).

Valid in-vocabulary ids written by someone else cannot be told from padpipe's own without a key:
a cache location must be trusted like the data itself.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from padpipe.token_cache import rows as cr
from padpipe.token_cache.chat_rows import chat_problem
from padpipe.token_cache.store import Segment
from padpipe.token_cache.walk import BYTES


@dataclass(frozen=True)
class Limits:
    """What the ids of one tokenizer and its tokenize options can be.

    Attributes:
        id_type: The Arrow type ids are kept in.
        type_ids: Whether rows carry token type ids.
        vocab_size: Every id is below it.
        max_length: Most tokens a row may have (``None``: no limit).
        chat: Whether a segment row holds a conversation's token rows, trained flags and counters
            (a chat cache; checked by :func:`padpipe.token_cache.chat_rows.chat_problem`).
    """

    id_type: pa.DataType
    type_ids: bool
    vocab_size: int
    max_length: int | None
    chat: bool = False


def segment_problem(table: pa.Table, segment: Segment, kind: str | None, limits: Limits) -> str | None:
    """What is wrong with a segment's rows, or ``None`` when they pass every check (see the module docs).

    ``kind`` is how the unit counts positions (``None``: a state's reference, any kind).

    Example:
        >>> ids = pa.array([[5, 9000]], pa.list_(pa.uint16()))
        >>> table = pa.table({cr.IDS: ids, cr.STATE: pa.array([1], pa.int8()), cr.POS: pa.array([0])})
        >>> segment_problem(table, Segment(0, 1, False, 0, 0), "rows", Limits(pa.uint16(), False, 8000, 64))
        'id 9000 is not below the vocabulary size 8000'
    """
    names = table.schema.names
    if cr.POS not in names or cr.STATE not in names or (table.num_rows and cr.IDS not in names):
        return "a hidden column is missing"
    try:
        table.validate(full=True)
    except pa.ArrowInvalid as exc:
        return f"invalid Arrow data ({exc})"
    if not table.num_rows:
        return None
    if limits.chat:
        problem = chat_problem(table.combine_chunks(), limits.id_type, limits.vocab_size, limits.max_length)
        return problem if problem is not None else _positions_problem(table, segment, kind)
    if table.schema.field(cr.IDS).type != pa.list_(limits.id_type) or (cr.TYPE_IDS in names) != limits.type_ids:
        return "the id columns are not this cache's types"
    table = table.combine_chunks()
    ids, offsets = _flat(table.column(cr.IDS).chunk(0))
    lengths = np.diff(offsets)
    state = table.column(cr.STATE).to_numpy(zero_copy_only=False)
    if not np.isin(state, (cr.CACHED, cr.BAD)).all() or (lengths[state == cr.BAD] != 0).any():
        return "a row state is not CACHED or BAD with no ids"
    if len(ids) and (int(ids.min()) < 0 or int(ids.max()) >= limits.vocab_size):
        bad = int(ids.max()) if int(ids.max()) >= limits.vocab_size else int(ids.min())
        return f"id {bad} is not below the vocabulary size {limits.vocab_size}"
    if limits.max_length is not None and len(lengths) and int(lengths.max()) > limits.max_length:
        return f"a row of {int(lengths.max())} tokens is longer than max_length {limits.max_length}"
    if limits.type_ids and not np.array_equal(np.diff(_flat(table.column(cr.TYPE_IDS).chunk(0))[1]), lengths):
        return "token type ids and ids differ in length"
    return _positions_problem(table, segment, kind)


def _positions_problem(table: pa.Table, segment: Segment, kind: str | None) -> str | None:
    positions = table.column(cr.POS).to_numpy()
    if kind in (BYTES, None):  # None: a state's reference, whatever the unit's kind
        inside = positions[0] >= segment.lo and positions[-1] < segment.hi
        return None if bool(np.all(np.diff(positions) > 0)) and inside else "positions are not the segment's"
    return None if np.array_equal(positions, np.arange(segment.lo, segment.hi)) else "positions are not the segment's"


def _flat(column: pa.ListArray) -> tuple[np.ndarray, np.ndarray]:
    """``(values, offsets)`` of a validated list array (offsets as stored, values they reach)."""
    offsets = column.offsets.to_numpy().astype(np.int64)
    values = column.values.to_numpy(zero_copy_only=False)
    return values[offsets[0] : offsets[-1]], offsets
