"""Test-only source nodes: yield prepared items with real epoch semantics and a versioned state."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from torchdata.nodes import BaseNode

from padpipe.graph import EpochAware
from padpipe.state import check_state, make_state

T = TypeVar("T")


class ListNode(EpochAware, BaseNode[T], Generic[T]):
    """Yield ``items`` (or ``items(epoch)`` when callable) once per epoch; state = (epoch, index).

    Example:
        >>> node = ListNode([1, 2]); node.reset(); list(node)
        [1, 2]
    """

    VERSION = 1

    def __init__(self, items: Sequence[T] | Callable[[int], Sequence[T]]) -> None:
        super().__init__()
        self.items = items
        self._epoch = -1
        self._index = 0
        self.resets = 0

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        super().reset(initial_state)
        self.resets += 1
        if initial_state is None:
            self._epoch += 1
            self._index = 0
        else:
            check_state("ListNode", initial_state, version=self.VERSION, settings={})
            self._epoch, self._index = initial_state["epoch"], initial_state["index"]
        self._current = self.items(self._epoch) if callable(self.items) else self.items

    def next(self) -> T:
        if self._index >= len(self._current):
            raise StopIteration
        self._index += 1
        return self._current[self._index - 1]

    def get_state(self) -> dict[str, Any]:
        return make_state(version=self.VERSION, settings={}, epoch=self._epoch, index=self._index)


def token_chunks(lengths: Sequence[int], chunk_rows: int, *, type_ids: bool = False) -> list[Any]:
    """Row ``r`` of length ``n`` has ids ``r * 1000 + [0..n)`` and a ``rid`` column ``r``; cut into chunks.

    Example:
        >>> [c.ids.tolist() for c in token_chunks([2, 1], 1)]
        [[0, 1], [1000]]
    """
    import numpy as np
    import pyarrow as pa

    from padpipe.chunks import TokenChunk

    lengths = np.asarray(lengths, dtype=np.int64)
    chunks = []
    for start in range(0, len(lengths), chunk_rows):
        part = lengths[start : start + chunk_rows]
        offsets = np.zeros(len(part) + 1, dtype=np.int64)
        np.cumsum(part, out=offsets[1:])
        rids = np.arange(start, start + len(part), dtype=np.int64)
        position = np.arange(int(offsets[-1]), dtype=np.int64) - np.repeat(offsets[:-1], part)
        ids = (np.repeat(rids, part) * 1000 + position).astype(np.int32)
        types = (position % 2).astype(np.int8) if type_ids else None
        chunks.append(TokenChunk(ids, offsets, types, {"rid": pa.array(rids)}))
    return chunks


def check_rows(chunk: Any) -> list[int]:
    """Assert every row of ``chunk`` holds the ids :func:`token_chunks` gave it (or a prefix); return row ids."""
    import numpy as np

    rids = chunk.columns["rid"].to_numpy()
    expected = np.repeat(rids, chunk.lengths) * 1000 + (
        np.arange(chunk.num_tokens) - np.repeat(chunk.offsets[:-1], chunk.lengths)
    )
    assert chunk.ids.tolist() == expected.tolist()
    return rids.tolist()
