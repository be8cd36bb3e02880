"""Row shuffle buffer over record batches: a bounded, seeded, exactly resumable buffer shuffle."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import torch
from torchdata.nodes import BaseNode

from padpipe.buffers import BufferedRecords, References, records_state
from padpipe.errors import DataError, check_seed, positive
from padpipe.graph import EpochAware
from padpipe.readers.schema import castable, row_origins, source_of, tag_rows, untag_source
from padpipe.state import Array, Bool, Child, Int, ListOf, Loaded, Rng, StateSchema, load_value
from padpipe.stats import PipelineStats

_RNG_STREAM = 0x5A1F  # keeps this stage's random stream apart from other stages seeded alike


class ShuffleBuffer(EpochAware, BaseNode[pa.RecordBatch]):
    """Shuffle rows through a buffer of ``buffer_size`` rows, columnar (no per-row Python work).

    Once the buffer is full, each incoming batch of ``k`` rows evicts ``k`` random buffered rows
    (the newcomers take their slots) as one batch; the input's end drains the buffer in a random
    order. The order is a function of ``(seed, epoch)`` only. The buffered rows, the generator and
    the upstream position are in the state: resume is exact. Each emitted batch carries where its
    rows were read (:func:`~padpipe.readers.schema.tag_rows`; after a resume, while the buffer was
    not compacted), so a later stage's error names them.

    Args:
        source: Upstream node yielding ``pyarrow.RecordBatch``.
        buffer_size: Rows held; larger mixes better and holds more memory.
        seed: Non-negative seed; the epoch is mixed in.
        stats: Counters to report into (time under ``"shuffle"``).
        references: The token cache's, where one is on: buffered rows it holds are saved as references.

    Example:
        >>> from torchdata.nodes import IterableWrapper
        >>> rows = [pa.record_batch({"i": list(range(j, j + 4))}) for j in range(0, 12, 4)]
        >>> node = ShuffleBuffer(IterableWrapper(rows), buffer_size=4, seed=0)
        >>> sorted(i for b in node for i in b.column("i").to_pylist())
        [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]
    """

    STATE = StateSchema(
        "ShuffleBuffer",
        2,
        source=Child(),
        epoch=Int(0),
        rng=Rng(),
        segments=ListOf(BufferedRecords()),  # rows in a token cache: references, re-read
        live=Array(torch.int64, lo=0, unique=True),  # the buffered rows, numbered across the segments
        exhausted=Bool(),
        chunk_rows=Int(0),
    )

    def __init__(
        self,
        source: BaseNode[pa.RecordBatch],
        *,
        buffer_size: int = 10_000,
        seed: int = 0,
        stats: PipelineStats | None = None,
        references: References | None = None,
    ) -> None:
        super().__init__()
        positive("buffer_size", buffer_size)
        check_seed(seed)
        self.source, self.buffer_size, self.seed = source, buffer_size, seed
        self.stats = stats or PipelineStats()
        self.references = references
        self._epoch = -1

    # -- BaseNode -----------------------------------------------------------------------------------
    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        super().reset(initial_state)
        self._rng = np.random.default_rng()
        if initial_state is None:
            self.source.reset(None)
            self._epoch += 1
            self._rng = np.random.default_rng([self.seed, self._epoch, _RNG_STREAM])
            self._set_buffer([], [], np.zeros(0, np.int64))
            self._exhausted, self._chunk_rows = False, 0
            return
        specs = {
            "live": Array(torch.int64, lo=0, max_length=self.buffer_size, unique=True),
            "segments": ListOf(BufferedRecords(self.references)),
        }

        def check(loaded: Loaded) -> None:  # the live rows are rows of the segments
            rows = sum(s.num_rows for s in loaded.segments)
            live = Array(torch.int64, lo=0, hi=rows - 1, max_length=self.buffer_size, unique=True)
            load_value(self.STATE.stage, "live", initial_state["live"], live)

        loaded = self.STATE.check(initial_state, self._settings(), specs=specs, check=check)
        self.source.reset(loaded.source)
        self._epoch, self._rng = loaded.epoch, loaded.rng
        self._set_buffer(loaded.segments, list(initial_state["segments"]), loaded.live)
        self._exhausted = loaded.exhausted
        self._chunk_rows = loaded.chunk_rows

    def next(self) -> pa.RecordBatch:
        while not self._exhausted:
            try:
                batch = next(self.source)
            except StopIteration:
                with self.stats.timer("shuffle"):
                    live = self._live[: self._count]
                    self._live, self._exhausted = live[self._rng.permutation(len(live))], True
                break
            with self.stats.timer("shuffle"):
                out = self._accept(batch)
            if out is not None:
                return out
        if self._count == 0:
            raise StopIteration
        with self.stats.timer("shuffle"):
            take = max(1, min(self._chunk_rows, self._count))
            self._count -= take
            return self._gather(self._live[self._count : self._count + take])

    def get_state(self) -> dict[str, Any]:
        for i, data in enumerate(self._segment_states):
            if data is None:  # saved once per segment, then shared by every later state
                self._segment_states[i] = records_state(self._segments[i], self.references)  # cached rows: references
        return self.STATE.make(
            self._settings(),
            source=self.source.state_dict(),
            epoch=self._epoch,
            rng=self._rng.bit_generator.state,
            segments=list(self._segment_states),
            live=self._live[: self._count],  # copied into the state
            exhausted=self._exhausted,
            chunk_rows=self._chunk_rows,
        )

    # -- buffer -------------------------------------------------------------------------------------
    def _settings(self) -> dict[str, Any]:
        return {"buffer_size": self.buffer_size, "seed": self.seed}

    def _set_buffer(
        self, segments: list[pa.RecordBatch], saved: list[Any], live: np.ndarray, where: np.ndarray | None = None
    ) -> None:
        """Hold ``segments`` (rows numbered across them) of which rows ``live`` are buffered.

        ``where``: where their rows were read (:meth:`_origins`); default: from the segments' tags.
        """
        if where is None:
            self._places: list[str] = []
            self._place_ids: dict[str, int] = {}
            wheres = [self._origins(s) for s in segments]
            where = np.concatenate(wheres) if wheres else np.zeros((0, 2), np.int64)
        self._where = where
        self._segments, self._segment_states = segments, saved
        self._table = pa.Table.from_batches(segments) if segments else None
        self._rows = sum(s.num_rows for s in segments)
        self._count = len(live)
        self._live = np.zeros(max(self.buffer_size, self._count), np.int64)
        self._live[: self._count] = live

    def _accept(self, batch: pa.RecordBatch) -> pa.RecordBatch | None:
        """Add ``batch`` to the buffer; return the rows it evicts, or ``None`` while filling."""
        if not isinstance(batch, pa.RecordBatch):
            raise TypeError(f"ShuffleBuffer expects pyarrow.RecordBatch items, but got {type(batch).__name__} instead.")
        k = batch.num_rows
        if k == 0:
            return None
        batch = self._match_schema(batch)
        self._chunk_rows = max(self._chunk_rows, k)
        new = np.arange(self._rows, self._rows + k, dtype=np.int64)
        self._where = np.concatenate([self._where, self._origins(batch)])
        self._segments.append(batch)
        self._segment_states.append(None)
        self._table = pa.Table.from_batches(self._segments)
        self._rows += k
        fill = min(self.buffer_size - self._count, k)
        self._live[self._count : self._count + fill] = new[:fill]
        self._count += fill
        new = new[fill:]
        if not len(new):
            return None
        if len(new) <= self._count:  # evict random slots; the newcomers take their places
            slots = self._rng.choice(self._count, size=len(new), replace=False)
            out = self._live[slots]
            self._live[slots] = new
        else:  # the buffer is smaller than the chunk: shuffle buffer and chunk together
            pool = np.concatenate([self._live[: self._count], new])[self._rng.permutation(self._count + len(new))]
            self._live[: self._count], out = pool[: self._count], pool[self._count :]
        result = self._gather(out)
        if self._rows > 2 * self._count + k:  # drop rows already emitted, amortised O(1) per row
            live = self._live[: self._count]
            kept = untag_source(self._take(live))  # its rows' places stay in self._where, not in the state
            self._set_buffer([kept], [None], np.arange(self._count, dtype=np.int64), self._where[live])
        return result

    def _gather(self, rows: np.ndarray) -> pa.RecordBatch:
        """Rows ``rows`` of the buffer as one record batch, each tagged with where it was read."""
        return tag_rows(self._take(rows), self._places, self._where[rows])  # rows of several files: each its own

    def _take(self, rows: np.ndarray) -> pa.RecordBatch:
        assert self._table is not None
        table = self._table.take(pa.array(rows, type=pa.int64())).combine_chunks()
        return table.to_batches()[0] if table.num_rows else pa.RecordBatch.from_pylist([], schema=table.schema)

    def _origins(self, batch: pa.RecordBatch) -> np.ndarray:
        """Where each row of ``batch`` was read, as ``[place, row]`` rows, places numbered in ``self._places``."""
        places, where = row_origins(batch)
        ids = []
        for place in places:
            if place not in self._place_ids:
                self._place_ids[place] = len(self._places)
                self._places.append(place)
            ids.append(self._place_ids[place])
        lookup = np.array([*ids, -1], dtype=np.int64)  # an unknown row (-1) stays unknown
        return np.stack([lookup[where[:, 0]], where[:, 1]], axis=1)

    def _match_schema(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """``batch`` with the buffered rows' columns and types; ``DataError`` when they differ in kind.

        Columns may come in another order, and a type may differ within its kind (``int32`` for
        ``int64``, ``large_string`` for ``string``); anything else (a number column where the
        buffered rows have text) is an error naming the column and the file, whatever the seed.
        """
        if not self._segments or batch.schema.equals(self._segments[0].schema):
            return batch
        expected = self._segments[0].schema
        source = source_of(batch)
        where = f"the rows from {source}" if source else "the rows of an input record batch"
        if sorted(batch.schema.names) != sorted(expected.names):
            raise DataError(
                f"shuffle: {where} have columns {batch.schema.names!r}, but the rows buffered before have "
                f"{expected.names!r}; expected the same columns in every input (pass `columns=` to the reader)."
            )
        for field in expected:
            found = batch.schema.field(field.name).type
            if not castable(found, field.type):
                raise DataError(
                    f"shuffle: column {field.name!r} is {found} in {where}, but {field.type} in the rows buffered "
                    "before; expected one type per column in every input."
                )
        try:
            return batch.select(expected.names).cast(expected)
        except (ValueError, pa.ArrowException) as exc:
            raise DataError(f"shuffle: {where} cannot take the buffered rows' types ({exc}).") from exc
