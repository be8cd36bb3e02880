"""The tokens stage (padpipe/pipes/tokens.py): already tokenized rows enter as tokens.

A pre-tokenized ``datasets.Dataset`` (``dataset.map(tokenizer, batched=True)`` with the shipped
tokenizer) gives through bucket+pad and pack batches tensor-equal to the same rows through
``.tokenize()``; Parquet and JSONL list columns work alike; the padding of an earlier
tokenization is dropped; errors name the column and the row; resume is exact.
"""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import padpipe as pp
from padpipe.errors import DataError
from padpipe.pipes.tokens import TokenColumns
from padpipe.stats import PipelineStats
from tests.contract import check_loader_resume, check_node_resume

os.environ.setdefault("HF_HUB_OFFLINE", "1")
datasets = pytest.importorskip("datasets")
transformers = pytest.importorskip("transformers")

PAIRS = ("sentence1", "sentence2")


@pytest.fixture(scope="module")
def hf_tok() -> Any:
    return transformers.PreTrainedTokenizerFast(tokenizer_file=pp.examples.TOKENIZER_JSON)


@pytest.fixture(scope="module")
def sample() -> Any:
    return datasets.Dataset(pq.read_table(pp.examples.SAMPLE_PARQUET).slice(0, 1500))


def equal_batches(a: list[dict], b: list[dict]) -> None:
    assert len(a) == len(b) > 1
    for x, y in zip(a, b):
        assert sorted(x) == sorted(y)
        for key in x:
            if isinstance(x[key], torch.Tensor):
                assert x[key].dtype == y[key].dtype and torch.equal(x[key], y[key]), key
            else:
                assert x[key] == y[key], key


def test_tokens_works() -> None:
    batch = pa.RecordBatch.from_pylist(
        [
            {"input_ids": [2, 7, 3], "token_type_ids": [0, 0, 1], "attention_mask": [1, 1, 1], "label": 1, "idx": 4},
            {"input_ids": [], "token_type_ids": [], "attention_mask": [], "label": 0, "idx": 5},
            {"input_ids": [2, 9], "token_type_ids": [0, 1], "attention_mask": [1, 1], "label": 1, "idx": 6},
        ]
    )
    stats = PipelineStats()
    chunk = TokenColumns(stats=stats)(batch)
    assert chunk.ids.dtype == np.int32 and chunk.ids.tolist() == [2, 7, 3, 2, 9]
    assert chunk.offsets.tolist() == [0, 3, 3, 5]
    assert chunk.type_ids.dtype == np.int8 and chunk.type_ids.tolist() == [0, 0, 1, 0, 1]
    assert list(chunk.columns) == ["labels", "idx"]
    assert chunk.columns["labels"].to_pylist() == [1, 0, 1] and chunk.columns["idx"].to_pylist() == [4, 5, 6]
    assert stats.snapshot().counters["tokens.tokens"] == 5


def test_tokens_drops_earlier_padding_and_truncates_with_type_ids_and_token_labels() -> None:
    batch = pa.RecordBatch.from_pydict(
        {
            "ids": [[0, 0, 5, 6, 7], [8, 9, 0, 0, 0], [1, 2, 3, 4, 5]],
            "types": [[0, 0, 0, 1, 1], [0, 1, 0, 0, 0], [0, 0, 1, 1, 1]],
            "attention_mask": [[0, 0, 1, 1, 1], [1, 1, 0, 0, 0], [1, 1, 1, 1, 1]],
            "labels": [[-100, -100, 15, 16, 17], [18, 19, -100, -100, -100], [11, 12, 13, 14, 15]],
        }
    )
    chunk = TokenColumns(column="ids", type_ids="types", max_length=2)(batch)
    assert chunk.ids.tolist() == [5, 6, 8, 9, 1, 2] and chunk.offsets.tolist() == [0, 2, 4, 6]
    assert chunk.type_ids.tolist() == [0, 1, 0, 1, 0, 0]
    assert chunk.columns["labels"].to_pylist() == [[15, 16], [18, 19], [11, 12]]
    assert list(chunk.columns) == ["labels"]


