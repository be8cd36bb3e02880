"""The embedded default: a sample corpus and a WordPiece tokenizer shipped inside the package.

Example:
    >>> import padpipe as pp
    >>> pp.examples.tokenizer().encode("Hello world").tokens[0]
    '[CLS]'
"""

from __future__ import annotations

from pathlib import Path

DATA_DIR = Path(__file__).parent / "data"
SAMPLE_PARQUET = str(DATA_DIR / "sample.parquet")
"""~20k sentence pairs (``sentence1``, ``sentence2``, ``label``, ``idx``) with long-tail lengths."""
SAMPLE_JSONL = str(DATA_DIR / "corpus.jsonl.gz")
"""~5k documents (``text``, ``id``) for pretraining and packing examples."""
TOKENIZER_JSON = str(DATA_DIR / "tokenizer.json")
"""A BERT-style WordPiece tokenizer (vocab ~8k) trained on the sample text."""
TOKENIZER_DIR = str(DATA_DIR / "tokenizer")
"""The same tokenizer as a folder that ``transformers.AutoTokenizer.from_pretrained`` loads."""


def tokenizer():
    """The shipped WordPiece tokenizer as a ``tokenizers.Tokenizer``."""
    from tokenizers import Tokenizer

    return Tokenizer.from_file(TOKENIZER_JSON)


def hf_tokenizer():
    """The shipped tokenizer as a ``transformers`` fast tokenizer (loaded from the local folder)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(TOKENIZER_DIR)
