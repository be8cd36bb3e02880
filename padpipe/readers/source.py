"""The reader nodes: :class:`ReaderNode`, what every reader holds, and :class:`UnitSource`, a
:class:`~padpipe.readers.format.Format` read in per-epoch unit order, one share per consumer.

:class:`UnitSource` holds the elastic planner (:class:`~padpipe.readers.plan.EpochPlan`), the listing identity
(:class:`~padpipe.readers.identity.ListingIdentity`) and the token cache, and saves its position as ``(unit,
row)`` (plus the format's own keys), so resume reads from there instead of skipping.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from torchdata.nodes import BaseNode

from padpipe.errors import DataError, positive
from padpipe.graph import EpochAware
from padpipe.readers.aligned import aligned_batches
from padpipe.readers.format import Format
from padpipe.readers.identity import ListingIdentity
from padpipe.readers.plan import EpochPlan
from padpipe.readers.retry import denied
from padpipe.readers.unit import WorkUnit
from padpipe.sharing.consumer import Consumer
from padpipe.state import Int, Loaded, StateSchema, load_value
from padpipe.stats import PipelineStats

DEFAULT_CHUNK_ROWS = 1024


class ReaderNode(EpochAware, BaseNode[pa.RecordBatch]):
    """What every reader node holds: its batch size, seed, consumer slot and stats.

    Args:
        chunk_rows: Most rows per emitted record batch.
        seed: When set, the unit order is shuffled per epoch with ``(seed, epoch)``; same on every
            rank, so consumers still split the units exactly (unused by the readers without units).
        consumer: This reader's consumer slot (rank x DataLoader worker); default: detected when the
            node is first reset.
        stats: Counters to report into.
    """

    def __init__(
        self,
        *,
        chunk_rows: int = DEFAULT_CHUNK_ROWS,
        seed: int | None = None,
        consumer: Consumer | None = None,
        stats: PipelineStats | None = None,
    ) -> None:
        super().__init__()
        positive("chunk_rows", chunk_rows)
        self.chunk_rows, self.seed, self.consumer = chunk_rows, seed, consumer
        self.stats = stats or PipelineStats()
        self._epoch = -1

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        super().reset(initial_state)
        self.detect()

    def detect(self) -> Consumer:
        """This reader's consumer slot, detected once (in the process that reads)."""
        if self.consumer is None:
            self.consumer = Consumer.detect()
        return self.consumer

    def reader_settings(self, input: str, **more: Any) -> dict[str, Any]:
        """The settings a state of this reader must have been saved with: its input, batch size, ``more`` and
        consumer slot."""
        consumer = self.detect()
        return {"input": input, "chunk_rows": self.chunk_rows, **more, "consumer": f"{consumer.index}/{consumer.count}"}