@pytest.mark.parametrize("kind", [pa.list_view, pa.large_list_view])
def test_tokens_reads_list_view_columns_as_lists_so_pack_keeps_their_masks(tmp_path: Path, kind) -> None:
    """Arrow IPC (DuckDB, Velox) may hold list views: ``labels`` as one was passed through as a class label before,
    and pack() trained the masked prompt tokens (labels [-100, 2, 3, 4, -100, 6, 7])."""
    table = pa.table(
        {
            "input_ids": pa.array([[1, 2, 3, 4], [5, 6, 7]], kind(pa.int32())),
            "labels": pa.array([[-100, -100, 3, 4], [-100, -100, 7]], kind(pa.int64())),
        }
    )
    with pa.ipc.new_file(tmp_path / "rows.arrow", table.schema) as writer:
        writer.write_table(table)
    (batch,) = pp.read_arrow(str(tmp_path / "rows.arrow")).tokens(pad_id=0).pack(8).loader()
    assert batch["labels"].tolist() == [[-100, -100, 3, 4, -100, -100, 7, -100]]


@pytest.mark.parametrize("max_length", [None, 24])
def test_tokens_bucket_and_pad_equal_tokenize_on_a_pretokenized_dataset(hf_tok, sample, max_length) -> None:
    def encode(rows: dict) -> dict:
        return hf_tok(
            rows["sentence1"],
            rows["sentence2"],
            return_token_type_ids=True,
            truncation=max_length is not None,
            max_length=max_length,
        )

    mapped = sample.map(encode, batched=True, remove_columns=list(PAIRS))
    assert mapped.features["input_ids"].feature.dtype == "int32"
    pipe = pp.from_hf(mapped, tokens="input_ids", chunk_rows=256)
    got = list(pipe.bucket(batch_size=64, seed=3).pad(pad_id=0).loader())
    text = pp.from_hf(sample, chunk_rows=256).tokenize(pp.examples.tokenizer(), fields=PAIRS, max_length=max_length)
    want = list(text.bucket(batch_size=64, seed=3).pad().loader())
    equal_batches(got, want)
    assert sorted(got[0]) == ["attention_mask", "idx", "input_ids", "labels", "token_type_ids"]


def test_tokens_pack_equals_tokenize_on_a_pretokenized_dataset(hf_tok, sample) -> None:
    mapped = sample.map(lambda rows: hf_tok(rows["sentence1"]), batched=True, remove_columns=list(PAIRS))
    assert "token_type_ids" not in mapped.column_names
    got = list(pp.from_hf(mapped, tokens="input_ids").pack(128, batch_size=4, pad_id=0).loader())
    text = pp.from_hf(sample).tokenize(pp.examples.tokenizer(), fields="sentence1")
    equal_batches(got, list(text.pack(128, batch_size=4).loader()))


@pytest.mark.parametrize("side", ["right", "left"])
def test_tokens_drop_the_padding_of_a_padded_pretokenized_dataset(sample, side) -> None:
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_file=pp.examples.TOKENIZER_JSON, pad_token="[PAD]", padding_side=side
    )
    padded = sample.map(
        lambda rows: tok(rows["sentence1"], padding="longest"), batched=True, batch_size=100, remove_columns=list(PAIRS)
    )
    assert min(map(min, padded["attention_mask"])) == 0  # really padded
    got = list(pp.from_hf(padded, tokens="input_ids").batch(50).pad(pad_id=0).loader())
    text = pp.from_hf(sample, columns=["sentence1", "label", "idx"]).tokenize(
        pp.examples.tokenizer(), fields="sentence1"
    )
    want = list(text.batch(50).pad().loader())
    for batch in want:
        del batch["token_type_ids"]  # the tokenizer behind .tokenize() makes them; this map did not
    equal_batches(got, want)


def write_token_files(tmp_path: Path) -> tuple[list[dict], Path, Path]:
    rows = [{"id": i, "input_ids": list(range(1, 2 + i % 5)), "label": i % 2} for i in range(23)]
    table = pa.Table.from_pylist(
        rows, schema=pa.schema([("id", pa.int64()), ("input_ids", pa.list_(pa.int32())), ("label", pa.int64())])
    )
    parquet = tmp_path / "tokens.parquet"
    pq.write_table(table, parquet, row_group_size=8)
    jsonl = tmp_path / "tokens.jsonl.gz"
    jsonl.write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in rows).encode()))
    return rows, parquet, jsonl


