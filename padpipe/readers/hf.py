"""Read Hugging Face ``datasets``: a ``Dataset`` through its Arrow table, an ``IterableDataset`` by streaming."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa

from padpipe._optional import require
from padpipe.readers.format import Format
from padpipe.readers.schema import check_columns, require_columns
from padpipe.readers.source import DEFAULT_CHUNK_ROWS, ReaderNode, UnitSource, WorkUnit
from padpipe.state import Int, Plain, StateSchema

DATASET_LABEL = "<datasets.Dataset>"
ITERABLE_LABEL = "<datasets.IterableDataset>"
FINGERPRINT = ("datasets.arrow_dataset", "Dataset", "_fingerprint")
"""datasets' private name this reader reads (tests/integrations/test_contacts.py pins it): a ``Dataset``'s content
digest, saved in the state's ``input`` setting so a state of another dataset is refused."""


def hf_reader(dataset: Any, *, columns: Sequence[str] | None) -> tuple[type, dict[str, Any]]:
    """The reader class and its options for a ``datasets`` object (used by :func:`padpipe.from_hf`).

    Args:
        dataset: A ``datasets.Dataset`` or ``datasets.IterableDataset``.
        columns: Columns to read (default: all).

    Raises:
        ValueError: For a ``DatasetDict``/``IterableDatasetDict``: pick a split first.
        TypeError: For anything else.
        MissingDependencyError: When ``datasets`` is not installed (``pip install 'padpipe[hf]'``).
        DataError: When a requested column is not in the dataset.

    Example:
        >>> ds = datasets.Dataset.from_dict({"text": ["a"], "label": [0]})
        >>> hf_reader(ds, columns=["text"])[0].__name__
        'HFDatasetReader'
    """
    columns = check_columns(columns)
    datasets = require("datasets", "pp.from_hf()")
    if isinstance(dataset, (datasets.DatasetDict, datasets.IterableDatasetDict)):
        splits = list(dataset)
        raise ValueError(
            f"`dataset` must be one split, but is a {type(dataset).__name__} with splits {splits!r}; "
            f"pass dataset[{(splits or ['train'])[0]!r}] instead."
        )
    if isinstance(dataset, datasets.Dataset):
        require_columns(DATASET_LABEL, dataset.column_names, columns)
        return HFDatasetReader, {"dataset": dataset, "columns": columns}
    if isinstance(dataset, datasets.IterableDataset):
        if dataset.column_names is not None:
            require_columns(ITERABLE_LABEL, dataset.column_names, columns)
        return HFIterableReader, {"dataset": dataset, "columns": columns}
    raise TypeError(
        f"`dataset` must be a datasets.Dataset or datasets.IterableDataset, but is a {type(dataset).__name__} instead."
    )


class HFDatasetReader(UnitSource):
    """A ``datasets.Dataset`` as record batches, sliced from its Arrow table (zero-copy).

    Units are index ranges of ``UNIT_CHUNKS * chunk_rows`` rows, each chunk
    ``dataset.with_format("arrow")[a:b]`` (one vectorized ``take`` where an indices mapping is).

    Args:
        dataset: The dataset (in memory or memory-mapped from its cache files).
        columns: Columns to read, in this order (default: all).
        **reader: :class:`~padpipe.readers.source.ReaderNode`'s arguments.

    Example:
        >>> ds = datasets.Dataset.from_dict({"n": [0, 1, 2]})
        >>> reader = HFDatasetReader(dataset=ds, chunk_rows=2); reader.reset()
        >>> [b.to_pylist() for b in reader]
        [[{'n': 0}, {'n': 1}], [{'n': 2}]]
    """

    UNIT_CHUNKS = 8

    def __init__(self, *, dataset: Any, columns: Sequence[str] | None = None, **reader: Any) -> None:
        self.columns = check_columns(columns)
        require_columns(DATASET_LABEL, dataset.column_names, self.columns)
        self.dataset = dataset
        rows = reader.get("chunk_rows", DEFAULT_CHUNK_ROWS)
        super().__init__(
            DatasetFormat(dataset, columns=self.columns, unit_rows=self.UNIT_CHUNKS * rows, chunk_rows=rows), **reader
        )


