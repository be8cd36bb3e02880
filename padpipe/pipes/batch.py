"""In-order fixed-size batching of token chunks (no length grouping)."""

from __future__ import annotations

from typing import Any

import numpy as np
from torchdata.nodes import BaseNode

from padpipe.chunks import Chunk, TokenChunk
from padpipe.errors import check_bool, positive
from padpipe.state import Bool, Child, Int, Loaded, Optional, StateSchema, load_value
from padpipe.stats import PipelineStats


class FixedBatcher(BaseNode[TokenChunk]):
    """Regroup a stream of token chunks into chunks of exactly ``batch_size`` rows, in arrival order.

    Rows left over at the end of an input chunk wait for the next one. The epoch's last batch is
    smaller unless ``drop_last`` drops it (counted in stats as ``batch.drop_last``). The waiting
    rows are saved in the state, so resume is exact.

    Args:
        source: Upstream node yielding :class:`~padpipe.chunks.TokenChunk`.
        batch_size: Rows per batch.
        drop_last: Drop a last batch smaller than ``batch_size``.
        stats: Counters to report into (time under ``"batch"``).

    Example:
        >>> from torchdata.nodes import IterableWrapper
        >>> chunks = [TokenChunk.from_lists([[1], [2], [3]]), TokenChunk.from_lists([[4], [5]])]
        >>> [b.ids.tolist() for b in FixedBatcher(IterableWrapper(chunks), batch_size=2, drop_last=False)]
        [[1, 2], [3, 4], [5]]
    """

    STATE = StateSchema(
        "FixedBatcher", 2, source=Child(), pending=Optional(Chunk()), pos=Int(0), exhausted=Bool()
    )  # pending: the chunk whose rows from `pos` on were not emitted yet

    def __init__(
        self,
        source: BaseNode[TokenChunk],
        *,
        batch_size: int,
        drop_last: bool = False,
        stats: PipelineStats | None = None,
    ) -> None:
        super().__init__()
        positive("batch_size", batch_size)
        check_bool("drop_last", drop_last)
        self.source, self.batch_size, self.drop_last = source, batch_size, drop_last
        self.stats = stats or PipelineStats()

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        super().reset(initial_state)
        self._pending: TokenChunk | None = None  # rows not yet emitted start at self._pos
        self._pos = 0
        self._pending_state: dict[str, Any] | None = None
        if initial_state is None:
            self.source.reset(None)
            self._exhausted = False
            return

        def check(loaded: Loaded) -> None:  # rows of the pending chunk before `pos` were emitted
            last = 0 if loaded.pending is None else loaded.pending.num_rows - 1
            load_value(self.STATE.stage, "pos", loaded.pos, Int(0, last))

        loaded = self.STATE.check(initial_state, self._settings(), check=check)
        self.source.reset(loaded.source)
        self._exhausted = loaded.exhausted
        self._pending, self._pos = loaded.pending, loaded.pos
        self._pending_state = initial_state["pending"]

    def next(self) -> TokenChunk:
        while True:
            available = 0 if self._pending is None else self._pending.num_rows - self._pos
            if available >= self.batch_size or (self._exhausted and available):
                if self._exhausted and available < self.batch_size and self.drop_last:
                    self.stats.record_skip("batch.drop_last", available)
                    self._set_pending(None)
                    raise StopIteration
                with self.stats.timer("batch"):
                    return self._take(min(self.batch_size, available))
            if self._exhausted:
                raise StopIteration
            try:
                chunk = next(self.source)
            except StopIteration:
                self._exhausted = True
                continue
            if chunk.num_rows:
                with self.stats.timer("batch"):
                    rest = self._take(available) if available else None
                    self._set_pending(chunk if rest is None else TokenChunk.concat([rest, chunk]))

    def get_state(self) -> dict[str, Any]:
        if self._pending is not None and self._pending_state is None:
            self._pending_state = self._pending.to_state()  # once per input chunk, shared by later states
        return self.STATE.make(
            self._settings(),
            source=self.source.state_dict(),
            pending=self._pending_state,
            pos=self._pos,
            exhausted=self._exhausted,
        )

    def _settings(self) -> dict[str, Any]:
        return {"batch_size": self.batch_size, "drop_last": self.drop_last}

    def _set_pending(self, chunk: TokenChunk | None) -> None:
        self._pending, self._pos, self._pending_state = chunk, 0, None

    def _take(self, count: int) -> TokenChunk:
        """The next ``count`` pending rows; the pending rows move on past them."""
        assert self._pending is not None
        start, pending = self._pos, self._pending
        if start == 0 and count == pending.num_rows:
            self._set_pending(None)
            return pending
        self._pos += count
        if self._pos == pending.num_rows:
            self._set_pending(None)
        return pending.take(np.arange(start, start + count))
