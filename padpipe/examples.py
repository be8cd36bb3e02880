"""The embedded default: a sample corpus, conversations and tokenizers shipped inside the package.

Example:
    >>> import padpipe as pp
    >>> pp.examples.tokenizer().encode("Hello world").tokens[0]
    '[CLS]'
"""

from __future__ import annotations

import functools
import gzip
import json
import os
import random
import re
from pathlib import Path
from typing import Any

from padpipe._optional import require

DATA_DIR = Path(__file__).parent / "data"
SAMPLE_PARQUET = str(DATA_DIR / "sample.parquet")
"""~20k sentence pairs (``sentence1``, ``sentence2``, ``label``, ``idx``) with long-tail lengths."""
SAMPLE_JSONL = str(DATA_DIR / "corpus.jsonl.gz")
"""~5k documents (``text``, ``id``) for pretraining and packing examples."""
TOKENIZER_DIR = str(DATA_DIR / "tokenizer")
"""A BERT-style WordPiece tokenizer (vocab ~8k) trained on the sample text, as a folder that
``transformers.AutoTokenizer.from_pretrained`` loads."""
TOKENIZER_JSON = str(DATA_DIR / "tokenizer" / "tokenizer.json")
"""The same tokenizer's ``tokenizers`` file (the folder's own copy: the package ships one)."""
CHATS_JSONL = str(DATA_DIR / "chats.jsonl.gz")
"""1,000 conversations (``messages``, ``id``): :func:`conversations` ``(1000, seed=0)``, for the SFT examples."""
PREFERENCES_JSONL = str(DATA_DIR / "preferences.jsonl.gz")
"""400 preference pairs (``prompt``, ``chosen``, ``rejected``, ``id``): :func:`preferences` ``(400, seed=0)``, for the
DPO examples."""
CHAT_TOKENIZER_DIR = str(DATA_DIR / "chat_tokenizer")
"""A byte-level BPE chat tokenizer (vocab 4,096) trained on the sample text, with a ChatML chat template, as a
folder that ``transformers.AutoTokenizer.from_pretrained`` loads (EOS ``<|endoftext|>``, pad ``<|pad|>``; the
control tokens of the ChatML, Llama 3, Mistral and Gemma templates are special tokens)."""


def tokenizer() -> Any:
    """The shipped WordPiece tokenizer as a ``tokenizers.Tokenizer`` (core only, no ``transformers``).

    Example:
        >>> pp.examples.tokenizer().token_to_id("[PAD]")
        0
    """
    from tokenizers import Tokenizer

    return Tokenizer.from_file(TOKENIZER_JSON)


def hf_tokenizer() -> Any:
    """The shipped tokenizer as a ``transformers`` fast tokenizer, loaded offline from its folder (``padpipe[hf]``).

    Example:
        >>> pp.examples.hf_tokenizer().pad_token
        '[PAD]'
    """
    transformers = require("transformers", "pp.examples.hf_tokenizer()")
    return transformers.AutoTokenizer.from_pretrained(TOKENIZER_DIR)


def chat_tokenizer() -> Any:
    """The shipped ChatML chat tokenizer as a ``transformers`` fast tokenizer, loaded offline (``padpipe[hf]``).

    Example:
        >>> tok = pp.examples.chat_tokenizer()
        >>> tok.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False)
        '<|im_start|>user\\nHi<|im_end|>\\n'
    """
    transformers = require("transformers", "pp.examples.chat_tokenizer()")
    return transformers.AutoTokenizer.from_pretrained(CHAT_TOKENIZER_DIR)


def conversations(n: int, *, seed: int = 0, corpus: str | os.PathLike = SAMPLE_JSONL) -> list[dict[str, Any]]:
    """``n`` conversations made of real sentences, as rows ``{"messages": [...], "id": i}`` (the same for a seed).

    Three in ten open with a system message; then one to four user/assistant exchanges (more are rarer), each
    ending with an answer. A question is one or two sentences of ``corpus``; an answer's sentence count has a
    long tail (a median of 2, a few past 12), so tokenized lengths are long-tailed as real chat data is.
    ``CHATS_JSONL`` holds ``conversations(1000, seed=0)``.

    Args:
        n: How many.
        seed: Same seed, same conversations.
        corpus: A JSON Lines file of documents (a ``text`` field each) to take sentences from; default:
            the shipped corpus.

    Example:
        >>> rows = pp.examples.conversations(2, seed=1)
        >>> [m["role"] for m in rows[0]["messages"]], rows[1]["id"]
        (['system', 'user', 'assistant'], 1)
    """
    rng = random.Random(seed)
    pool = _sentences(os.fspath(corpus))

    def text(count: int) -> str:
        return " ".join(rng.choice(pool) for _ in range(count))

    rows = []
    for i in range(n):
        messages = [{"role": "system", "content": text(1)}] if rng.random() < 0.3 else []
        for _ in range(min(8, 1 + int(rng.expovariate(0.7)))):
            messages.append({"role": "user", "content": text(rng.randint(1, 2))})
            messages.append({"role": "assistant", "content": text(min(24, 1 + int(rng.lognormvariate(0.5, 0.9))))})
        rows.append({"messages": messages, "id": i})
    return rows


def preferences(n: int, *, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` preference pairs in TRL's conversational format, made of :func:`conversations`: each one's messages
    before its last answer are the ``prompt``, that answer is ``chosen``, and the last answer of the next
    conversation is ``rejected`` (an answer to another question). ``PREFERENCES_JSONL`` holds ``preferences(400)``.

    Example:
        >>> row = pp.examples.preferences(2)[0]
        >>> [m["role"] for m in row["prompt"]][-1], row["chosen"][0]["role"], row["rejected"][0]["role"], row["id"]
        ('user', 'assistant', 'assistant', 0)
    """
    chats = [row["messages"] for row in conversations(n + 1, seed=seed)]
    return [
        {"prompt": chat[:-1], "chosen": chat[-1:], "rejected": after[-1:], "id": i}
        for i, (chat, after) in enumerate(zip(chats, chats[1:]))
    ]


@functools.lru_cache(maxsize=2)
def _sentences(corpus: str) -> tuple[str, ...]:
    """The sentences of a JSON Lines corpus (3 to 300 characters), in file order."""
    opener: Any = gzip.open if corpus.endswith(".gz") else open
    with opener(corpus, "rt", encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for line in f if line.strip()]
    found = (s.strip() for text in texts for s in re.split(r"(?<=[.!?])\s+|\n{2,}", text))
    return tuple(s for s in found if 3 <= len(s) <= 300)