class DatasetFormat(Format):
    """A ``datasets.Dataset``'s index ranges of ``unit_rows`` rows, sliced ``chunk_rows`` at a time (see
    :class:`HFDatasetReader`)."""

    def __init__(self, dataset: Any, *, columns: Sequence[str] | None, unit_rows: int, chunk_rows: int) -> None:
        self.dataset, self.columns, self.unit_rows, self.chunk_rows = dataset, columns, unit_rows, chunk_rows
        self._view: Any = None

    def describe(self) -> str:
        module, cls, name = FINGERPRINT
        fingerprint = getattr(self.dataset, name, None)
        if not isinstance(fingerprint, str):
            raise TypeError(
                f"padpipe's from_hf reads a datasets.Dataset's `{name}` ({module}.{cls}: what a resumed state is "
                f"checked against), but this {type(self.dataset).__name__} has {fingerprint!r}: install a datasets "
                "release padpipe was tested with or a padpipe release for yours."
            )
        return f"from_hf Dataset fingerprint={fingerprint} rows={len(self.dataset)} columns={self.columns!r}"

    def list_units(self) -> list[WorkUnit]:
        dataset = self.dataset if self.columns is None else self.dataset.select_columns(list(self.columns))
        self._view = dataset.with_format("arrow")
        total, size = len(dataset), self.unit_rows
        return [
            WorkUnit(DATASET_LABEL, i, num_rows=min(size, total - start), start=start, stop=min(start + size, total))
            for i, start in enumerate(range(0, total, size))
        ]

    def piece(self, unit: WorkUnit, lo: int, hi: int) -> WorkUnit:
        """Rows ``lo`` to ``hi`` of the unit, as a narrower index range."""
        return dataclasses.replace(unit, num_rows=hi - lo, start=unit.start + lo, stop=unit.start + hi)

    def read_unit(self, unit: WorkUnit, start_row: int) -> Iterator[pa.RecordBatch]:
        assert unit.stop is not None
        begin = unit.start + start_row
        while begin < unit.stop:
            end = min(unit.start + (start_row // self.chunk_rows + 1) * self.chunk_rows, unit.stop)
            table = self._view[begin:end]
            yield table.combine_chunks().to_batches()[0]
            start_row += end - begin
            begin = end


class HFIterableReader(ReaderNode):
    """A streaming ``datasets.IterableDataset`` as record batches of ``chunk_rows`` rows.

    Reads ``dataset.with_format("arrow").iter(batch_size=chunk_rows)``; a consumer takes
    ``dataset.shard(num_shards=count, index=index)`` when there are enough shards, else every
    ``count``-th batch of the whole stream. Each epoch calls ``set_epoch(epoch)`` on a copy, as
    under a ``DataLoader`` (shuffle with ``dataset.shuffle(seed=...)``). The state holds the epoch
    and the dataset's own ``state_dict()``: resume is exact without a shuffle buffer; with one, the
    rows in it are lost, as ``datasets`` documents for its own resume.

    Args:
        dataset: The iterable dataset (not split by node already: the consumer split is done here).
        columns: Columns to read (default: all).
        **reader: :class:`~padpipe.readers.source.ReaderNode`'s arguments (``seed`` unused, see above).

    Example:
        >>> ds = datasets.Dataset.from_dict({"n": [0, 1, 2]}).to_iterable_dataset()
        >>> reader = HFIterableReader(dataset=ds, chunk_rows=2); reader.reset()
        >>> [b.to_pylist() for b in reader]
        [[{'n': 0}, {'n': 1}], [{'n': 2}]]
    """

    STATE = StateSchema("HFIterableReader", 2, epoch=Int(0), batch=Int(0), dataset=Plain())  # dataset: its own state

    def __init__(self, *, dataset: Any, columns: Sequence[str] | None = None, **reader: Any) -> None:
        super().__init__(**reader)
        self.columns = check_columns(columns)
        if dataset.column_names is not None:
            require_columns(ITERABLE_LABEL, dataset.column_names, self.columns)
        self.dataset = dataset
        self._batch = 0  # batches of the stream seen this epoch (all consumers' when stepping)
        self._step = 1
        self._stream: Any = None
        self._batches: Iterator[pa.Table] = iter(())

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        super().reset(initial_state)
        saved = None
        if initial_state is None:
            self._epoch, self._batch = self._epoch + 1, 0
        else:
            loaded = self.STATE.check(initial_state, self._settings(), stage=type(self).__name__)
            self._epoch, self._batch, saved = loaded.epoch, loaded.batch, loaded.dataset
        stream, consumer = self.dataset, self.detect()
        self._step = consumer.count if stream.num_shards < consumer.count else 1
        if consumer.count > 1 and self._step == 1:
            stream = stream.shard(num_shards=consumer.count, index=consumer.index)
        if self.columns is not None:
            stream = stream.select_columns(list(self.columns))
        stream = stream.with_format("arrow")  # a new object: the user's dataset is never changed
        stream.set_epoch(self._epoch)
        if saved is not None:
            stream.load_state_dict(saved)
        self._stream = stream
        self._batches = iter(stream.iter(batch_size=self.chunk_rows))

    def next(self) -> pa.RecordBatch:
        while True:
            with self.stats.timer("read"):
                table = next(self._batches, None)
            if table is None:
                raise StopIteration
            mine = self._batch % self._step == self.detect().index % self._step
            self._batch += 1
            if mine and table.num_rows:
                self.stats.add("read.rows", table.num_rows)
                return table.combine_chunks().to_batches()[0]

    def get_state(self) -> dict[str, Any]:
        return self.STATE.make(
            self._settings(), epoch=self._epoch, batch=self._batch, dataset=self._stream.state_dict()
        )

    def _settings(self) -> dict[str, Any]:
        dataset = self.dataset
        return self.reader_settings(
            f"IterableDataset columns={dataset.column_names} shards={dataset.num_shards} {self.columns}"
        )