def test_tokens_works_on_parquet_and_jsonl_list_columns(tmp_path: Path) -> None:
    rows, parquet, jsonl = write_token_files(tmp_path)
    for pipe in (pp.read_parquet(str(parquet)), pp.read_jsonl(str(jsonl))):
        batches = list(pipe.tokens(pad_id=0).batch(10).pad().loader())
        assert [len(b["input_ids"]) for b in batches] == [10, 10, 3]
        flat = [row[: int(n)] for b in batches for row, n in zip(b["input_ids"].tolist(), b["attention_mask"].sum(1))]
        assert flat == [r["input_ids"] for r in rows]
        assert torch.cat([b["labels"] for b in batches]).tolist() == [r["label"] for r in rows]
        assert torch.cat([b["id"] for b in batches]).tolist() == list(range(23))


def test_tokens_saves_and_restores_its_state_through_a_loader(tmp_path: Path) -> None:
    _, parquet, jsonl = write_token_files(tmp_path)
    chunks = pp.read_parquet(str(parquet), chunk_rows=4).tokens(max_length=3)  # loader() asks for pad/pack: the nodes
    check_node_resume(lambda: chunks.build(consumer=pp.Consumer()), epochs=2)
    pipe = pp.read_jsonl(str(jsonl), chunk_rows=5).shuffle(buffer_size=7, seed=1).tokens(pad_id=0)
    check_loader_resume(lambda: pipe.bucket(batch_size=3, buffer_size=6).pad().loader(), epochs=2)
    check_loader_resume(lambda: pipe.pack(6, batch_size=2, buffer_size=4).loader(), epochs=2)


def test_tokens_reads_the_same_through_dataloader_workers(tmp_path: Path) -> None:
    _, parquet, _ = write_token_files(tmp_path)
    pipe = pp.read_parquet(str(parquet), chunk_rows=4).tokens(pad_id=0).batch(4).pad()
    batches = list(torch.utils.data.DataLoader(pipe, batch_size=None, num_workers=2))
    rows = sorted(ids[mask.bool()].tolist() for b in batches for ids, mask in zip(b["input_ids"], b["attention_mask"]))
    assert rows == sorted(list(range(1, 2 + i % 5)) for i in range(23))


def bad(**columns: Any) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({"idx": list(range(10, 10 + len(next(iter(columns.values()))))), **columns})


