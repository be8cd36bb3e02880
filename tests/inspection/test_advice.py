"""``pp.inspect``'s advice fits the tokenizer and the data: the model's limit, long documents, a sample that read all."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

import padpipe as pp
from tests.inspection.test_inspect import (
    check_equals_real_passes,
    docs,  # noqa: F401  (600 documents of the shipped corpus, some past 512 tokens)
)

pytest.importorskip("transformers")  # the tokenizer folder carries model_max_length 512


@pytest.fixture(scope="module")
def long_docs(docs: str) -> pp.InspectResult:  # noqa: F811
    return pp.inspect(docs, pp.examples.TOKENIZER_DIR, sample=None, progress=False)


def test_inspect_advice_stops_at_the_tokenizers_limit(long_docs: pp.InspectResult) -> None:
    result = long_docs
    dist = result.distribution()
    assert result.max_length == result.model_max_length == 512 and dist["p99"] > 512
    assert result.recommendations()[0] == (
        f"max_length=512 truncates {dist['truncated_share']:.1%} of rows; p99 is {dist['p99']:,.0f} tokens, past the "
        "tokenizer's limit of 512 (model_max_length)."
    )
    advised = [int(n) for line in result.recommendations() for n in re.findall(r"max_length=(\d+)", line)]
    assert advised and max(advised) == 512


def test_inspect_advice_below_the_limit_names_the_limit_and_what_it_keeps(docs: str) -> None:  # noqa: F811
    result = pp.inspect(docs, pp.examples.TOKENIZER_DIR, max_length=128, sample=None, progress=False)
    whole = np.mean(result.lengths <= 512)
    assert result.model_max_length == 512 and result.as_dict()["model_max_length"] == 512
    assert result.recommendations()[0] == (
        f"max_length=128 truncates {result.distribution()['truncated_share']:.1%} of rows; max_length=512, the "
        f"tokenizer's limit (model_max_length), would keep {whole:.1%} of them whole (p99 is "
        f"{result.distribution()['p99']:,.0f} tokens)."
    )


def test_inspect_recommends_split_packing_for_long_documents(long_docs: pp.InspectResult) -> None:
    lengths = long_docs.lengths
    share, dropped = np.mean(lengths > 512), np.maximum(lengths - 512, 0).sum() / lengths.sum()
    assert share > 0.01
    assert long_docs.recommendations()[1] == (
        f'long documents: {share:.1%} of rows are longer than max_length=512; pack(seq_len=512, long_docs="split") '
        f"splits them across rows and keeps every token, where truncation drops {dropped:.1%} of the tokens."
    )


def test_inspect_advises_no_packing_for_pairs_or_short_rows() -> None:
    pairs = pp.inspect(
        pp.examples.SAMPLE_PARQUET, pp.examples.TOKENIZER_JSON, max_length=128, sample=2000, progress=False
    )  # 25% truncated, but pairs
    assert not any(line.startswith("long documents") for line in pairs.recommendations())


def test_inspect_prints_percentiles_as_whole_tokens_with_thousands_separators(long_docs: pp.InspectResult) -> None:
    dist = long_docs.distribution()
    line = next(line for line in str(long_docs).splitlines() if line.startswith("  mean "))
    assert line.startswith(
        f"  mean {dist['mean']:.1f}   p50 {dist['p50']:,.0f}   p90 {dist['p90']:,.0f}   "
        f"p99 {dist['p99']:,.0f}   max {dist['max']:,}"
    )


def test_a_sample_that_covers_the_whole_input_is_not_a_sample(docs: str) -> None:  # noqa: F811
    whole = pp.inspect(docs, pp.examples.TOKENIZER_JSON, sample=20_000, progress=False)  # 600 rows: all of them
    assert not whole.sampled and whole.as_dict()["sampled"] is False and whole.scale == 1.0
    text = str(whole)
    assert "; read every row\n" in text and "sample more rows" not in text and "scaled from the sample" not in text
    part = pp.inspect(docs, pp.examples.TOKENIZER_JSON, sample=100, progress=False)
    assert part.sampled and part.as_dict()["sampled"] is True and "sampled 100 rows" in str(part)


@pytest.mark.slow  # seconds alone: make test runs it, test-fast leaves it out
def test_inspect_packs_long_documents_whole_where_it_advises_split(docs: str) -> None:  # noqa: F811
    """Issue 30 item 7: the pack row was computed on truncated documents while the advice said split them."""
    result = pp.inspect(docs, pp.examples.TOKENIZER_DIR, sample=None, progress=False)
    pack = result.strategies[-1]
    assert result.max_length == 512 and pack.whole and not any(st.whole for st in result.strategies[:-1])
    assert pack.name == "pack(seq_len=512) split"
    assert pack.code == ".pack(512, batch_size=32, buffer_size=256, long_docs='split')"
    long = result.lengths[result.lengths > 512]
    context = int(((long - 1 + 510) // 511 - 1).sum())  # a cut's next piece repeats the cut token (pieces of 511 new)
    assert pack.real_tokens == int(result.lengths.sum()) + context > result.strategies[3].real_tokens  # every token
    base = pp.read_jsonl(docs).shuffle(10_000, seed=0)
    check_equals_real_passes(
        dataclasses.replace(result, strategies=result.strategies[-1:]),
        base.tokenize(pp.examples.TOKENIZER_DIR, truncation=False),
    )
    check_equals_real_passes(
        dataclasses.replace(result, strategies=result.strategies[:-1]), base.tokenize(pp.examples.TOKENIZER_DIR)
    )
    text = str(result)
    assert (
        "  pack(seq_len=512) split: the documents whole (tokenize with truncation=False), split across packed rows "
        "(long_docs='split'), as advised below; the other rows are truncated to max_length=512"
    ) in text.splitlines()
    assert re.search(r"^  pack\(seq_len=512\) split +8: ", text, re.M)  # its buffer sweep, on the same rows
    pairs = pp.inspect(
        pp.examples.SAMPLE_PARQUET, pp.examples.TOKENIZER_JSON, max_length=128, sample=2000, progress=False
    )
    assert not pairs.strategies[-1].whole  # pairs are not documents to split


def test_inspect_reads_a_huge_model_max_length_as_no_limit(docs: str) -> None:  # noqa: F811
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(pp.examples.TOKENIZER_DIR)
    tok.model_max_length = int(1e30)  # transformers' "no limit" placeholder
    result = pp.inspect(docs, tok, sample=None, progress=False)
    assert result.max_length is None and result.model_max_length is None
    assert result.settings.budget.startswith("32 x ") and result.settings.max_tokens <= 32 * 2048
