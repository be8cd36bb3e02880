"""The GLUE recipe on small local data in GLUE's schema: every task's fields, splits, order, errors, CLI."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import datasets
import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

import padpipe as pp
from padpipe.errors import DataError
from padpipe.recipes.glue import TASKS, glue, main

TOKENIZER = pp.examples.tokenizer()
WORDS = "the a film cat sat on mat quick brown fox jumps over lazy dog good bad plot was really not".split()


def texts(n: int, seed: int) -> list[str]:
    """``n`` sentences of 1 to 30 words (varied lengths, so bucketing has something to sort)."""
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(1, 31)))) for _ in range(n)]


def make_split(task: str, split: str, n: int, seed: int = 0) -> datasets.Dataset:
    """A split of ``task`` in the ``nyu-mll/glue`` schema: its fields, ``label`` and ``idx``."""
    spec = TASKS[task]
    columns: dict[str, list] = {f: texts(n, seed + k) for k, f in enumerate(spec.fields)}
    features = {f: datasets.Value("string") for f in spec.fields}
    if spec.label == "float":
        columns["label"] = [round(5 * i / max(n - 1, 1), 3) for i in range(n)]
        features["label"] = datasets.Value("float32")
    else:
        columns["label"] = [-1] * n if split.startswith("test") else [i % 3 for i in range(n)]
        features["label"] = datasets.Value("int64")
    columns["idx"] = list(range(n))
    features["idx"] = datasets.Value("int32")
    return datasets.Dataset.from_dict(columns, features=datasets.Features(features))


def make_dict(task: str, n: int = 12) -> datasets.DatasetDict:
    return datasets.DatasetDict({s: make_split(task, s, n, seed=10 * k) for k, s in enumerate(TASKS[task].splits)})


def encode(dataset: datasets.Dataset, task: str, row: int) -> list[int]:
    return TOKENIZER.encode(*(dataset[row][f] for f in TASKS[task].fields)).ids


def read_all(pipe: pp.Pipeline) -> list[dict]:
    return list(pipe.loader())


def rows_of(batches: list[dict], key: str) -> dict[int, tuple[list[int], object]]:
    """Each row's real tokens and label, by the value of ``key`` (``row_index`` or ``idx``)."""
    out: dict[int, tuple[list[int], object]] = {}
    for batch in batches:
        for i, name in enumerate(batch[key].tolist()):
            assert name not in out, f"row {name} came twice"
            ids = batch["input_ids"][i][batch["attention_mask"][i].bool()].tolist()
            out[name] = (ids, batch["labels"][i].item())
    return out


def normalized(batches: list[dict]) -> list[dict]:
    return [{k: v.tolist() for k, v in sorted(b.items())} for b in batches]


# -- every task and split -------------------------------------------------------------------------
@pytest.mark.parametrize("task", sorted(TASKS))
def test_glue_works_for_every_task_and_split(task: str) -> None:
    data = make_dict(task)
    for split in TASKS[task].splits:
        batches = read_all(glue(task, split, TOKENIZER, data=data, batch_size=5))
        key = "idx" if split == "train" else "row_index"
        got = rows_of(batches, key)
        dataset = data[split]
        assert sorted(got) == list(range(len(dataset)))
        assert {r: got[r][0] for r in got} == {r: encode(dataset, task, r) for r in range(len(dataset))}
        labels = torch.cat([b["labels"] for b in batches])
        assert labels.dtype == (torch.float32 if task == "stsb" else torch.int64)
        assert {r: got[r][1] for r in got} == pytest.approx({r: dataset[r]["label"] for r in range(len(dataset))})
        expected_keys = ["attention_mask", "idx", "input_ids", "labels", "token_type_ids"]
        assert sorted(batches[0]) == sorted(expected_keys + ([] if split == "train" else ["row_index"]))
        assert all(b["input_ids"].shape[1] % 8 == 0 for b in batches)


