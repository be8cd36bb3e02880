"""The chat cache after the shuffle buffer: render what is text, read back what is cached, in the chat threads.

:class:`CachedChat` replaces the chat stage's function (a :class:`padpipe.pipes.chat.ChatTokenizer`, run in the
same threads): rows marked :data:`~padpipe.token_cache.rows.TEXT` are rendered and tokenized by it exactly as
without a cache (same ids, labels, errors, skips and counters); a cached row gives back the token rows, trained
flags and counters its conversation gave when it was rendered. Both become one outcome in the batch's row order
and one chunk, built and counted by the chat stage itself, so batches and ``stats()`` are those without a cache.
Freshly rendered rows come back alongside in segment-file form for the
:class:`~padpipe.token_cache.fill.CacheFiller` and its collector, as ``tokenize``'s do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import pyarrow as pa

from padpipe.chat.outcome import Outcome
from padpipe.chunks import TokenChunk
from padpipe.stats import PipelineStats
from padpipe.token_cache import rows as cr
from padpipe.token_cache.chat_rows import outcome_of, segment_rows
from padpipe.token_cache.fill import Filled


class Chat(Protocol):
    """What the chat cache uses of the chat stage's :class:`padpipe.pipes.chat.ChatTokenizer`."""

    stats: PipelineStats

    def __call__(self, batch: pa.RecordBatch) -> TokenChunk: ...

    def check(self, batch: pa.RecordBatch) -> None: ...

    def outcome(self, batch: pa.RecordBatch, todo: np.ndarray | None = None) -> Outcome: ...

    def chunk(self, batch: pa.RecordBatch, outcome: Outcome) -> TokenChunk: ...


class Where(Protocol):
    """What the chat cache reads of its session: the ids' type and the columns a segment stores as nulls."""

    id_type: pa.DataType
    fields: tuple[str, ...]


@dataclass(frozen=True)
class CachedChat:
    """Render and tokenize the text rows of a batch, read back its cached rows (thread-safe, as the stage).

    Args:
        chat: The chat stage's :class:`~padpipe.pipes.chat.ChatTokenizer`.
        session: The pipeline's cache session.
    """

    chat: Chat
    session: Where

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
