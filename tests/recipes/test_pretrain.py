"""The pretraining recipe on small local corpora: packing, bucketing, formats, seeds, errors, CLI."""

from __future__ import annotations

import gzip
import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from transformers import AutoTokenizer

import padpipe as pp
from padpipe import _command
from padpipe.inspection.formats import format_of
from padpipe.recipes.pretrain import main, pretrain

TOKENIZER = pp.examples.tokenizer()  # no EOS token
EOS_TOKENIZER = AutoTokenizer.from_pretrained(pp.examples.TOKENIZER_DIR, eos_token="[SEP]")
EOS = 3
WORDS = "the a cat sat on mat quick brown fox jumps over lazy dog good bad plot was really not".split()
DOCS = [
    " ".join(np.random.default_rng(i).choice(WORDS, size=int(np.random.default_rng(i).integers(1, 21))))
    for i in range(40)
]


def ids(doc: str) -> list[int]:
    return TOKENIZER.encode(doc, add_special_tokens=False).ids


def segments(batches: list[dict]) -> Counter:
    """The documents of packed batches (each a tuple of ids), counted; padding runs (all [PAD], id 0) left out."""
    out: Counter = Counter()
    for batch in batches:
        for row, seg in zip(batch["input_ids"].tolist(), batch["seq_idx"].tolist()):
            for s in sorted(set(seg)):
                tokens = tuple(t for t, k in zip(row, seg) if k == s)
                if tokens[0] != 0:
                    out[tokens] += 1
    return out


def expected_segments(docs: list[str] = DOCS) -> Counter:
    return Counter(tuple(ids(doc) + [EOS]) for doc in docs)


def rows(batches: list[dict]) -> Counter:
    """The real tokens of padded batches, counted."""
    return Counter(tuple(r[m.bool()].tolist()) for b in batches for r, m in zip(b["input_ids"], b["attention_mask"]))


def write_corpus(path: Path, docs: list[str] = DOCS) -> Path:
    """``docs`` (with an ``id`` column) in the format ``path``'s name says."""
    records = [{"id": i, "text": doc} for i, doc in enumerate(docs)]
    table = pa.Table.from_pylist(records)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = "".join(json.dumps(r) + "\n" for r in records).encode()
    if path.name.endswith(".parquet"):
        pq.write_table(table, path, row_group_size=16)
    elif path.name.endswith(".arrow"):
        with pa.ipc.new_file(path, table.schema) as writer:
            writer.write_table(table, max_chunksize=16)
    elif path.name.endswith(".gz"):
        path.write_bytes(gzip.compress(lines))
    elif path.name.endswith(".zst"):
        path.write_bytes(zstandard.ZstdCompressor().compress(lines))
    else:
        path.write_bytes(lines)
    return path


# -- packing --------------------------------------------------------------------------------------
def test_pretrain_works_in_pack_mode(tmp_path: Path) -> None:
    path = write_corpus(tmp_path / "docs.jsonl")
    batches = list(pretrain(str(path), EOS_TOKENIZER, seq_len=128, batch_size=2).loader())
    assert all(b["input_ids"].shape == (2, 128) for b in batches[:-1])
    assert segments(batches) == expected_segments()  # every document once, followed by EOS
    assert sorted(batches[0]) == [
        "cu_seq_lens_k",
        "cu_seq_lens_q",
        "input_ids",
        "labels",
        "max_length_k",
        "max_length_q",
        "position_ids",
        "seq_idx",
        "use_cache",
    ]


def test_pretrain_trains_every_prediction_once_eos_included_when_documents_are_split(tmp_path: Path) -> None:
    """Rows of 8 cut most documents: each token but a document's first is a target once, predicted from the token
    before it (a continuation starts with it), and every document's EOS is one of them (issue 47: 5,704 of 7.29 M
    predictions were lost, EOS included, when a continuation started at its first new token)."""
    path = write_corpus(tmp_path / "docs.jsonl")
    batches = list(pretrain(str(path), EOS_TOKENIZER, seq_len=8, batch_size=2).loader())
    trained: Counter = Counter()
    for b in batches:
        taken = b["labels"][:, 1:] != -100  # as the model shifts them
        trained.update(zip(b["input_ids"][:, :-1][taken].tolist(), b["labels"][:, 1:][taken].tolist()))
    corpus = [ids(doc) + [EOS] for doc in DOCS]
    assert sum(len(doc) > 8 for doc in corpus) > 10
    assert trained == Counter(pair for doc in corpus for pair in zip(doc, doc[1:]))
    assert sum(n for (_, target), n in trained.items() if target == EOS) == len(DOCS)