def test_glue_gives_stsb_float_labels_as_float32() -> None:
    data = datasets.DatasetDict(validation=make_split("stsb", "validation", 6))
    batches = read_all(glue("stsb", "validation", TOKENIZER, data=data, batch_size=6))
    (batch,) = batches
    assert batch["labels"].dtype == torch.float32
    by_row = dict(zip(batch["row_index"].tolist(), batch["labels"].tolist()))
    assert by_row == pytest.approx({0: 0.0, 1: 1.0, 2: 2.0, 3: 3.0, 4: 4.0, 5: 5.0})


def test_glue_reads_mnli_matched_and_mismatched_splits() -> None:
    data = make_dict("mnli")
    for split in ("validation_matched", "validation_mismatched", "test_matched", "test_mismatched"):
        got = rows_of(read_all(glue("mnli", split, TOKENIZER, data=data)), "row_index")
        assert {r: ids for r, (ids, _) in got.items()} == {r: encode(data[split], "mnli", r) for r in range(12)}
    assert data["validation_matched"]["premise"] != data["validation_mismatched"]["premise"]


def test_glue_keeps_test_labels_at_minus_one() -> None:
    batches = read_all(glue("rte", "test", TOKENIZER, data=make_dict("rte")))
    assert torch.cat([b["labels"] for b in batches]).tolist() == [-1] * 12


# -- evaluation order -----------------------------------------------------------------------------
@pytest.mark.parametrize("size", [dict(batch_size=8), dict(max_tokens=256)])
def test_glue_sorts_eval_splits_by_length_and_scatters_back_by_row_index(size: dict) -> None:
    dataset = make_split("sst2", "validation", 101, seed=3)
    batches = read_all(glue("sst2", "validation", TOKENIZER, data=datasets.DatasetDict(validation=dataset), **size))
    lengths = torch.cat([b["attention_mask"].sum(1) for b in batches]).tolist()
    assert lengths == sorted(lengths)  # the whole split sorted at once: shortest first
    if "max_tokens" in size:
        assert all(b["input_ids"].numel() <= 256 for b in batches)
    else:
        assert [len(b["row_index"]) for b in batches] == [8] * 12 + [5]  # nothing dropped
    # a "model" whose prediction is the sum of a row's token ids, scattered back by row_index
    predictions = torch.full((len(dataset),), -1, dtype=torch.int64)
    seen = torch.zeros(len(dataset), dtype=torch.int64)
    for batch in batches:
        predictions[batch["row_index"]] = (batch["input_ids"] * batch["attention_mask"]).sum(1)
        seen[batch["row_index"]] += 1
    assert seen.tolist() == [1] * len(dataset)
    assert predictions.tolist() == [sum(encode(dataset, "sst2", r)) for r in range(len(dataset))]


def test_glue_numbers_rows_of_a_shuffled_or_selected_dataset_by_their_position() -> None:
    dataset = make_split("cola", "validation", 20).shuffle(seed=1).select(range(7))
    got = rows_of(read_all(glue("cola", "validation", TOKENIZER, data=dataset)), "row_index")
    assert {r: ids for r, (ids, _) in got.items()} == {r: encode(dataset, "cola", r) for r in range(7)}


# -- train shuffling ------------------------------------------------------------------------------
def train_order(seed: int, epochs: int = 2) -> list[list[int]]:
    data = datasets.DatasetDict(train=make_split("qnli", "train", 60, seed=5))
    loader = glue("qnli", "train", TOKENIZER, data=data, batch_size=4, seed=seed, buffer_size=16).loader()
    return [[i for b in loader for i in b["idx"].tolist()] for _ in range(epochs)]


def test_glue_shuffles_train_deterministically_for_a_seed() -> None:
    first, again, other = train_order(0), train_order(0), train_order(1)
    assert first == again
    assert first != other
    assert first[0] != first[1]  # each epoch its own order
    assert all(sorted(epoch) == list(range(60)) for epoch in first + other)
    assert first[0] != list(range(60))


# -- data forms -----------------------------------------------------------------------------------
def write_parquet_export(root: Path, data: datasets.DatasetDict, layout: str) -> None:
    for split, dataset in data.items():
        path = root / layout.format(split=split)
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(dataset.data.table, path)


