"""The shipped sample data and tokenizers by name, for the command lines: ``--data sample --tokenizer sample``.

A name of :data:`DATA` or :data:`TOKENIZERS` stands for the file installed inside the package, so the documented
commands run from any folder; a file or folder of that name in the current folder wins (it is what the user named).
"""

from __future__ import annotations

import os

from padpipe import examples

DATA = {
    "sample": examples.SAMPLE_PARQUET,
    "corpus": examples.SAMPLE_JSONL,
    "chats": examples.CHATS_JSONL,
    "preferences": examples.PREFERENCES_JSONL,
}
"""Data names and the installed files they stand for."""
TOKENIZERS = {"sample": examples.TOKENIZER_JSON, "chat": examples.CHAT_TOKENIZER_DIR}
"""Tokenizer names and the installed files they stand for."""


def data(text: str) -> str:
    """The path ``text`` names: an installed sample for a name in :data:`DATA`, else ``text`` itself.

    Example:
        >>> data("sample") == pp.examples.SAMPLE_PARQUET, data("train.parquet")
        (True, 'train.parquet')
    """
    return _resolve(text, DATA)


def tokenizer(text: str) -> str:
    """The tokenizer ``text`` names: an installed one for a name in :data:`TOKENIZERS`, else ``text`` itself.

    Example:
        >>> tokenizer("sample") == pp.examples.TOKENIZER_JSON, tokenizer("bert-base-uncased")
        (True, 'bert-base-uncased')
    """
    return _resolve(text, TOKENIZERS)


def data_help() -> str:
    """The sentence ``--help`` adds to a data option: the names and where their files are installed.

    Example:
        >>> data_help().startswith("'sample' is the shipped sentence pairs (")
        True
    """
    return (
        f"'sample' is the shipped sentence pairs ({DATA['sample']}), 'corpus' the shipped documents "
        f"({DATA['corpus']}), 'chats' the shipped conversations ({DATA['chats']}), 'preferences' the shipped "
        f"preference pairs ({DATA['preferences']})"
    )


def tokenizer_help() -> str:
    """The sentence ``--help`` adds to a tokenizer option: ``sample`` and where it is installed.

    Example:
        >>> tokenizer_help().startswith("'sample' is the shipped WordPiece tokenizer (")
        True
    """
    return (
        f"'sample' is the shipped WordPiece tokenizer ({TOKENIZERS['sample']}), 'chat' the shipped chat tokenizer "
        f"({TOKENIZERS['chat']}; needs padpipe[hf])"
    )


def _resolve(text: str, names: dict[str, str]) -> str:
    if text in names and not os.path.exists(text):
        return names[text]
    return text