@pytest.mark.parametrize(
    "layout",
    [
        "docs.jsonl",
        "docs.jsonl.gz",
        "docs.jsonl.zst",
        "docs.json",
        "docs.parquet",
        "docs.arrow",
        "folder/",
        "glob/*.parquet",
        "saved/",
    ],
)
def test_pretrain_reads_every_format(tmp_path: Path, layout: str) -> None:
    if layout == "folder/":
        write_corpus(tmp_path / "folder/a.jsonl.gz", DOCS[:25])
        write_corpus(tmp_path / "folder/sub/b.jsonl", DOCS[25:])
    elif layout == "glob/*.parquet":
        write_corpus(tmp_path / "glob/a.parquet", DOCS[:10])
        write_corpus(tmp_path / "glob/b.parquet", DOCS[10:])
    elif layout == "saved/":
        datasets.Dataset.from_dict({"text": DOCS}).save_to_disk(str(tmp_path / "saved"))
    else:
        write_corpus(tmp_path / layout)
    batches = list(pretrain(str(tmp_path / layout), EOS_TOKENIZER, seq_len=128, batch_size=2).loader())
    assert segments(batches) == expected_segments()


def test_pretrain_takes_a_list_of_paths_as_one_corpus(tmp_path: Path) -> None:
    paths = [str(write_corpus(tmp_path / "a.parquet", DOCS[:15])), str(write_corpus(tmp_path / "b.parquet", DOCS[15:]))]
    batches = list(pretrain(paths, EOS_TOKENIZER, seq_len=64).loader())
    assert segments(batches) == expected_segments()


def test_pretrain_shuffles_deterministically_for_a_seed(tmp_path: Path) -> None:
    path = str(write_corpus(tmp_path / "docs.parquet"))

    def order(seed: int) -> list[list[int]]:
        return [
            b["input_ids"].flatten().tolist() for b in pretrain(path, EOS_TOKENIZER, seq_len=64, seed=seed).loader()
        ]

    assert order(0) == order(0)
    assert order(0) != order(1)


# -- bucketing ------------------------------------------------------------------------------------
def test_pretrain_works_in_bucket_mode(tmp_path: Path) -> None:
    path = str(write_corpus(tmp_path / "docs.parquet"))
    batches = list(pretrain(path, EOS_TOKENIZER, seq_len=16, batch_size=4, mode="bucket").loader())
    assert all(b["input_ids"].numel() <= 64 and b["input_ids"].shape[1] <= 16 for b in batches)
    assert rows(batches) == Counter(tuple(ids(doc)[:15] + [EOS]) for doc in DOCS)  # truncated, then EOS


def test_pretrain_buckets_without_eos_when_the_tokenizer_has_none(tmp_path: Path) -> None:
    path = str(write_corpus(tmp_path / "docs.parquet"))
    batches = list(pretrain(path, TOKENIZER, seq_len=16, mode="bucket", max_tokens=48).loader())
    assert all(b["input_ids"].numel() <= 48 for b in batches)
    assert rows(batches) == Counter(tuple(ids(doc)[:16]) for doc in DOCS)


# -- formats --------------------------------------------------------------------------------------
def test_format_of_works(tmp_path: Path) -> None:
    names = {
        "a.parquet": "parquet",
        "b.PQ": "parquet",
        "c.arrow": "arrow",
        "d.feather": "arrow",
        "e.jsonl": "jsonl",
        "f.jsonl.gz": "jsonl",
        "g.jsonl.zst": "jsonl",
        "h.json": "jsonl",
        "s3://bucket/x/*.json.gz": "jsonl",
        "data/*.parquet": "parquet",
    }
    assert {name: format_of(name) for name in names} == names  # by name alone: no I/O
    write_corpus(tmp_path / "nested/deep/x.arrow")
    (tmp_path / "nested/_SUCCESS.parquet").write_bytes(b"")  # skipped: starts with "_"
    (tmp_path / "nested/README.md").write_text("not data")
    assert format_of(str(tmp_path / "nested")) == "arrow"


