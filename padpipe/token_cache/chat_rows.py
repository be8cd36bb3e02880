"""A chat cache's segment rows: what each conversation became (its token rows, their trained tokens, the counters
it added), stored per source position, read back, and checked before a single id of it is used.

One conversation becomes 0 token rows (skipped, or nothing trained), 1, or several (reasoning rows), so a
segment row holds lists of rows: ``__padpipe_ids`` (list of lists of ids), ``__padpipe_trained`` (the same
shape, bools) and ``__padpipe_counts`` (a map from counter to count; ``skip.chat.<reason>`` for a skipped
row). :func:`chat_problem` holds a segment to what ``.chat()`` itself could have written (see its docs).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from padpipe.chat.labels import row_sums
from padpipe.chat.outcome import SKIP, Outcome
from padpipe.chunks import ID_DTYPE
from padpipe.token_cache import rows as cr

MOST_COUNTED = 1 << 20
"""No conversation adds more than this to one counter (a stored count above it is a crafted file)."""


def segment_rows(
    rows: pa.RecordBatch, outcome: Outcome, index: np.ndarray, fields: tuple[str, ...], id_type: pa.DataType
) -> pa.RecordBatch:
    """What a segment file stores for the freshly rendered reader ``rows``: the conversation columns nulled,
    each row's token rows, trained flags and counters, its state and position.

    ``outcome`` is of the batch ``rows`` were taken from; ``index`` maps its batch rows to rows of ``rows``.
    """
    n = rows.num_rows
    source = index[outcome.source]
    outer = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(source, minlength=n), out=outer[1:])
    starts = pa.array(outer.astype(np.int32))
    ids = pa.ListArray.from_arrays(starts, cr.lists(outcome.ids, outcome.offsets, id_type))
    trained = pa.ListArray.from_arrays(starts, cr.lists(outcome.trained, outcome.offsets, pa.bool_()))
    found: dict[int, dict[str, int]] = {}
    for row, name, count in outcome.counts:
        place = found.setdefault(int(index[row]), {})
        place[name] = place.get(name, 0) + count
    counts = pa.array([list(found[i].items()) if i in found else None for i in range(n)], cr.COUNTS_TYPE)
    out = rows.drop_columns([c for c in cr.HIDDEN if c in rows.schema.names])
    for name in fields:
        i = out.schema.get_field_index(name)
        if i >= 0:
            out = out.set_column(i, out.schema.field(i), pa.nulls(n, out.schema.field(i).type))
    for name, column in ((cr.IDS, ids), (cr.TRAINED, trained), (cr.COUNTS, counts)):
        out = out.append_column(name, column)
    out = out.append_column(cr.STATE, pa.array(np.full(n, cr.CACHED, np.int8)))
    return out.append_column(cr.POS, pa.array(cr.split_refs(rows.column(cr.REF).to_numpy())[1]))


def outcome_of(rows: pa.RecordBatch, places: np.ndarray) -> Outcome:
    """The outcome cached reader ``rows`` stand for, at batch rows ``places`` (no rendering, no tokenizer).

    Example:
        >>> ids = pa.array([[[5, 6]], [], [[7], [8]]], pa.list_(pa.list_(pa.uint16())))
        >>> trained = pa.array([[[False, True]], [], [[True], [True]]], pa.list_(pa.list_(pa.bool_())))
        >>> counts = pa.array([None, [("skip.chat.not_prefix", 1)], None], cr.COUNTS_TYPE)
        >>> rows = pa.RecordBatch.from_arrays([ids, trained, counts], [cr.IDS, cr.TRAINED, cr.COUNTS])
        >>> out = outcome_of(rows, np.array([0, 2, 5])); out.source.tolist(), out.ids.tolist(), out.counts
        ([0, 5, 5], [5, 6, 7, 8], [(2, 'skip.chat.not_prefix', 1)])
    """
    column = rows.column(cr.IDS)
    per = pc.list_value_length(column).to_numpy(zero_copy_only=False).astype(np.int64)
    inner = column.flatten()
    lengths = pc.list_value_length(inner).to_numpy(zero_copy_only=False).astype(np.int64)
    offsets = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    ids = inner.flatten().to_numpy(zero_copy_only=False).astype(ID_DTYPE)
    trained = rows.column(cr.TRAINED).flatten().flatten().to_numpy(zero_copy_only=False).astype(bool)
    counts = []
    column = rows.column(cr.COUNTS)
    if column.null_count < len(column):
        valid = column.is_valid()
        for place, entries in zip(places[valid.to_numpy(zero_copy_only=False)], column.filter(valid).to_pylist()):
            counts += [(int(place), name, int(n)) for name, n in entries]
    return Outcome(np.repeat(np.asarray(places, np.int64), per), ids, offsets, trained, counts)


def chat_problem(table: pa.Table, id_type: pa.DataType, vocab_size: int, max_length: int | None) -> str | None:
    """What is wrong with a chat segment's rows (one chunk per column, validated), or ``None``.

    Every row is ``CACHED`` and has lists of token rows; the trained flags have the ids' shape; every id is
    ``>= 0`` and below the vocabulary size; no token row is longer than ``max_length`` or has no trained token
    (``.chat()`` drops such rows); every counter is a ``chat.`` one (or ``skip.chat.``) counted 1 to
    :data:`MOST_COUNTED` times.

    Example:
        >>> ids = pa.array([[[5, 9000]]], pa.list_(pa.list_(pa.uint16())))
        >>> trained = pa.array([[[False, True]]], pa.list_(pa.list_(pa.bool_())))
        >>> counts, state = pa.array([None], cr.COUNTS_TYPE), pa.array([cr.CACHED], pa.int8())
        >>> table = pa.table({cr.IDS: ids, cr.TRAINED: trained, cr.COUNTS: counts, cr.STATE: state})
        >>> chat_problem(table, pa.uint16(), 8000, 64)
        'id 9000 is not below the vocabulary size 8000'
    """
    names, types = table.schema.names, cr.hidden_types(id_type, type_ids=False, chat=True)
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
    flat = inner_ids.flatten().to_numpy(zero_copy_only=False)
    if len(flat) and (int(flat.min()) < 0 or int(flat.max()) >= vocab_size):
        bad = int(flat.max()) if int(flat.max()) >= vocab_size else int(flat.min())
        return f"id {bad} is not below the vocabulary size {vocab_size}"
    if max_length is not None and len(lengths) and int(lengths.max()) > max_length:
        return f"a token row of {int(lengths.max())} tokens is longer than max_length {max_length}"
    flags = inner_trained.flatten().to_numpy(zero_copy_only=False).astype(np.int64)
    offsets = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if (row_sums(offsets, flags) == 0).any():
        return "a token row has no trained token"
    counts = table.column(cr.COUNTS).chunk(0)
    keys, values = counts.keys, counts.items.to_numpy(zero_copy_only=False)
    chat_key = pc.or_(pc.starts_with(keys, "chat."), pc.starts_with(keys, f"{SKIP}chat."))
    if len(keys) and (not pc.all(chat_key).as_py() or values.min() < 1 or values.max() > MOST_COUNTED):
        return "a counter is not a chat counter counted 1 or more times"
    return None
