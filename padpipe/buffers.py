"""How a stage saves the rows it buffers: whole, or as references a token cache resolves (the stages' hook).

A stage saves buffered rows with :func:`chunk_state` / :func:`records_state` and declares those fields as
:class:`BufferedChunk` / :class:`BufferedRecords`. With a token cache (its session, the stage's
:class:`References`), rows it has published carry a reference column (``__padpipe_ref``), and a buffer whose every
row it holds is saved as 12 bytes a row; a state that holds references is refused in a stage given none.

Example:
    >>> chunk = TokenChunk.from_lists([[1, 2]], {"x": [7]})
    >>> BufferedChunk().load(chunk_state(chunk)).ids.tolist()
    [1, 2]
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import pyarrow as pa

from padpipe.chunks import TokenChunk, records_from_state, records_to_state
from padpipe.state import Spec, StateMismatchError

REF = "__padpipe_ref"
"""The column of a cached row's reference (its unit and position), where a token cache is on."""
REFERENCES_KEY = "token_cache"
"""The key that marks a saved buffer as references (the cache's name is its value)."""


class References(Protocol):
    """What a token cache gives the stages' buffers (:mod:`padpipe.token_cache.state` implements it)."""

    def chunk(self, ref: pa.Array) -> dict[str, Any] | None:
        """The compact state of token rows with references ``ref``, or ``None`` unless the cache holds them all."""
        ...

    def records(self, batch: pa.RecordBatch) -> dict[str, Any] | None:
        """The compact state of a record batch with a reference column, or ``None``."""
        ...

    def resolve_chunk(self, state: dict[str, Any], truncate_to: int | None) -> TokenChunk:
        """The token rows a compact state names, read back (cut to ``truncate_to`` tokens)."""
        ...

    def resolve_records(self, state: dict[str, Any]) -> pa.RecordBatch:
        """The record batch a compact state names, read back."""
        ...


def drop_ref(chunk: TokenChunk) -> TokenChunk:
    """``chunk`` without its row references (what the bucketizer emits).

    Example:
        >>> drop_ref(TokenChunk.from_lists([[1]], {"__padpipe_ref": [7], "x": [1]})).columns.keys()
        dict_keys(['x'])
    """
    if REF not in chunk.columns:
        return chunk
    return TokenChunk(chunk.ids, chunk.offsets, chunk.type_ids, {k: v for k, v in chunk.columns.items() if k != REF})


def chunk_state(chunk: TokenChunk, references: References | None = None) -> dict[str, Any]:
    """The state of buffered token rows: references when the token cache holds them all, else the rows."""
    ref = chunk.columns.get(REF)
    compact = references.chunk(ref) if ref is not None and references is not None else None
    return compact if compact is not None else chunk.to_state()


def records_state(batch: pa.RecordBatch, references: References | None = None) -> dict[str, Any]:
    """The state of a buffered record batch: references when the token cache holds every row, else the rows."""
    compact = references.records(batch) if REF in batch.schema.names and references is not None else None
    return compact if compact is not None else records_to_state(batch)


class BufferedChunk(Spec):
    """A buffer of token rows: a sealed token chunk, or references re-read (then cut to ``truncate_to``)."""

    def __init__(self, truncate_to: int | None = None, references: References | None = None) -> None:
        self.truncate_to, self.references = truncate_to, references

    def load(self, value: Any) -> TokenChunk:
        if isinstance(value, Mapping) and REFERENCES_KEY in value:
            return _given(self.references).resolve_chunk(dict(value), self.truncate_to)
        return TokenChunk.from_state(value)


class BufferedRecords(Spec):
    """A buffered record batch (a shuffle segment): sealed rows, or references re-read."""

    def __init__(self, references: References | None = None) -> None:
        self.references = references

    def load(self, value: Any) -> pa.RecordBatch:
        if isinstance(value, Mapping) and REFERENCES_KEY in value:
            return _given(self.references).resolve_records(dict(value))
        return records_from_state(value)


def _given(references: References | None) -> References:
    if references is None:
        raise StateMismatchError(
            "this state refers to rows in a token cache, but this pipeline does not use one; resume with the "
            "same tokenize(cache=...) settings."
        )
    return references
