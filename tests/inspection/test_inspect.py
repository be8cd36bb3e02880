"""``pp.inspect``: its figures equal real passes of the same pipelines; percentiles, sampling, chart, errors."""

from __future__ import annotations

import json
import os
import re
import struct

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tokenizers import Tokenizer

import padpipe as pp
from padpipe.inspection.formats import format_of

TOK = pp.examples.TOKENIZER_JSON
PAIR = ("sentence1", "sentence2")
SAMPLE_TOLERANCE = {"efficiency": 0.015, "steps": 0.03}
"""How far figures from a 5,000-row sample of the 20,000 shipped pairs may be from the exact ones (absolute
efficiency, relative steps per epoch); measured over seeds 0-5: at most 0.010 and 0.019."""


@pytest.fixture(scope="module")
def pairs(tmp_path_factory: pytest.TempPathFactory) -> str:
    """3,000 sentence pairs of the shipped sample (long-tail lengths) in 5 row groups."""
    path = tmp_path_factory.mktemp("inspect") / "pairs.parquet"
    pq.write_table(pq.read_table(pp.examples.SAMPLE_PARQUET).slice(0, 3000), path, row_group_size=700)
    return str(path)


@pytest.fixture(scope="module")
def docs(tmp_path_factory: pytest.TempPathFactory) -> str:
    """600 documents of the shipped JSONL corpus (some longer than 512 tokens), plain JSONL."""
    table = pa.Table.from_batches(pp.read_jsonl(pp.examples.SAMPLE_JSONL).loader())
    path = tmp_path_factory.mktemp("inspect") / "docs.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in table.slice(0, 600).to_pylist()))
    return str(path)


def real_pass(pipe: pp.Pipeline) -> pp.StatsSnapshot:
    loader = pipe.loader()
    for _ in loader:
        pass
    return loader.stats()


def check_equals_real_passes(result: pp.InspectResult, base: pp.Pipeline) -> None:
    for strategy in result.strategies:
        stats = real_pass(eval("base" + strategy.code, {"base": base}))  # the stages the report names
        found = (strategy.batches, strategy.rows, strategy.real_tokens, strategy.padded_tokens)
        assert found == (stats.batches, stats.rows, stats.real_tokens, stats.padded_tokens), strategy.name
        assert strategy.efficiency == stats.padding_efficiency
        assert result.steps_per_epoch(strategy) == stats.batches


@pytest.mark.slow  # seconds alone: make test runs it, test-fast leaves it out
def test_inspect_all_equals_real_passes_of_every_strategy(pairs: str) -> None:
    result = pp.inspect(
        pairs,
        TOK,
        max_length=128,
        sample=None,
        batch_size=32,
        max_tokens=2048,
        seq_len=256,
        buffer_size=1500,
        shuffle_buffer=1000,
        seed=3,
        progress=False,
    )
    assert [s.code for s in result.strategies] == [
        ".batch(32).pad(pad_to_length=128)",
        ".batch(32).pad(pad_to_multiple_of=8)",
        ".bucket(batch_size=32, buffer_size=1500).pad(pad_to_multiple_of=8)",
        ".bucket(max_tokens=2048, buffer_size=1500).pad(pad_to_multiple_of=8)",
        ".pack(256, batch_size=8, buffer_size=256)",
    ]
    base = pp.read_parquet(pairs).shuffle(1000, seed=3).tokenize(TOK, fields=PAIR, max_length=128)
    check_equals_real_passes(result, base)
    assert result.corpus.rows == 3000 and result.corpus.exact and result.rows == 3000 and not result.sampled


@pytest.mark.slow  # seconds alone: make test runs it, test-fast leaves it out
def test_inspect_all_equals_real_passes_without_truncation_or_shuffle(docs: str) -> None:
    result = pp.inspect(
        docs,
        TOK,
        sample=None,
        batch_size=16,
        seq_len=512,
        buffer_size=300,
        pad_to_multiple_of=None,
        shuffle_buffer=0,
        progress=False,
    )
    assert result.max_length is None and result.fields == ("text",)
    assert result.strategies[1].name == "dynamic: batches of 16 in order"  # no shuffle: file order
    assert result.settings.static_length == int(result.lengths.max()) > 512  # pack splits the longest documents
    check_equals_real_passes(result, pp.read_jsonl(docs).tokenize(TOK, fields="text"))


