"""The chat cache: what each conversation became (its token rows, their trained tokens, the counters it added),
stored per source position and read back in the chat stage's threads (:class:`CachedChat`).

A conversation becomes 0, 1 or several token rows, so a segment row holds lists of rows: ``__padpipe_ids`` (list
of lists of ids), ``__padpipe_trained`` (the same shape, bools) and ``__padpipe_counts`` (counter to count;
``skip.chat.<reason>`` for a skipped row). Text and cached rows become one outcome, built and counted by the
stage itself, so batches and ``stats()`` are those without a cache.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from padpipe.chat.outcome import Outcome
from padpipe.chunks import ID_DTYPE, TokenChunk, exclusive_cumsum
from padpipe.stats import PipelineStats
from padpipe.token_cache import rows as cr
from padpipe.token_cache.fill import Filled
from padpipe.token_cache.plan import Session


def segment_rows(
    rows: pa.RecordBatch, outcome: Outcome, index: np.ndarray, fields: tuple[str, ...], id_type: pa.DataType
) -> pa.RecordBatch:
    """What a segment file stores for the freshly rendered reader ``rows``: the conversation columns nulled,
    each row's token rows, trained flags and counters, its state and position.

    ``outcome`` is of the batch ``rows`` were taken from; ``index`` maps its batch rows to rows of ``rows``.
    """
    n = rows.num_rows
    source = index[outcome.source]
    outer = exclusive_cumsum(np.bincount(source, minlength=n))
    starts = pa.array(outer.astype(np.int32))
    ids = pa.ListArray.from_arrays(starts, cr.lists(outcome.ids, outcome.offsets, id_type))
    trained = pa.ListArray.from_arrays(starts, cr.lists(outcome.trained, outcome.offsets, pa.bool_()))
    found: dict[int, dict[str, int]] = {}
    for row, name, count in outcome.counts:
        place = found.setdefault(int(index[row]), {})
        place[name] = place.get(name, 0) + count
    counts = pa.array([list(found[i].items()) if i in found else None for i in range(n)], cr.COUNTS_TYPE)
    columns = {cr.IDS: ids, cr.TRAINED: trained, cr.COUNTS: counts}
    return cr.segment_of(rows, fields, columns, np.full(n, cr.CACHED))


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
    offsets = exclusive_cumsum(lengths)
    ids = inner.flatten().to_numpy(zero_copy_only=False).astype(ID_DTYPE)
    trained = rows.column(cr.TRAINED).flatten().flatten().to_numpy(zero_copy_only=False).astype(bool)
    counts = []
    column = rows.column(cr.COUNTS)
    if column.null_count < len(column):
        valid = column.is_valid()
        for place, entries in zip(places[valid.to_numpy(zero_copy_only=False)], column.filter(valid).to_pylist()):
            counts += [(int(place), name, int(n)) for name, n in entries]
    return Outcome(np.repeat(np.asarray(places, np.int64), per), ids, offsets, trained, counts)


class Chat(Protocol):
    """What the chat cache uses of the chat stage's :class:`padpipe.pipes.chat.ChatTokenizer`."""

    stats: PipelineStats

    def __call__(self, batch: pa.RecordBatch) -> TokenChunk: ...

    def check(self, batch: pa.RecordBatch) -> None: ...

    def outcome(self, batch: pa.RecordBatch, todo: np.ndarray | None = None) -> Outcome: ...

    def chunk(self, batch: pa.RecordBatch, outcome: Outcome) -> TokenChunk: ...


@dataclass(frozen=True)
class CachedChat:
    """Render and tokenize the text rows of a batch, read back its cached rows (thread-safe, as the stage).

    Args:
        chat: The chat stage's :class:`~padpipe.pipes.chat.ChatTokenizer`.
        session: The pipeline's cache session.
    """

    chat: Chat
    session: Session

    def __call__(self, batch: pa.RecordBatch) -> Filled:
        if not isinstance(batch, pa.RecordBatch) or cr.STATE not in batch.schema.names:
            return Filled(self.chat(batch))  # rows from a state saved without the cache: plain text
        with self.chat.stats.timer("chat"):
            source = cr.without_hidden(batch)
            self.chat.check(source)
            state = cr.state_of(batch)
            text, cached = state == cr.TEXT, state == cr.CACHED
            parts, fresh, units = [], None, None
            if text.any():
                done = self.chat.outcome(source, None if text.all() else text)
                parts.append(done)
                rows = batch if text.all() else batch.filter(pa.array(text))
                units = cr.split_refs(rows.column(cr.REF).to_numpy())[0]
                if (units >= 0).any():
                    index = np.cumsum(text) - 1  # a batch row's place among the text rows
                    fresh = segment_rows(rows, done, index, self.session.fields, self.session.id_type)
            if cached.any():
                parts.append(outcome_of(batch.filter(pa.array(cached)), np.flatnonzero(cached)))
            return Filled(self.chat.chunk(source, Outcome.merge(parts)), fresh, units)
