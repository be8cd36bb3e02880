"""A recipe's token cache (``Pipeline.cache``): where it lives, what keys its rows, what its rows can be; and what
the cache's parts read of the session a built pipeline opens of it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import pyarrow as pa

from padpipe.stats import PipelineStats
from padpipe.token_cache.rows import ids_type
from padpipe.token_cache.store import Segment, Store


@dataclass(frozen=True)
class CachePlan:
    """A recipe's token cache, made by ``tokenize(cache=...)`` or ``chat(cache=...)`` (:mod:`padpipe.cache`); each
    built pipeline opens its own :class:`~padpipe.token_cache.session.CacheSession` of it.

    Attributes:
        store: Where the cache lives.
        on_write_error: ``"raise"`` a :class:`~padpipe.token_cache.store.CacheError` naming the path, or
            ``"skip"``: count it as ``cache.write_errors`` and go on without writing.
        about: What decides the rows (tokenizer, the stage's options, libraries): written to ``about.json``,
            its digest names the rows' folder.
        vocab_size: Every id is below it.
        max_length: Most tokens a row can have (``None``: no limit).
        fields: The columns a segment stores as nulls: the text columns (for chat, the conversation columns).
        type_ids: Whether the tokenizer makes token type ids.
        chat: Whether it caches the chat stage: a segment row holds what a conversation became (its token rows,
            trained flags and counters; :mod:`padpipe.token_cache.chat_rows`).
    """

    store: Store
    on_write_error: str
    about: dict[str, Any]
    vocab_size: int
    max_length: int | None
    fields: tuple[str, ...]
    type_ids: bool = False
    chat: bool = False

    @property
    def id_type(self) -> pa.DataType:
        """The Arrow type ids are kept in: the smallest every id fits."""
        return ids_type(self.vocab_size)


class Session(Protocol):
    """What the cache's parts (walk, fill, chat_rows, state) read of a built pipeline's
    :class:`~padpipe.token_cache.session.CacheSession`, which imports them."""

    plan: CachePlan
    key: str  # the cache's name in states: its resolved location and fingerprint
    fingerprint: str
    id_type: pa.DataType
    fields: tuple[str, ...]
    hidden: dict[str, pa.DataType]  # the hidden token columns, null on a text row (rows.hidden_types)
    keep_ref: bool  # tokenize keeps row references on its chunks (a bucket stage follows)
    writable: bool  # False after a write error under on_write_error='skip'
    store: Store
    stats: PipelineStats
    collector: Any  # its fill.Collector

    def ready(self) -> None: ...  # once per process: the location is writable

    def segments(self, folder: str) -> list[Segment]: ...

    def load(self, folder: str, segment: Segment, uid: int, kind: str | None) -> pa.Table | None: ...

    def publish(self, uid: int, folder: str, segment: Segment, rows: pa.Table) -> None: ...

    def unit_number(self, folder: str) -> int: ...

    def unit_folder(self, uid: int) -> str: ...

    def covered(self, uid: int, positions: np.ndarray) -> bool: ...
