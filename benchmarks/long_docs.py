"""Long-tail documents and a BERT-sized WordPiece tokenizer for the benchmarks, made offline and seeded.

No real corpus or BERT vocabulary can be downloaded here, so both are generated: words are
syllable strings drawn from a Zipf law over 60,000 word types (frequent words short, rare words
long, as in English), document lengths are log-normal (most documents longer than 512 tokens,
a long tail of short ones and a few very long ones), and the tokenizer is a BERT-style uncased
WordPiece model with BERT's vocabulary size (30,522) trained on the generated text with the
``tokenizers`` library. Used by ``epochs.py`` and ``first_batch.py``.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

SYLLABLES = [c + v for c in "bcdfghjklmnprstvwz" for v in ("a", "e", "i", "o", "u", "ai", "ou")]
WORD_TYPES = 60_000
BERT_VOCAB = 30_522


def vocabulary(seed: int = 0) -> np.ndarray:
    """Word types, most frequent first: short words first, longer ones down the Zipf tail."""
    rng = np.random.default_rng([seed, 1])
    sizes = np.clip(1 + np.log1p(np.arange(WORD_TYPES)) // 2.2 + rng.integers(0, 2, WORD_TYPES), 1, 6).astype(int)
    words = ["".join(rng.choice(SYLLABLES, size=k)) for k in sizes]
    return np.array(list(dict.fromkeys(words)), dtype=object)


def documents(n: int = 3183, median_words: int = 600, sigma: float = 1.0, seed: int = 0) -> list[str]:
    """``n`` documents of log-normal length (median ``median_words`` words), Zipf-distributed words, with
    punctuation."""
    rng = np.random.default_rng([seed, 2])
    words = vocabulary(seed)
    lengths = np.maximum(rng.lognormal(np.log(median_words), sigma, n).astype(int), 3)
    ranks = np.minimum(rng.zipf(1.15, int(lengths.sum())) - 1, len(words) - 1)
    tokens = words[ranks]
    ends = np.cumsum(lengths)
    stops = rng.random(len(tokens)) < 0.07
    tokens = np.where(stops, tokens + ".", tokens)
    return [" ".join(tokens[e - k : e]) for e, k in zip(ends, lengths)]


def write_parquet(path: str | os.PathLike, texts: list[str], row_group_size: int = 256) -> str:
    """The documents as a Parquet file with a ``text`` and an ``idx`` column."""
    table = pa.table({"idx": np.arange(len(texts)), "text": texts})
    pq.write_table(table, str(path), row_group_size=row_group_size)
    return str(path)


def bert_sized_tokenizer(folder: str | os.PathLike, texts: list[str], vocab_size: int = BERT_VOCAB) -> str:
    """Train (once) an uncased BERT-style WordPiece tokenizer on ``texts``; returns its ``tokenizer.json``."""
    path = Path(folder) / f"wordpiece-{vocab_size}.json"
    if path.exists():
        return str(path)
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=special, show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    Path(folder).mkdir(parents=True, exist_ok=True)
    tok.save(str(path))
    return str(path)


def hf_tokenizer(path: str, max_length: int = 512):
    """The tokenizer as a ``transformers`` fast tokenizer (what the HF stack and padpipe are both given)."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_file=path,
        pad_token="[PAD]",
        unk_token="[UNK]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_max_length=max_length,
    )
