"""The embedded default: a sample corpus and a WordPiece tokenizer shipped inside the package.

Example:
    >>> import padpipe as pp
    >>> pp.examples.tokenizer().encode("Hello world").tokens[0]
    '[CLS]'
"""

from __future__ import annotations

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


def tokenizer() -> Any:
    """The shipped WordPiece tokenizer as a ``tokenizers.Tokenizer`` (core only, no ``transformers``).

    Example:
        >>> pp.examples.tokenizer().token_to_id("[PAD]")
        0
    """
    from tokenizers import Tokenizer

    return Tokenizer.from_file(TOKENIZER_JSON)


def hf_tokenizer() -> Any:
    """The shipped tokenizer as a ``transformers`` fast tokenizer, loaded offline from its folder.

    Needs ``transformers`` (``pip install 'padpipe[hf]'``).

    Example:
        >>> pp.examples.hf_tokenizer().pad_token
        '[PAD]'
    """
    transformers = require("transformers", "pp.examples.hf_tokenizer()")
    return transformers.AutoTokenizer.from_pretrained(TOKENIZER_DIR)