@pytest.mark.slow  # seconds alone: make test runs it, test-fast leaves it out
def test_inspect_cuts_rows_to_a_small_budget_as_on_oversize_truncate_does(pairs: str) -> None:
    result = pp.inspect(pairs, TOK, max_length=128, sample=None, max_tokens=96, buffer_size=1000, progress=False)
    budget = result.strategies[3]
    assert budget.code == ".bucket(max_tokens=96, buffer_size=1000, on_oversize='truncate').pad(pad_to_multiple_of=8)"
    assert result.budget_truncated == int((np.minimum(result.lengths, 128) > 96).sum()) > 0
    assert "rows are longer than max_tokens=96 allows" in str(result)
    stats = real_pass(
        eval(
            "base" + budget.code,
            {"base": pp.read_parquet(pairs).shuffle(10_000, seed=0).tokenize(TOK, fields=PAIR, max_length=128)},
        )
    )
    assert (budget.batches, budget.real_tokens, budget.padded_tokens) == (
        stats.batches,
        stats.real_tokens,
        stats.padded_tokens,
    )
    assert stats.counters["bucket.truncated"] == result.budget_truncated


@pytest.mark.slow  # seconds alone: make test runs it, test-fast leaves it out
def test_inspect_lengths_are_the_tokenizers_and_percentiles_are_numpys(pairs: str) -> None:
    result = pp.inspect(pairs, TOK, max_length=128, sample=None, progress=False)
    tok = Tokenizer.from_file(TOK)
    tok.no_truncation()
    table = pq.read_table(pairs)
    expected = [len(e.ids) for e in tok.encode_batch(list(zip(*(table[f].to_pylist() for f in PAIR))))]
    assert sorted(result.lengths.tolist()) == sorted(expected)
    dist = result.distribution()
    p50, p90, p99 = np.percentile(result.lengths, [50, 90, 99])
    assert (dist["p50"], dist["p90"], dist["p99"]) == (p50, p90, p99)
    assert dist["count"] == 3000 and dist["max"] == max(expected) and dist["mean"] == np.mean(expected)
    assert dist["truncated_share"] == np.mean(np.array(expected) > 128)


@pytest.mark.slow  # three inspect passes over the 20,000-row sample (~9 s alone)
def test_inspect_sample_is_within_tolerance_of_all_rows() -> None:
    exact = pp.inspect(pp.examples.SAMPLE_PARQUET, TOK, max_length=128, sample=None, buffer_size=2048, progress=False)
    for seed in (0, 1):
        sampled = pp.inspect(
            pp.examples.SAMPLE_PARQUET, TOK, max_length=128, sample=5000, buffer_size=2048, seed=seed, progress=False
        )
        assert sampled.sampled and sampled.rows == 5000 and sampled.corpus.rows == 20_000 and sampled.corpus.exact
        for a, b in zip(sampled.strategies, exact.strategies):
            assert abs(a.efficiency - b.efficiency) <= SAMPLE_TOLERANCE["efficiency"], (seed, a.name)
            steps = sampled.steps_per_epoch(a)
            assert abs(steps - b.batches) <= SAMPLE_TOLERANCE["steps"] * b.batches, (seed, a.name)


@pytest.mark.slow  # seconds alone: make test runs it, test-fast leaves it out
def test_inspect_sample_is_spread_over_units_and_seeded(pairs: str) -> None:
    first = pp.inspect(pairs, TOK, sample=500, progress=False)
    assert first.corpus.units == 5 and first.corpus.units_read == 5  # 100 rows from each row group
    assert first.corpus.how == "counted from metadata" and first.corpus.rows == 3000
    again = pp.inspect(pairs, TOK, sample=500, progress=False)
    other = pp.inspect(pairs, TOK, sample=500, seed=1, progress=False)
    assert np.array_equal(first.lengths, again.lengths) and not np.array_equal(first.lengths, other.lengths)
    first_rows = pp.inspect(pairs, TOK, sample=None, shuffle_buffer=0, progress=False).lengths[:500]
    assert sorted(first.lengths.tolist()) != sorted(first_rows.tolist())  # not the first 500 rows