@pytest.mark.parametrize(
    "form", ["save_to_disk dict", "save_to_disk dataset", "parquet", "parquet folders", "parquet task folder"]
)
def test_glue_reads_local_folders_like_the_datasets(tmp_path: Path, form: str) -> None:
    data = make_dict("mrpc", n=30)
    if form == "save_to_disk dict":
        data.save_to_disk(str(tmp_path))
    elif form == "save_to_disk dataset":
        data["validation"].save_to_disk(str(tmp_path))
    elif form == "parquet":
        write_parquet_export(tmp_path, data, "{split}-00000-of-00001.parquet")
    elif form == "parquet folders":
        write_parquet_export(tmp_path, data, "{split}/part-0.parquet")
    else:
        write_parquet_export(tmp_path, data, "mrpc/{split}-00000-of-00001.parquet")
    expected = normalized(read_all(glue("mrpc", "validation", TOKENIZER, data=data, batch_size=4)))
    assert normalized(read_all(glue("mrpc", "validation", TOKENIZER, data=str(tmp_path), batch_size=4))) == expected
    if form != "save_to_disk dataset":
        train = rows_of(read_all(glue("mrpc", "train", TOKENIZER, data=tmp_path, batch_size=4)), "idx")
        assert {r: ids for r, (ids, _) in train.items()} == {r: encode(data["train"], "mrpc", r) for r in range(30)}


def test_glue_downloads_nyu_mll_glue_when_no_data_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def load_dataset(*args, **kwargs):
        calls.append((args, kwargs))
        return make_split("wnli", "validation", 4)

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    batches = read_all(glue("wnli", "validation", TOKENIZER))
    assert calls == [(("nyu-mll/glue", "wnli"), {"split": "validation"})]
    assert sorted(torch.cat([b["row_index"] for b in batches]).tolist()) == [0, 1, 2, 3]


# -- errors ---------------------------------------------------------------------------------------
def test_glue_raises_error_when_the_task_is_unknown() -> None:
    with pytest.raises(
        ValueError, match=r"^`task` must be one of \('cola', 'sst2', .*'ax'\), but is 'mrcp' instead\.$"
    ):
        glue("mrcp", "train", TOKENIZER, data=make_dict("mrpc"))


def test_glue_raises_error_when_the_split_is_not_the_tasks() -> None:
    with pytest.raises(
        ValueError,
        match=r"^`split` must be one of \('train', 'validation_matched', 'validation_mismatched', 'test_matched', "
        r"'test_mismatched'\) for GLUE task 'mnli', but is 'validation' instead\.$",
    ):
        glue("mnli", "validation", TOKENIZER, data=make_dict("mnli"))
    with pytest.raises(
        ValueError, match=r"^`split` must be one of \('test',\) for GLUE task 'ax', but is 'train' instead\.$"
    ):
        glue("ax", "train", TOKENIZER)


def test_glue_raises_error_when_a_field_is_missing() -> None:
    data = datasets.DatasetDict(validation=make_split("mrpc", "validation", 3).remove_columns("sentence2"))
    with pytest.raises(
        DataError,
        match=r"^glue mrpc validation: the data has no field 'sentence2'; expected columns "
        r"\['sentence1', 'sentence2', 'label'\], found \['sentence1', 'label', 'idx'\]\.$",
    ):
        glue("mrpc", "validation", TOKENIZER, data=data)


def test_glue_raises_error_when_a_parquet_field_is_missing(tmp_path: Path) -> None:
    data = datasets.DatasetDict(train=make_split("qqp", "train", 3).rename_column("question1", "q1"))
    write_parquet_export(tmp_path, data, "{split}-0.parquet")
    with pytest.raises(DataError, match=r"^glue qqp train: the data has no field 'question1'; .* found \['q1', "):
        glue("qqp", "train", TOKENIZER, data=tmp_path)


