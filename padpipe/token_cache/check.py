"""The checks a token-cache segment passes before a single id of it is used.

A segment's size and CRC-32 come from the file itself, so once per segment read (vectorized) its rows must also
be what this tokenizer and these options could have produced:

* Arrow's full validation passes (list offsets monotone and inside their buffers, valid UTF-8);
* the hidden columns have this cache's types; every row is ``CACHED``, or (``tokenize``) ``BAD`` with no ids;
* every id is ``>= 0`` and below the vocabulary size; no row has more than ``max_length`` tokens;
* ``tokenize``: token type ids, where there are any, have the ids' lengths;
* ``chat``: the trained flags have the ids' shape, every token row has a trained token (``.chat()`` drops
  the others), every counter is a ``chat.`` one (or ``skip.chat.``) counted 1 to :data:`MOST_COUNTED` times;
* positions are the segment's: increasing and inside ``[lo, hi)`` (all of them for row numbers).

What no check can catch is in docs/cache.md ("Trust").
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from padpipe.chat.labels import row_sums
from padpipe.chat.outcome import SKIP
from padpipe.chunks import exclusive_cumsum
from padpipe.token_cache import rows as cr
from padpipe.token_cache.plan import CachePlan
from padpipe.token_cache.store import Segment
from padpipe.token_cache.walk import BYTES

MOST_COUNTED = 1 << 20
"""No conversation adds more than this to one counter (a stored count above it is a crafted file)."""


def segment_problem(table: pa.Table, segment: Segment, kind: str | None, plan: CachePlan) -> str | None:
    """What is wrong with a segment's rows, or ``None`` when they pass every check (see the module docs).

    ``kind`` is how the unit counts positions (``None``: a state's reference, any kind).

    Example:
        >>> ids = pa.array([[5, 9000]], pa.list_(pa.uint16()))
        >>> table = pa.table({cr.IDS: ids, cr.STATE: pa.array([1], pa.int8()), cr.POS: pa.array([0])})
        >>> plan = CachePlan(None, "raise", {}, vocab_size=8000, max_length=64, fields=("text",))
        >>> segment_problem(table, Segment(0, 1, False, 0, 0), "rows", plan)
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
    table = table.combine_chunks()
    problem = _chat_problem(table, plan) if plan.chat else _tokens_problem(table, plan)
    if problem is not None:
        return problem
    positions = table.column(cr.POS).to_numpy()
    if kind in (BYTES, None):  # None: a state's reference, whatever the unit's kind
        inside = positions[0] >= segment.lo and positions[-1] < segment.hi
        return None if bool(np.all(np.diff(positions) > 0)) and inside else "positions are not the segment's"
    return None if np.array_equal(positions, np.arange(segment.lo, segment.hi)) else "positions are not the segment's"


def _tokens_problem(table: pa.Table, plan: CachePlan) -> str | None:
    """The checks of a ``tokenize`` cache's rows: ids, their lengths, row states and type ids."""
    names = table.schema.names
    if table.schema.field(cr.IDS).type != pa.list_(plan.id_type) or (cr.TYPE_IDS in names) != plan.type_ids:
        return "the id columns are not this cache's types"
    ids, offsets = cr.flat(table.column(cr.IDS).chunk(0), np.int64)
    lengths = np.diff(offsets)
    state = table.column(cr.STATE).to_numpy(zero_copy_only=False)
    if not np.isin(state, (cr.CACHED, cr.BAD)).all() or (lengths[state == cr.BAD] != 0).any():
        return "a row state is not CACHED or BAD with no ids"
    if plan.type_ids and not np.array_equal(np.diff(cr.flat(table.column(cr.TYPE_IDS).chunk(0), np.int8)[1]), lengths):
        return "token type ids and ids differ in length"
    return _ids_problem(ids, lengths, plan)


def _chat_problem(table: pa.Table, plan: CachePlan) -> str | None:
    """The checks of a ``chat`` cache's rows: each a conversation's token rows, trained flags and counters."""
    names, types = table.schema.names, cr.hidden_types(plan.id_type, type_ids=False, chat=True)
    if any(name not in names or table.schema.field(name).type != kind for name, kind in types.items()):
        return "the chat columns are missing or not this cache's types"
    if not (table.column(cr.STATE).to_numpy(zero_copy_only=False) == cr.CACHED).all():
        return "a row state is not CACHED"
    ids, trained = table.column(cr.IDS).chunk(0), table.column(cr.TRAINED).chunk(0)
    if (
        ids.null_count
        or trained.null_count
        or not pc.equal(ids.value_lengths(), trained.value_lengths()).to_numpy(zero_copy_only=False).all()
    ):
        return "the trained flags do not have the ids' rows"
    inner_ids, inner_trained = ids.flatten(), trained.flatten()
    lengths = inner_ids.value_lengths().to_numpy(zero_copy_only=False)
    if (
        inner_ids.null_count
        or inner_trained.null_count
        or not np.array_equal(lengths, inner_trained.value_lengths().to_numpy(zero_copy_only=False))
    ):
        return "the trained flags do not have the ids' lengths"
    problem = _ids_problem(inner_ids.flatten().to_numpy(zero_copy_only=False), lengths, plan)
    if problem is not None:
        return problem
    flags = inner_trained.flatten().to_numpy(zero_copy_only=False).astype(np.int64)
    if (row_sums(exclusive_cumsum(lengths), flags) == 0).any():
        return "a token row has no trained token"
    counts = table.column(cr.COUNTS).chunk(0)
    keys, values = counts.keys, counts.items.to_numpy(zero_copy_only=False)
    chat_key = pc.or_(pc.starts_with(keys, "chat."), pc.starts_with(keys, f"{SKIP}chat."))
    if len(keys) and (not pc.all(chat_key).as_py() or values.min() < 1 or values.max() > MOST_COUNTED):
        return "a counter is not a chat counter counted 1 or more times"
    return None


def _ids_problem(ids: np.ndarray, lengths: np.ndarray, plan: CachePlan) -> str | None:
    if len(ids) and (int(ids.min()) < 0 or int(ids.max()) >= plan.vocab_size):
        bad = int(ids.max()) if int(ids.max()) >= plan.vocab_size else int(ids.min())
        return f"id {bad} is not below the vocabulary size {plan.vocab_size}"
    if plan.max_length is not None and len(lengths) and int(lengths.max()) > plan.max_length:
        return f"a row of {int(lengths.max())} tokens is longer than max_length {plan.max_length}"
    return None