def test_inspect_estimates_the_corpus_from_bytes_when_rows_are_not_in_metadata(tmp_path) -> None:
    rng = np.random.default_rng(0)
    for i in range(40):  # 40 files (units) of 30 rows; 32 are read whole, 8 are not read
        words = [" ".join(["word"] * int(n)) for n in rng.integers(1, 40, size=30)]
        (tmp_path / f"part-{i:02}.jsonl").write_text("".join(json.dumps({"text": w}) + "\n" for w in words))
    result = pp.inspect(str(tmp_path), TOK, sample=320, progress=False)
    assert result.format == "jsonl" and result.corpus.units == 40 and result.corpus.units_read == 32
    assert not result.corpus.exact and result.corpus.how.startswith("estimated from 960 rows")
    assert abs(result.corpus.rows - 1200) <= 60


def test_inspect_reads_arrow_folders_and_reader_pipelines(tmp_path, docs: str) -> None:
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_dict({"text": ["a short one", "a much longer text than that " * 5, "mid size text"]})
    ds.save_to_disk(str(tmp_path / "saved"))
    saved = pp.inspect(str(tmp_path / "saved"), TOK, progress=False)
    assert saved.format == "arrow" and saved.rows == 3 and saved.corpus.exact
    big = datasets.Dataset.from_dict({"text": [f"row {i} " * (i % 7 + 1) for i in range(3000)]})
    big.save_to_disk(str(tmp_path / "big"), max_shard_size="60KB")  # several files of 1,000-row batches
    counted = pp.inspect(str(tmp_path / "big"), TOK, sample=100, progress=False)
    assert counted.corpus.files > 1 and counted.rows == 100 and counted.corpus.rows == 3000 and counted.corpus.exact
    assert counted.corpus.how == "counted from metadata"  # local Arrow units know their rows
    from_hf = pp.inspect(pp.from_hf(ds), TOK, progress=False)
    assert from_hf.format == "datasets" and np.array_equal(np.sort(from_hf.lengths), np.sort(saved.lengths))
    reader = pp.inspect(pp.read_jsonl(docs), TOK, sample=None, progress=False)
    assert reader.rows == 600


@pytest.mark.slow  # seconds alone: make test runs it, test-fast leaves it out
def test_inspect_report_and_dict_name_every_figure(pairs: str) -> None:
    result = pp.inspect(pairs, TOK, max_length=128, sample=None, progress=False)
    text = str(result)
    assert text.startswith(
        f"padpipe inspect: {pairs}\n  parquet, 1 file, 5 units; 3,000 rows (exact: every row "
        "read); read every row (shuffle buffer 10,000)\n"
    )
    for strategy in result.strategies:
        assert strategy.name in text
    assert "recommendations" in text and "efficiency stops improving at buffer_size=" in text
    data = json.loads(json.dumps(result.as_dict()))
    assert [s["code"] for s in data["strategies"]] == [s.code for s in result.strategies]
    assert data["lengths"]["p99"] == result.distribution()["p99"] and data["corpus"]["rows"] == 3000
    assert min(s["attention_vs_least"] for s in data["strategies"]) == 1.0


