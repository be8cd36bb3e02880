"""The whole pipeline on every kind of source: exact tokens, every row once, honest padding.

Each source (Parquet, Arrow file and stream, a ``save_to_disk`` folder, gzipped JSONL, a
``datasets.Dataset``, a streaming ``datasets.IterableDataset``, a list) feeds
``shuffle -> tokenize -> bucket(max_tokens) -> pad`` for two epochs, for sentence pairs and single
texts. Every batch is checked against the ``transformers`` tokenizer's own output row by row.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from pathlib import Path

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import padpipe as pp

ROWS = 240
MAX_LENGTH = 64
MAX_TOKENS = 1024
MULTIPLE = 8


@pytest.fixture(scope="module")
def table() -> pa.Table:
    sample = pq.read_table(pp.examples.SAMPLE_PARQUET).slice(0, ROWS)
    return sample.set_column(sample.schema.get_field_index("idx"), "idx", pa.array(range(ROWS), pa.int64()))


@pytest.fixture(scope="module")
def tokenizer():
    return pp.examples.hf_tokenizer()


def _parquet(table: pa.Table, d: Path) -> pp.Pipeline:
    pq.write_table(table, d / "data.parquet", row_group_size=50)
    return pp.read_parquet(str(d / "data.parquet"), chunk_rows=32)


def _arrow_file(table: pa.Table, d: Path) -> pp.Pipeline:
    with pa.ipc.new_file(d / "data.arrow", table.schema) as writer:
        for batch in table.to_batches(max_chunksize=60):
            writer.write_batch(batch)
    return pp.read_arrow(str(d / "data.arrow"))


def _arrow_stream(table: pa.Table, d: Path) -> pp.Pipeline:
    with pa.ipc.new_stream(d / "data.arrow", table.schema) as writer:
        for batch in table.to_batches(max_chunksize=60):
            writer.write_batch(batch)
    return pp.read_arrow(str(d / "data.arrow"))


def _save_to_disk(table: pa.Table, d: Path) -> pp.Pipeline:
    datasets.Dataset(table).save_to_disk(str(d / "saved"), num_shards=3)
    return pp.read_arrow(str(d / "saved"))


def _jsonl_gz(table: pa.Table, d: Path) -> pp.Pipeline:
    with gzip.open(d / "data.jsonl.gz", "wt") as f:
        for row in table.to_pylist():
            f.write(json.dumps(row) + "\n")
    return pp.read_jsonl(str(d / "data.jsonl.gz"))


def _hf_dataset(table: pa.Table, d: Path) -> pp.Pipeline:
    return pp.from_hf(datasets.Dataset(table), chunk_rows=40)


def _hf_iterable(table: pa.Table, d: Path) -> pp.Pipeline:
    return pp.from_hf(datasets.Dataset(table).to_iterable_dataset(num_shards=4), chunk_rows=40)


def _iterable(table: pa.Table, d: Path) -> pp.Pipeline:
    return pp.from_iterable(table.to_pylist(), chunk_rows=40)


SOURCES: dict[str, Callable[[pa.Table, Path], pp.Pipeline]] = {
    "parquet": _parquet,
    "arrow_file": _arrow_file,
    "arrow_stream": _arrow_stream,
    "save_to_disk": _save_to_disk,
    "jsonl_gz": _jsonl_gz,
    "hf_dataset": _hf_dataset,
    "hf_iterable": _hf_iterable,
    "iterable": _iterable,
}


def _expected(table: pa.Table, tokenizer, fields: tuple[str, ...]) -> dict[int, dict[str, list[int]]]:
    texts = [table.column(f).to_pylist() for f in fields]
    enc = tokenizer(*texts, truncation=True, max_length=MAX_LENGTH)
    return {i: {k: enc[k][i] for k in ("input_ids", "token_type_ids")} for i in range(table.num_rows)}


@pytest.mark.parametrize("fields", [("sentence1", "sentence2"), ("sentence1",)], ids=["pairs", "single"])
@pytest.mark.parametrize("source", list(SOURCES))
def test_pipeline_works_end_to_end(source: str, fields: tuple[str, ...], table, tokenizer, tmp_path: Path) -> None:
    pipe = (
        SOURCES[source](table, tmp_path)
        .shuffle(buffer_size=100, seed=1)
        .tokenize(tokenizer, fields=fields, max_length=MAX_LENGTH)
        .bucket(max_tokens=MAX_TOKENS, buffer_size=120)
        .pad(pad_to_multiple_of=MULTIPLE)
    )
    expected = _expected(table, tokenizer, fields)
    labels = table.column("label").to_pylist()
    loader = pipe.loader()
    orders = []
    for _ in range(2):
        order: list[int] = []
        for batch in loader:
            ids, mask = batch["input_ids"], batch["attention_mask"]
            rows, width = ids.shape
            lengths = mask.sum(1)
            assert ids.dtype == torch.int64 and width % MULTIPLE == 0
            assert width == -(-int(lengths.max()) // MULTIPLE) * MULTIPLE, "padded to the batch max, rounded"
            assert rows * width <= MAX_TOKENS, "the padded-token budget is never exceeded"
            assert bool((ids[mask == 0] == tokenizer.pad_token_id).all())
            for r, idx in enumerate(batch["idx"].tolist()):
                n = int(lengths[r])
                assert bool(mask[r, :n].all()) and not bool(mask[r, n:].any()), "right padding"
                assert ids[r, :n].tolist() == expected[idx]["input_ids"]
                assert batch["token_type_ids"][r, :n].tolist() == expected[idx]["token_type_ids"]
                assert int(batch["labels"][r]) == labels[idx]
            order.extend(batch["idx"].tolist())
        assert sorted(order) == list(range(ROWS)), "every row exactly once per epoch"
        orders.append(order)
    assert orders[0] != orders[1], "each pass over the loader is a new, differently shuffled epoch"
    stats = loader.stats()
    assert stats.rows == 2 * ROWS and stats.padding_efficiency > 0.75