def test_glue_raises_error_when_the_data_lacks_the_split(tmp_path: Path) -> None:
    data = datasets.DatasetDict(train=make_split("rte", "train", 3))
    with pytest.raises(
        DataError, match=r"^glue rte: the DatasetDict has no split 'validation'; found splits \['train'\]\.$"
    ):
        glue("rte", "validation", TOKENIZER, data=data)
    data.save_to_disk(str(tmp_path / "saved"))
    with pytest.raises(
        DataError, match=r"^glue rte: the saved DatasetDict '.*saved' has no split 'test'; found splits \['train'\]\.$"
    ):
        glue("rte", "test", TOKENIZER, data=tmp_path / "saved")
    layout = (
        r"expected a Parquet file or glob \(the split's rows\), a folder of Parquet files named by split "
        r"\(train-\*\.parquet or train/\*\.parquet, there or in its rte/ subfolder\), or a save_to_disk folder "
        r"\(dataset_dict\.json or state\.json\)\.$"
    )
    with pytest.raises(DataError, match=r"^glue rte: no 'train' split in '.*'; " + layout):
        glue("rte", "train", TOKENIZER, data=tmp_path)
    with pytest.raises(FileNotFoundError, match=r"^glue: no such file or folder: '.*nowhere'; " + layout):
        glue("rte", "train", TOKENIZER, data=tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match=r"^glue: `data` '.*nowhere/\*\.parquet' matches no files; " + layout):
        glue("rte", "train", TOKENIZER, data=str(tmp_path / "nowhere/*.parquet"))
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(DataError, match=r"^glue: `data` '.*notes\.txt' is not a Parquet file; " + layout):
        glue("rte", "train", TOKENIZER, data=tmp_path / "notes.txt")


def test_glue_raises_error_when_sizes_are_bad() -> None:
    data = make_dict("cola")
    with pytest.raises(ValueError, match=r"^Pass at most one of `batch_size` or `max_tokens` to glue\(\)\.$"):
        glue("cola", "train", TOKENIZER, data=data, batch_size=8, max_tokens=4096)
    with pytest.raises(
        ValueError, match=r"^`max_tokens` must be at least 128 \(`max_length`=128 padded to a multiple of 8\)"
    ):
        glue("cola", "train", TOKENIZER, data=data, max_tokens=100)
    with pytest.raises(ValueError, match=r"^`batch_size` must be greater than zero, but is 0 instead\.$"):
        glue("cola", "train", TOKENIZER, data=data, batch_size=0)
    with pytest.raises(
        TypeError,
        match=r"^`data` must be None, a datasets\.DatasetDict or Dataset, or a local path, but is a list instead\.$",
    ):
        glue("cola", "train", TOKENIZER, data=[{"sentence": "a"}])


# -- command line ---------------------------------------------------------------------------------
SHAPE_LINE = r"batch 0: input_ids \[4, \d+\] int64, attention_mask \[4, \d+\] int64, token_type_ids \[4, \d+\] int64, "


def test_glue_cli_prints_batch_shapes_and_padding_efficiency(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    make_dict("mrpc", n=30).save_to_disk(str(tmp_path))
    args = ["--task", "mrpc", "--tokenizer", pp.examples.TOKENIZER_JSON, "--data", str(tmp_path)]
    assert main(args + ["--split", "validation", "--batch-size", "4", "--max-batches", "5"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "glue mrpc validation:"
    assert re.match(SHAPE_LINE + r"labels \[4\] int64, idx \[4\] int64, row_index \[4\] int64$", lines[1])
    assert len(lines) == 5 and lines[3].startswith("batch 2: ")
    assert re.match(r"^5 batches, 20 rows, \d+ tokens in \d+ slots: padding efficiency \d+\.\d%$", lines[4])


def test_glue_cli_runs_as_a_module(tmp_path: Path) -> None:
    write_parquet_export(tmp_path, make_dict("sst2", n=30), "{split}-00000-of-00001.parquet")
    command = [
        sys.executable,
        "-m",
        "padpipe.recipes.glue",
        "--task",
        "sst2",
        "--tokenizer",
        pp.examples.TOKENIZER_JSON,
        "--data",
        str(tmp_path),
        "--batch-size",
        "4",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "glue sst2 train:" and re.match(SHAPE_LINE, lines[1])
    assert re.match(r"^8 batches, 30 rows, \d+ tokens in \d+ slots: padding efficiency \d+\.\d%$", lines[-1])
