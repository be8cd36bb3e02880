"""Small first chunks: the first rows of each epoch go to ``tokenize`` in chunks of 32, 64, 128, ... rows.

A tokenizer thread returns a chunk only when all its rows are tokenized, and readers pass about a thousand rows
at a time: on long documents, seconds before the first tokens reach the bucketizer. Doubling chunks over the
first :data:`RAMP_ROWS` rows bring them after a few dozen rows; the split depends on row counts only (the same
with a token cache and after resume).
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from torchdata.nodes import BaseNode

from padpipe.buffers import BufferedRecords, References, records_state
from padpipe.readers.schema import slice_rows
from padpipe.state import Child, Int, Optional, StateSchema

FIRST_ROWS = 32
RAMP_ROWS = 32 + 64 + 128 + 256 + 512  # rows of an epoch split into doubling chunks; later chunks pass through


class FirstChunks(BaseNode[pa.RecordBatch]):
    """Pass record batches through, the first :data:`RAMP_ROWS` rows of each epoch cut into doubling chunks.

    The rest of a cut batch waits in the node and is saved in its state (as references when a
    token cache holds its rows), so resume is exact.

    Args:
        source: Upstream node yielding ``pyarrow.RecordBatch``.
        references: The token cache's, where one is on: held rows it holds are saved as references.

    Example:
        >>> from torchdata.nodes import IterableWrapper
        >>> node = FirstChunks(IterableWrapper([pa.record_batch({"i": list(range(1100))})]))
        >>> [b.num_rows for b in node]
        [32, 64, 128, 256, 512, 108]
    """

    STATE = StateSchema(
        "FirstChunks", 1, source=Child(), held=Optional(BufferedRecords()), sent=Int(0)
    )  # held: the rest of a cut batch; sent: rows passed on this epoch

    def __init__(self, source: BaseNode[pa.RecordBatch], *, references: References | None = None) -> None:
        super().__init__()
        self.source, self.references = source, references
        self._held: pa.RecordBatch | None = None
        self._sent = 0

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        super().reset(initial_state)
        if initial_state is None:
            self.source.reset(None)
            self._held, self._sent = None, 0
            return
        loaded = self.STATE.check(initial_state, {}, specs={"held": Optional(BufferedRecords(self.references))})
        self.source.reset(loaded.source)
        self._held, self._sent = loaded.held, loaded.sent

    def next(self) -> pa.RecordBatch:
        batch = self._held if self._held is not None else next(self.source)
        self._held = None
        if self._sent >= RAMP_ROWS or not isinstance(batch, pa.RecordBatch):
            return batch
        size = FIRST_ROWS << max(0, (self._sent // FIRST_ROWS + 1).bit_length() - 1)  # 32, 64, 128, ...
        if batch.num_rows > size:
            batch, self._held = slice_rows(batch, 0, size), slice_rows(batch, size)  # each row's place kept
        self._sent += batch.num_rows
        return batch

    def get_state(self) -> dict[str, Any]:
        held = None if self._held is None else records_state(self._held, self.references)
        return self.STATE.make({}, source=self.source.state_dict(), held=held, sent=self._sent)
