"""A recipe's token cache (``Pipeline.cache``): where it lives, what keys its rows, and what its rows can be."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from padpipe.token_cache.rows import ids_type
from padpipe.token_cache.store import Store


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
