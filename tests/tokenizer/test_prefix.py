"""Long texts cut before tokenizing: the ids equal the whole text's, truncated, on every tokenizer kind."""

from __future__ import annotations

import numpy as np
import pytest
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

import padpipe as pp
from padpipe.tokenizer import TextEncoder
from padpipe.tokenizer.prefix import CHARS_PER_TOKEN, cut, prefix_chars
from tests import tokenizer_fixtures as fx


def long_texts() -> list[str]:
    """Texts around and far past the cut, with every kind of space, punctuation and script at the boundary."""
    rng = np.random.default_rng(0)
    pieces = [
        "cat",
        "dog,",
        "sat.",
        "ünïcödé",
        "東京",
        "😀",
        "1234567",
        "--",
        "[SEP]",
        "a\tb",
        "x\ny",
        "  ",
        "   ",
        "don't",
        "naïve café",
        "(mat)",
        "!!",
        "\n\n",
        "qu'il",
        "\u00a0",
        "ok",
    ]
    out = [" ".join(rng.choice(pieces, size=n)) for n in rng.integers(1, 400, size=120)]
    out += ["word " * 300, "x" * 5000, " " * 3000 + "late start", "a" + " " * 4000 + "b", "tail   " * 200]
    return out + fx.texts()


def unigram() -> Tokenizer:
    """A SentencePiece-style Unigram tokenizer (Metaspace) trained here."""
    tok = Tokenizer(models.Unigram())
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.train_from_iterator(
        fx.training_sentences(), trainers.UnigramTrainer(vocab_size=100, special_tokens=["<unk>"], unk_token="<unk>")
    )
    return tok


def split_regex() -> Tokenizer:
    """A Llama-3-style tokenizer (regex Split, then byte-level without its regex): never cut."""
    tok, _ = fx.bpe()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(pattern=r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s+(?!\S)|\s+| ?\p{L}+", behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    return tok


TOKENIZERS = {
    "shipped wordpiece": lambda: pp.examples.tokenizer(),
    "bert wordpiece": lambda: fx.wordpiece()[0],
    "byte-level bpe": lambda: fx.bpe()[0],
    "unigram metaspace": unigram,
    "regex split": split_regex,
}


@pytest.mark.parametrize("max_length", [8, 40, 128])
@pytest.mark.parametrize("name", list(TOKENIZERS))
def test_encoder_cuts_long_texts_and_gives_the_whole_texts_ids(name, max_length):
    tok = TOKENIZERS[name]()
    encoder = TextEncoder.load(tok, max_length=max_length, truncation=True, add_special_tokens=True)
    reference = Tokenizer.from_str(tok.to_str())
    reference.no_padding()
    reference.enable_truncation(max_length)
    texts = long_texts()
    chunk = encoder.encode(texts)
    assert [chunk.row(i).tolist() for i in range(chunk.num_rows)] == [e.ids for e in reference.encode_batch(texts)]
    expected_cut = name != "regex split"
    assert (encoder._prefix_chars == CHARS_PER_TOKEN * max_length) == expected_cut


def test_encoder_never_cuts_pairs_left_truncation_or_unbounded_rows():
    tok = pp.examples.tokenizer()
    assert prefix_chars(tok.to_str(), None, "right") is None
    assert prefix_chars(tok.to_str(), 64, "left") is None
    spaced = Tokenizer.from_str(tok.to_str())
    spaced.add_tokens(["new york"])  # an added token with a space could straddle the cut
    assert prefix_chars(spaced.to_str(), 64, "right") is None


def test_cut_keeps_whole_words_and_a_space_after_a_non_space():
    texts, rows = cut(["one two  three four", "a\n b c", "short", "   x"], 12)
    assert texts == ["one two", "a\n b c", "short", "   x"] and rows == [0]
    texts, rows = cut(["alpha\tbeta gamma delta"], 14)
    assert texts == ["alpha\tbeta"] and rows == [0]