class UnitSource(ReaderNode):
    """The node of every unit reader: reads ``format``'s units in this consumer's share of each epoch.

    Args:
        format: What is read, and how (:class:`~padpipe.readers.format.Format`).
        **reader: :class:`ReaderNode`'s arguments.
    """

    VERSION = 2
    cache: Any = None  # the token cache this reader reads through (use_token_cache), or None
    identity: ListingIdentity | None = None  # what was listed, for input that is files (held, not inherited)

    def __init__(self, format: Format, **reader: Any) -> None:
        super().__init__(**reader)
        self.format = format
        self.plan = EpochPlan(seed=self.seed, measure=format.measure, piece=format.piece)  # held, not inherited
        self._units: list[WorkUnit] | None = None
        self._order: list[WorkUnit] = []
        self._unit = 0
        self._row = 0
        self._reader: Iterator[pa.RecordBatch] | None = None
        self._stop_on_load = False
        self._stop_at: int | None = None

    # -- the token cache's hooks ----------------------------------------------------------------
    def use_token_cache(self, cache: Any) -> None:
        """Read each piece through ``cache`` (a :class:`padpipe.token_cache.session.CacheSession`).

        The pipeline builder calls it when the recipe has a token cache; the cache then asks for
        the rows it misses with :meth:`rows` and knows the input by :meth:`listed_units`,
        :meth:`file_of` and the format's hooks (``reader.format``).
        """
        self.cache = cache

    def listed_units(self) -> list[WorkUnit]:
        """The input's units, listed once (the format's ``list_units``) and kept for the reader's life."""
        if self._units is None:
            self._units = self._list()
        return self._units

    def file_of(self, path: str) -> Any:
        """The listed file (a :class:`padpipe.readers.paths.FileRef`) a unit at ``path`` is read from; ``None`` here."""
        return None

    def listed_files(self) -> dict[str, Any]:
        """Each listed file by name (a :class:`padpipe.readers.paths.FileRef`); ``{}`` for input that is not files."""
        return {}

    def state_schema(self) -> StateSchema:
        """This reader's state: its position (epoch, unit, row), the format's position keys and, for files,
        the listing's digest and the line of the file being read."""
        fields = {"epoch": Int(0), "unit": Int(0), "row": Int(0), **self.format.POSITION}
        if self.identity is not None:
            fields.update(ListingIdentity.FIELDS)
        return StateSchema(type(self).__name__, self.VERSION, **fields)

    # -- BaseNode ---------------------------------------------------------------------------------
    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        super().reset(initial_state)
        self.listed_units()
        self._reader, self._stop_at = None, None
        if initial_state is None:
            self._epoch += 1
            self._unit, self._row = 0, 0
            self._order = self._units_for_epoch(self._epoch)
            self.format.restore_position(None)
            return
        loaded = self._load(initial_state)
        self._epoch, self._unit, self._row = loaded.epoch, loaded.unit, loaded.row
        self._order = self._units_for_epoch(self._epoch)
        self.format.restore_position(loaded)
        if self._stop_on_load:
            self._stop_at = self.plan.stop_at(self._order, self._unit, self._row)

    def _load(self, state: dict[str, Any]) -> Loaded:
        """``state``'s fields after every check: schema, listing, and a position within this consumer's epoch."""
        schema, identity = self.state_schema(), self.identity
        stage = schema.stage

        def check(loaded: Loaded) -> None:
            if identity is not None:
                identity.check_listing(loaded)
            order = self._units_for_epoch(loaded.epoch)
            unit = load_value(stage, "unit", loaded.unit, Int(0, len(order)))
            load_value(stage, "row", loaded.row, Int(0, order[unit].num_rows if unit < len(order) else 0))
            if identity is not None:
                identity.check_line(loaded, unit, order[unit].path if unit < len(order) else None)
            self.format.check_position(loaded, order[unit] if unit < len(order) else None)

        return schema.check(state, self._settings(), check=check)

    def next(self) -> pa.RecordBatch:
        while True:
            if self._stop_at is not None and self._unit >= self._stop_at:
                raise StopIteration
            if self._reader is None:
                if self._unit >= len(self._order):
                    raise StopIteration
                self._reader = self._read(self._order[self._unit], self._row)
            with self.stats.timer("read"):
                batch = next(self._reader, None)
            if batch is None:
                self._unit, self._row, self._reader = self._unit + 1, 0, None
                continue
            if batch.num_rows == 0:
                continue
            self._row += batch.num_rows
            self.stats.add("read.rows", batch.num_rows)
            return batch

    def get_state(self) -> dict[str, Any]:
        position = self.format.position(reading=self._reader is not None)
        fields: dict[str, Any] = {"epoch": self._epoch, "unit": self._unit, "row": self._row, **position}
        if self.identity is not None:
            fields.update(self.identity.values(self._order[self._unit].path if self._unit < len(self._order) else None))
        return self.state_schema().make(self._settings(), **fields)

    # -- elastic resume (see padpipe.runtime.elastic) ---------------------------------------------------------
    def stop_on_load(self) -> None:
        """Read nothing new after the next ``reset(state)``: only what the rest of the graph holds comes out.

        The current unit is cut at the saved row where rows can be cut (:meth:`rest_of_epoch` hands
        the rest to others); otherwise (a byte range, a compressed file) it is read to its end first.
        """
        self._stop_on_load = True

    def rest_of_epoch(self, state: dict[str, Any]) -> list[WorkUnit]:
        """The pieces this consumer had not read when ``state`` was saved (not what :meth:`stop_on_load` reads).

        ``state`` is a saved state of this reader (checked as on resume), or ``{"epoch": e, "unit": 0,
        "row": 0}`` for a share of epoch ``e`` not started.

        Example:
            >>> reader = pp.read_parquet(pp.examples.SAMPLE_PARQUET).build().source
            >>> reader.reset(); _ = next(reader)
            >>> [(u.index, u.first) for u in reader.rest_of_epoch(reader.state_dict())][:2]
            [(0, 1024), (1, 0)]
        """
        self.detect()
        self.listed_units()  # the listing a state is checked against
        start = isinstance(state, dict) and set(state) == {"epoch", "unit", "row"}
        if start and _is_zero(state["unit"]) and _is_zero(state["row"]):
            epoch, unit, row = load_value(type(self).__name__, "epoch", state["epoch"], Int(0)), 0, 0  # not started
        else:
            loaded = self._load(state)
            epoch, unit, row = loaded.epoch, loaded.unit, loaded.row
        return self.plan.rest(self._units_for_epoch(epoch), unit, row)

    # -- helpers ------------------------------------------------------------------------------------
    def _settings(self) -> dict[str, Any]:
        return self.reader_settings(self.format.fingerprint(), seed=self.seed)

    def _units_for_epoch(self, epoch: int) -> list[WorkUnit]:
        """This consumer's pieces of the epoch's unit order (the same seeded order on every consumer)."""
        return self.plan.order(self.listed_units(), self.detect(), epoch)

    def _list(self) -> list[WorkUnit]:
        """List the input (I/O, once): the format's units."""
        return self.format.list_units()

    def _read(self, unit: WorkUnit, start_row: int) -> Iterator[pa.RecordBatch]:
        """The piece's rows from ``start_row`` (from the token cache when one is on), cut at ``chunk_rows`` boundaries.

        Boundaries fall where ``unit.first + row`` is a multiple of ``chunk_rows``
        (:func:`~padpipe.readers.aligned.aligned_batches`), so a piece gives the same batches
        whether its rows come from the file or from the cache, read whole or resumed.
        """
        if self.cache is not None:
            rows = self.cache.rows(self, unit, start_row)
        else:
            rows = self.rows(unit, start_row)
        yield from aligned_batches(rows, unit.first + start_row, self.chunk_rows)

    def rows(self, unit: WorkUnit, start_row: int) -> Iterator[pa.RecordBatch]:
        """The format's ``read_unit``, kept to the piece's rows (``start_row`` from its start), naming the file in
        errors."""
        left = None if unit.last is None else unit.last - unit.first - start_row
        try:
            for batch in self.format.read_unit(unit, unit.first + start_row):
                if left is not None:
                    if left <= 0:
                        return
                    batch, left = batch.slice(0, left), left - min(left, batch.num_rows)
                yield batch
        except DataError:
            raise
        except (OSError, pa.ArrowException, ValueError, EOFError) as exc:
            if self._recoverable(exc):
                raise
            where = f"{unit.path}: cannot read unit {unit.index} from row {unit.first + start_row}"
            if isinstance(exc, PermissionError):
                raise denied(where, exc) from exc
            raise DataError(f"{where}: {exc}") from exc

    def _recoverable(self, exc: BaseException) -> bool:
        """Whether a read error is left to the subclass (retried, or a lost file) instead of a DataError."""
        return False


def _is_zero(value: Any) -> bool:
    return type(value) is int and value == 0