def test_format_of_raises_error_when_the_format_is_unclear(tmp_path: Path) -> None:
    write_corpus(tmp_path / "mixed/a.parquet")
    write_corpus(tmp_path / "mixed/b.jsonl")
    with pytest.raises(ValueError, match=r"^'.*mixed' holds files of several formats \['jsonl', 'parquet'\]; "):
        format_of(str(tmp_path / "mixed"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"^'.*empty' holds no Parquet, Arrow, JSON Lines or CSV files\.$"):
        format_of(str(tmp_path / "empty"))
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(ValueError, match=r"^'.*notes\.txt': unknown file format; expected a name ending in \.parquet"):
        format_of(str(tmp_path / "notes.txt"))
    with pytest.raises(FileNotFoundError, match=r"^No such file or folder: '.*nothing'\.$"):
        format_of(str(tmp_path / "nothing"))


# -- errors and mixing ----------------------------------------------------------------------------
def test_pretrain_raises_error_when_seq_len_is_too_short() -> None:
    with pytest.raises(ValueError, match=r"^`seq_len` must be at least 2, but is 1 instead\.$"):
        pretrain("docs.jsonl", EOS_TOKENIZER, seq_len=1)


def test_pretrain_raises_error_when_packing_with_a_tokenizer_without_eos() -> None:
    with pytest.raises(
        ValueError,
        match=r"^pretrain\(mode='pack'\) needs a tokenizer with an EOS token to separate documents, but this one "
        r"has none; pass a tokenizer with an eos token \(or set one, ",
    ):
        pretrain("docs.jsonl", TOKENIZER)


def test_pretrain_raises_error_when_options_do_not_fit(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"^`max_tokens` is for mode='bucket'; "):
        pretrain("docs.jsonl", EOS_TOKENIZER, max_tokens=4096)
    with pytest.raises(ValueError, match=r"^`max_tokens` must be at least `seq_len`=2048, but is 1024 instead\.$"):
        pretrain("docs.jsonl", EOS_TOKENIZER, mode="bucket", max_tokens=1024)
    with pytest.raises(ValueError, match=r"^`mode` must be one of \('pack', 'bucket'\), but is 'packed' instead\.$"):
        pretrain("docs.jsonl", EOS_TOKENIZER, mode="packed")
    paths = [str(write_corpus(tmp_path / "a.parquet")), str(write_corpus(tmp_path / "b.jsonl"))]
    with pytest.raises(ValueError, match=r"^The paths of one corpus must share one format, but they are \{"):
        pretrain(paths, EOS_TOKENIZER)
    with pytest.raises(
        ValueError, match=r"^`weights` must have one weight per corpus \['a', 'b'\], but has \['a'\]\.$"
    ):
        pretrain({"a": paths[0], "b": paths[1]}, EOS_TOKENIZER, weights={"a": 1.0})


def test_pretrain_hands_shuffled_corpora_by_name_to_pp_mix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def mix(pipelines: dict, *, weights: dict | None, seed: int) -> pp.Pipeline:
        calls.append((sorted(pipelines), weights, seed, {n: p.output for n, p in pipelines.items()}))
        return next(iter(pipelines.values()))

    monkeypatch.setattr(pp, "mix", mix, raising=False)
    web, code = str(write_corpus(tmp_path / "web.jsonl")), str(write_corpus(tmp_path / "code.parquet"))
    pipe = pretrain(
        {"web": web, "code": [code]}, TOKENIZER, mode="bucket", seq_len=32, weights={"code": 1, "web": 3}, seed=7
    )
    assert calls == [(["code", "web"], {"web": 3, "code": 1}, 7, {"web": "records", "code": "records"})]
    assert rows(list(pipe.loader())) == Counter(tuple(ids(doc)[:32]) for doc in DOCS)


@pytest.mark.parametrize("weights", [{"web": 3, "code": 1}, [1, 1, 2]])
def test_pretrain_mixes_corpora(tmp_path: Path, weights: dict | list) -> None:
    web = str(write_corpus(tmp_path / "web.jsonl", DOCS[:25]))
    code = str(write_corpus(tmp_path / "code.parquet", DOCS[25:35]))
    more = str(write_corpus(tmp_path / "more.arrow", DOCS[35:]))
    sources = {"web": web, "code": code} if isinstance(weights, dict) else [web, code, more]
    docs = DOCS[:35] if isinstance(weights, dict) else DOCS
    pipe = pretrain(sources, TOKENIZER, mode="bucket", seq_len=32, weights=weights)
    assert rows(list(pipe.loader())) == Counter(tuple(ids(doc)[:32]) for doc in docs)  # every document once


# -- command line ---------------------------------------------------------------------------------
def test_pretrain_cli_prints_batch_shapes_and_efficiency(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = str(write_corpus(tmp_path / "docs.parquet"))
    args = [
        "--data",
        path,
        "--tokenizer",
        pp.examples.TOKENIZER_JSON,
        "--seq-len",
        "32",
        "--mode",
        "bucket",
        "--max-tokens",
        "128",
    ]
    assert main(args) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "pretrain bucket seq_len=32:"
    assert re.match(r"^batch 0: input_ids \[\d+, \d+\] int64, attention_mask \[\d+, \d+\] int64", lines[1])
    assert re.match(r"^\d+ batches, 40 rows, \d+ tokens in \d+ slots: padding efficiency \d+\.\d%$", lines[-1])


def test_pretrain_cli_counts_documents_not_the_pieces_of_split_ones(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    path = str(write_corpus(tmp_path / "docs.parquet"))
    args = [
        "--data",
        path,
        "--tokenizer",
        pp.examples.TOKENIZER_JSON,
        "--eos-token",
        "[SEP]",
        "--seq-len",
        "8",
        "--batch-size",
        "2",
    ]
    assert main(args) == 0
    lengths = [len(ids(doc)) + 1 for doc in DOCS]  # each document and its EOS, in rows of 8: 7 new tokens a piece
    pieces = sum(1 if n <= 8 else -(-(n - 1) // 7) for n in lengths)  # after the first (the cut token is context)
    assert pieces > len(DOCS)
    last = capsys.readouterr().out.splitlines()[-1]
    assert re.fullmatch(
        rf"\d+ batches, 40 documents \({pieces} pieces\), \d+ tokens in \d+ slots: packing efficiency "
        r"\d+\.\d%",
        last,
    ), last


def test_pretrain_cli_names_the_keys_of_a_jsonl_corpus_for_a_wrong_text_field(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """Issue 30 item 7: it said "field 'body' at row 0 of the chunk is None ... pass on_error='skip'" (no such option)."""
    path = str(write_corpus(tmp_path / "docs.jsonl"))
    args = ["--data", path, "--tokenizer", pp.examples.TOKENIZER_JSON, "--mode", "bucket", "--text-field", "body"]
    assert _command.run(main, args, prog="pretrain") == 2
    assert capsys.readouterr().err == (
        f"pretrain: error: tokenize: text field 'body' is not in the first row of {path}; expected one of its keys "
        "['id', 'text'].\n"
    )


def test_pretrain_cli_runs_as_a_module(tmp_path: Path) -> None:
    path = str(write_corpus(tmp_path / "docs.jsonl.gz"))
    command = [
        sys.executable,
        "-m",
        "padpipe.recipes.pretrain",
        "--data",
        path,
        "--tokenizer",
        pp.examples.TOKENIZER_DIR,
        "--eos-token",
        "[SEP]",
        "--seq-len",
        "64",
        "--batch-size",
        "2",
        "--max-batches",
        "3",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "pretrain pack seq_len=64:"
    assert re.match(r"^batch 0: input_ids \[2, 64\] int64, ", lines[1]) and "cu_seq_lens_q" in lines[1]
    assert re.match(
        r"^3 batches, \d+ documents \(\d+ pieces\), \d+ tokens in 384 slots: packing efficiency \d+\.\d%$", lines[-1]
    )