def test_inspect_chart_is_a_png_of_sensible_size(pairs: str, tmp_path) -> None:
    pytest.importorskip("matplotlib")
    result = pp.inspect(pairs, TOK, max_length=128, sample=1000, progress=False)
    path = result.chart(tmp_path / "chart.png")
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    assert 1000 <= width <= 2000 and 400 <= height <= 1000 and 20_000 <= len(data) <= 1_000_000


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"fields": "sentence"}, pp.DataError, r"pairs\.parquet: no column 'sentence'; available columns: \["),
        ({"sample": 0}, ValueError, r"^`sample` must be greater than zero, but is 0 instead\.$"),
        ({"max_length": 2, "fields": PAIR}, ValueError, r"^`max_length` must be at least 3 \(the tokenizer's special"),
        ({"shuffle_buffer": -1}, ValueError, r"^`shuffle_buffer` must be a non-negative int, but is -1 instead\.$"),
        (
            {"fields": "label"},
            pp.DataError,
            r"pairs\.parquet: nothing to inspect in field\(s\) \['label'\]: all 3,000 rows read have no text there",
        ),
    ],
)
def test_inspect_raises_error_when_an_argument_is_bad(pairs: str, kwargs: dict, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        pp.inspect(pairs, TOK, progress=False, **kwargs)


def test_inspect_raises_error_when_the_input_is_not_a_known_format(tmp_path) -> None:
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(FileNotFoundError, match=r"^'.*' holds no Parquet, Arrow, JSON Lines or CSV files\.$"):
        pp.inspect(str(tmp_path), TOK, progress=False)
    with pytest.raises(ValueError, match=r"reader's pipeline without stages"):
        pp.inspect(pp.read_jsonl(pp.examples.SAMPLE_JSONL).tokenize(TOK), TOK, progress=False)


def test_format_of_reads_names_folders_and_globs(pairs: str, docs: str) -> None:
    assert format_of("x/train-0.parquet") == "parquet"
    assert format_of(os.path.dirname(pairs) + "/*") == "parquet"
    assert format_of(os.path.dirname(docs)) == "jsonl"
    with pytest.raises(FileNotFoundError, match=r"^No such file or folder: 'nope/'\.$"):
        format_of("nope/")


@pytest.fixture(scope="module")
def one_long(tmp_path_factory: pytest.TempPathFactory, docs: str) -> str:
    """200 documents of the shipped corpus and one of about 20,000 tokens (the 87,286-token document of issue 30)."""
    rows = [json.loads(line) for line in open(docs).read().splitlines()[:200]]
    rows.insert(100, {**rows[0], "text": " ".join(r["text"] for r in rows[:80])})
    path = tmp_path_factory.mktemp("inspect") / "one_long.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def test_inspect_sizes_budgets_by_the_p99_length_when_nothing_truncates(one_long: str) -> None:
    """Issue 30 item 7: with no max_length, the budgets came from the longest document (a few steps an epoch)."""
    result = pp.inspect(one_long, TOK, sample=None, shuffle_buffer=0, progress=False)
    lengths, s = result.lengths, result.settings
    p99 = np.percentile(lengths, 99)
    row = min(2048, 1 << (int(np.ceil(p99)) - 1).bit_length())  # p99 rounded up to a power of two, at most 2048
    assert result.max_length is None and lengths.max() > 10_000 and row == 2048
    assert s.max_tokens == 32 * row and s.seq_len == 2048 and s.pack_batch_size == max(1, 32 * row // 2048)
    assert s.static_length == lengths.max()  # static padding still pads to the longest row: what it would do
    assert (
        f"  max_tokens={32 * row}: 32 x {row:,} tokens: no max_length (the tokenizer has no model_max_length), "
        f"so p99 {p99:,.0f} rounded up to a power of two, at most 2,048, not the longest row ({lengths.max():,}); "
        "pass max_length or max_tokens to choose"
    ) in str(result).splitlines()
    assert result.as_dict()["settings"]["budget"].startswith(f"32 x {row:,} tokens: no max_length")
    assert result.strategies[3].batches > 1  # 1 before: a budget of 32 x 16,056 tokens
    check_equals_real_passes(result, pp.read_jsonl(one_long).tokenize(TOK, fields="text"))
    given = pp.inspect(one_long, TOK, sample=None, max_tokens=4096, progress=False)
    assert given.settings.budget == "" and "pass max_length or max_tokens" not in str(given)


def test_inspect_progress_ends_at_the_rows_the_input_holds(docs: str, caplog: pytest.LogCaptureFixture) -> None:
    """Issue 30 item 7: "reading a sample: 5,127 of 20,000 rows (26%)" for a file of 5,127 rows."""
    with caplog.at_level("INFO", logger="padpipe"):
        pp.inspect(docs, TOK, sample=20_000, progress=True)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("inspect: reading a sample")]
    assert len(lines) == 1 and re.match(
        r"inspect: reading a sample: 600 of 600 rows \(100%\), [\d.]+ s, done$", lines[0]
    )
