"""Read any re-iterable of dicts (a list, a dataset-like object) as record batches."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from itertools import islice
from typing import Any

import pyarrow as pa

from padpipe.errors import DataError
from padpipe.readers.jsonl_blocks import JSON_TEXT, json_text
from padpipe.readers.schema import conform
from padpipe.readers.source import ReaderNode
from padpipe.state import Int, StateSchema

_END = object()


class IterableReader(ReaderNode):
    """Dicts from ``iterable`` as record batches of ``chunk_rows`` rows.

    Every epoch calls ``iter(iterable)`` again (a one-shot generator cannot be read twice: an
    error). Consumer ``index`` of ``count`` keeps the items at positions ``i % count == index``.
    The columns and types are those of the consumer's first chunk of the epoch (keys in order of
    first appearance; later chunks get nulls for missing keys and drop others). The state is the
    epoch and the items consumed: resume iterates again and skips them, exact when each pass
    yields the same items in the same order.

    Args:
        iterable: The dicts to read.
        json_columns: Keys whose values are passed on as their JSON text, as given (``.chat()`` asks
            this for its conversation columns, so they reach the template unchanged).
        **reader: :class:`~padpipe.readers.source.ReaderNode`'s arguments (``seed`` unused: there is no unit
            order to shuffle; shuffle rows with ``Pipeline.shuffle``).

    Raises:
        TypeError: When an item is not a dict, naming its position.

    Example:
        >>> reader = IterableReader(iterable=[{"text": "a"}, {"text": "b", "id": 1}], chunk_rows=2)
        >>> reader.reset(); next(reader).to_pylist()
        [{'text': 'a', 'id': None}, {'text': 'b', 'id': 1}]
    """

    JSON_COLUMNS = True  # takes json_columns
    STATE = StateSchema("IterableReader", 2, epoch=Int(0), position=Int(0))  # position: items consumed, all consumers'

    def __init__(
        self, *, iterable: Iterable[Mapping[str, Any]], json_columns: Sequence[str] = (), **reader: Any
    ) -> None:
        super().__init__(**reader)
        if not isinstance(iterable, Iterable) or isinstance(iterable, (str, bytes, Mapping)):
            raise TypeError(f"`iterable` must be an iterable of dicts, but is a {type(iterable).__name__} instead.")
        self.iterable = iterable
        self.json_columns = tuple(json_columns)
        self._position = 0  # items of the iterable consumed this epoch, all consumers' included
        self._items: Iterator[Any] = iter(())
        self._schema: pa.Schema | None = None
        self._started = False

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        super().reset(initial_state)
        if initial_state is None:
            self._epoch, self._position = self._epoch + 1, 0
        else:
            loaded = self.STATE.check(initial_state, self._settings(), stage=type(self).__name__)
            self._epoch, self._position = loaded.epoch, loaded.position
        if self._started and iter(self.iterable) is self.iterable:
            raise ValueError(
                "from_iterable got a one-shot iterator (such as a generator), which cannot be read again for "
                "another epoch or a resume; pass a list or an object whose __iter__ starts over instead."
            )
        self._started = True
        self._items = iter(self.iterable)
        self._schema = None
        skipped = self._mine(islice(self._items, self._position), 0)
        first = [row for _, row in islice(skipped, self.chunk_rows)]  # the epoch's first chunk, for its schema
        for _ in skipped:
            pass
        if first:
            self._schema = self._to_batch(first, 0).schema

    def next(self) -> pa.RecordBatch:
        with self.stats.timer("read"):
            start = self._position
            rows = [row for _, row in islice(self._mine(self._items, start), self.chunk_rows)]
            if not rows:
                raise StopIteration
            batch = self._to_batch(rows, start)
            if self._schema is None:
                self._schema = batch.schema
            batch = conform(batch, self._schema, where=self._where(start), reference="the epoch's first chunk")
        self.stats.add("read.rows", batch.num_rows)
        return batch

    def get_state(self) -> dict[str, Any]:
        return self.STATE.make(self._settings(), epoch=self._epoch, position=self._position)

    # -- helpers ------------------------------------------------------------------------------------
    def _mine(self, items: Iterator[Any], start: int) -> Iterator[tuple[int, Mapping[str, Any]]]:
        """This consumer's ``(position, item)`` pairs; advances ``_position`` past every item read."""
        count, index = self.detect().count, self.detect().index
        for position, item in enumerate(items, start):
            self._position = position + 1
            if position % count != index:
                continue
            if not isinstance(item, Mapping):
                found = type(item).__name__
                raise TypeError(f"from_iterable item {position} is a {found}; expected a dict of column values.")
            yield position, item

    def _to_batch(self, rows: list[Mapping[str, Any]], start: int) -> pa.RecordBatch:
        given, texts = rows, {key: [self._as_text(row.get(key), start) for row in rows] for key in self.json_columns}
        if texts:
            rows = [{k: v for k, v in row.items() if k not in texts} for row in rows]
        try:
            batch = pa.RecordBatch.from_struct_array(pa.array(rows))
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise DataError(f"{self._where(start)}: cannot make a column from the values ({exc}).") from exc
        order = list(dict.fromkeys(key for row in rows for key in row))  # pyarrow 19 orders them otherwise
        batch = batch if batch.schema.names == order else batch.select(order)
        for key, column in texts.items():
            if any(key in row for row in given):
                batch = batch.append_column(pa.field(key, JSON_TEXT), json_text(column))
        return batch

    def _as_text(self, value: Any, start: int) -> str | None:
        """A value of ``json_columns`` as its JSON text, as given (no key added, dropped or reordered by Arrow's
        struct inference)."""
        try:
            return None if value is None else json.dumps(value, ensure_ascii=False)
        except (TypeError, ValueError) as exc:
            raise DataError(f"{self._where(start)}: a value of {self.json_columns} is not JSON ({exc}).") from exc

    def _where(self, start: int) -> str:
        return f"from_iterable items {start}-{self._position - 1}"

    def _settings(self) -> dict[str, Any]:
        settings = self.reader_settings(f"from_iterable {type(self.iterable).__name__}")
        return settings | ({"json_columns": list(self.json_columns)} if self.json_columns else {})
