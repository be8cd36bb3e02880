"""Long texts cut before tokenizing: a row truncated to ``max_length`` tokens needs only its start.

The Rust tokenizer tokenizes a whole text and then truncates it, so a 20,000-word document costs
20,000 words of work for 512 tokens. When the tokenizer works word by word (its normalizer maps
characters one by one, its pre-tokenizer splits at spaces, and no added token holds a space),
the tokens of a text's first words are the first tokens of the text. So a single text longer
than :data:`CHARS_PER_TOKEN` (8) characters per allowed token is cut at a space that follows a
non-space character (a word boundary for every such pre-tokenizer: the space belongs to what
comes after it), and encoded; a row that still comes out shorter than ``max_length`` ran out of
text before the limit and is encoded again whole. The ids equal the whole text's, truncated.
Pairs, left truncation and other tokenizers are always encoded whole.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

CHARS_PER_TOKEN = 8
LOCAL_NORMALIZERS = {"BertNormalizer", "Lowercase", "NFC", "NFD", "NFKC", "NFKD", "StripAccents", "Strip", "Prepend"}
WORD_PRE_TOKENIZERS = {"BertPreTokenizer", "Whitespace", "WhitespaceSplit", "Punctuation", "Digits"}


def prefix_chars(tokenizer_json: str, max_length: int | None, truncation_side: str) -> int | None:
    """How many characters of a single text to tokenize for ``max_length`` tokens, or ``None``: always all.

    Example:
        >>> prefix_chars(pp.examples.tokenizer().to_str(), 512, "right"), prefix_chars("{}", 512, "right")
        (4096, None)
    """
    if max_length is None or truncation_side != "right":
        return None
    config = json.loads(tokenizer_json)
    pre_tokenizer = config.get("pre_tokenizer")
    if pre_tokenizer is None:  # the whole text is one piece: tokens may cross spaces
        return None
    if not _local(config.get("normalizer"), normalizer=True) or not _local(pre_tokenizer, normalizer=False):
        return None
    if any(any(c.isspace() for c in token.get("content", "")) for token in config.get("added_tokens") or []):
        return None
    return CHARS_PER_TOKEN * max_length


def _local(part: dict[str, Any] | None, *, normalizer: bool) -> bool:
    """Whether a normalizer (or pre-tokenizer) config works character by character (word by word)."""
    if part is None:
        return True
    kind = part.get("type")
    if kind == "Sequence":
        return all(
            _local(p, normalizer=normalizer) for p in part.get("normalizers" if normalizer else "pretokenizers", [])
        )
    if normalizer:
        if kind == "Replace":  # a plain string of only spaces, or none: no match can straddle the cut
            pattern = part.get("pattern", {}).get("String")
            return (
                isinstance(pattern, str)
                and bool(pattern)
                and (pattern.isspace() or not any(c.isspace() for c in pattern))
            )
        return kind in LOCAL_NORMALIZERS
    if kind == "ByteLevel":
        return bool(part.get("use_regex", True))
    if kind == "Metaspace":
        return bool(part.get("split", True))
    return kind in WORD_PRE_TOKENIZERS


def cut(texts: Sequence[str], chars: int) -> tuple[list[str], list[int]]:
    """``texts`` with those longer than ``chars`` cut at the last word boundary before it; the cut rows.

    Example:
        >>> cut(["a b  c d", "short"], 6)
        (['a b', 'short'], [0])
    """
    out, rows = list(texts), []
    for i, text in enumerate(texts):
        if len(text) <= chars:
            continue
        at = text.rfind(" ", 0, chars)
        while at > 0 and text[at - 1].isspace():  # a space right after a non-space character
            at = text.rfind(" ", 0, at)
        if at > 0:
            out[i] = text[:at]
            rows.append(i)
    return out, rows