@pytest.mark.parametrize(
    ("batch", "options", "message"),
    [
        (
            bad(text=["a"]),
            {},
            r"^tokens: column 'input_ids' is not in the data; expected one of the columns "
            r"\['idx', 'text'\]\.$",
        ),
        (
            bad(input_ids=["1 2"]),
            {},
            r"^tokens: column 'input_ids' has type string; expected a list of integers "
            r"\(token ids\)\.$",
        ),
        (
            bad(input_ids=[[1.0, 2.0]]),
            {},
            r"^tokens: column 'input_ids' has type list<item: double>; expected a list "
            r"of integers \(token ids\)\.$",
        ),
        (
            bad(input_ids=[[1], None]),
            {},
            r"^tokens: column 'input_ids' at row 1 of the chunk \(idx=11\) is None; "
            r"expected a list of token ids\.$",
        ),
        (
            bad(input_ids=[[1], [2, None]]),
            {},
            r"^tokens: column 'input_ids' at row 1 of the chunk \(idx=11\) holds a "
            r"null; expected token ids in \[0, 2147483647\]\.$",
        ),
        (
            bad(input_ids=[[1], [3], [2, -1]]),
            {},
            r"^tokens: column 'input_ids' at row 2 of the chunk \(idx=12\) holds "
            r"-1; expected token ids in \[0, 2147483647\]\.$",
        ),
        (
            bad(input_ids=[[2**31]]),
            {},
            r"^tokens: column 'input_ids' at row 0 of the chunk \(idx=10\) holds "
            r"2147483648; expected token ids in \[0, 2147483647\]\.$",
        ),
        (
            bad(input_ids=[[1]], token_type_ids=[[128]]),
            {},
            r"^tokens: column 'token_type_ids' at row 0 of the chunk \(idx=10\) holds 128; expected token type ids in "
            r"\[0, 127\]\.$",
        ),
        (
            bad(input_ids=[[1, 2], [3, 4]], attention_mask=[[1, 1], [1]]),
            {},
            r"^tokens: column 'attention_mask' at row 1 of the chunk \(idx=11\) has 1 values but 'input_ids' has 2; "
            r"expected one per token\.$",
        ),
        (
            bad(input_ids=[[1, 2]], attention_mask=[[1, 2]]),
            {},
            r"^tokens: column 'attention_mask' at row 0 of the chunk \(idx=10\) holds 2; expected attention mask values "
            r"in \[0, 1\]\.$",
        ),
        (
            bad(input_ids=[[1, 2]], labels=[[5]]),
            {},
            r"^tokens: column 'labels' at row 0 of the chunk \(idx=10\) has 1 values but 'input_ids' has 2; expected "
            r"one per token\.$",
        ),
        (
            bad(input_ids=[[1, 2]]),
            dict(type_ids="types"),
            r"^tokens: column 'types' is not in the data; expected one of the columns \['idx', 'input_ids'\]\.$",
        ),
    ],
)
def test_tokens_raises_error_when_the_data_is_bad(batch: pa.RecordBatch, options: dict, message: str) -> None:
    with pytest.raises(DataError, match=message):
        TokenColumns(**options)(batch)


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        (dict(column=3), TypeError, r"^`column` must be a column name, but is 3 instead\.$"),
        (dict(type_ids=["a"]), TypeError, r"^`type_ids` must be a column name, but is \['a'\] instead\.$"),
        (dict(max_length=0), ValueError, r"^`max_length` must be greater than zero, but is 0 instead\.$"),
        (dict(pad_id=True), TypeError, r"^`pad_id` must be an int, but is True instead\.$"),
    ],
)
def test_tokens_raises_error_when_arguments_are_bad(options: dict, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        pp.from_iterable([{"input_ids": [1]}]).tokens(**options)


def test_tokens_pad_and_pack_ask_for_a_pad_id() -> None:
    pipe = pp.from_iterable([{"input_ids": [1, 2]}]).tokens()
    with pytest.raises(
        ValueError,
        match=r"^pad\(\) has no pad id: the rows entered as token ids through tokens\(\), "
        r"with no tokenizer to take one from; pass `pad_id=` to pad\(\) or to "
        r"tokens\(\)\.$",
    ):
        pipe.batch(1).pad()
    with pytest.raises(ValueError, match=r"^pack\(\) has no pad id: .* pass `pad_id=` to pack\(\) or to tokens\(\)\.$"):
        pipe.pack(8)
    with pytest.raises(
        ValueError, match=r"^\.tokens\(\) needs records as input, but this pipeline yields tokens here\.$"
    ):
        pipe.tokens()
    with pytest.raises(TypeError, match=r"^`tokens` must be a column name, but is True instead\.$"):
        pp.from_hf(datasets.Dataset.from_dict({"input_ids": [[1]]}), tokens=True)
    assert next(iter(pipe.pack(4, pad_id=9).loader()))["input_ids"].tolist() == [[1, 2, 9, 9]]


def test_tokens_warns_once_when_labels_look_like_a_mask(caplog: pytest.LogCaptureFixture) -> None:
    """Issue 30 item 7: 0/1 assistant masks passed as labels went through silently (the model learns ids 0 and 1)."""
    masked = [{"input_ids": [2, 7, 9, 3], "labels": [0, 0, 1, 1]}, {"input_ids": [2, 5, 3], "labels": [0, 1, 1]}]
    with caplog.at_level("WARNING", logger="padpipe.tokens"):
        batches = list(pp.from_iterable(masked * 2, chunk_rows=2).tokens(pad_id=0).batch(2).pad().loader())
    assert len(batches) == 2 and [r.getMessage() for r in caplog.records] == [
        "tokens: column 'labels' holds only 0 and 1 in this chunk (its first values [0, 0, 1, 1, 0, 1, 1], where "
        "'input_ids' holds [2, 7, 9, 3, 2, 5, 3]): it looks like a 0/1 mask (e.g. assistant_masks) passed as labels, "
        "which trains the model to predict ids 0 and 1. Token-level labels are the ids to predict, -100 where no loss "
        "is taken: labels = [id if m else -100 for id, m in zip(input_ids, mask)]. (Classes of a token classification "
        "model: ignore this; logged once.)"
    ]
    caplog.clear()
    fine = [
        {"input_ids": [2, 7, 9, 3], "labels": [-100, -100, 9, 3]},  # real labels: ids and -100
        {"input_ids": [2, 7, 9, 3], "labels": [-100, 0, 1, 1]},  # -100 among them: not a mask
        {"input_ids": [1, 0, 1], "labels": [0, 1, 1]},  # ids of 0 and 1 too: labels may be ids
    ]
    with caplog.at_level("WARNING", logger="padpipe.tokens"):
        for row in fine:
            list(pp.from_iterable([row]).tokens(pad_id=0).batch(1).pad().loader())
    assert caplog.records == []
