"""A tokenizer's JSON, serialized once per process (Qwen's 151k ids: 0.3 s): the private copies and fingerprints
read it. It is kept for the last few tokenizers under a cheap key of what can change in place (sizes, added
tokens, pipeline parts, model settings), so a changed tokenizer is read again; a model replaced in place by one
of the same kind and size is not seen (build a new tokenizer object for that). Truncation and padding are
written as null: the copies set their own, and ``transformers`` leaves its last call's there.
"""

from __future__ import annotations

import hashlib
import weakref
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from tokenizers import Tokenizer

MEMO_SIZE = 4
"""Tokenizers whose JSON is kept (an entry holds a weak reference to its tokenizer)."""
_memo: dict[int, tuple[Any, tuple[Any, ...], TokenizerJson]] = {}  # id -> (weak reference, key, JSON)


@dataclass(frozen=True)
class TokenizerJson:
    """A tokenizer's JSON (truncation and padding null) and the vocabulary size with its added tokens.

    Example:
        >>> found = tokenizer_json(pp.examples.tokenizer())
        >>> found is tokenizer_json(pp.examples.tokenizer()), found.fingerprint  # another object: read again
        (False, 'vocab=8000 sha1=...')
    """

    text: str
    vocab_size: int
    id_bound: int = 0  # every id is below it: the vocabulary size, or past its highest id where ids leave gaps

    @cached_property
    def fingerprint(self) -> str:
        """The tokenizer's identity, checked on resume and naming a token cache: its size and a digest of its JSON."""
        return f"vocab={self.vocab_size} sha1={hashlib.sha1(self.text.encode()).hexdigest()[:16]}"

    def copy(self) -> Tokenizer:
        """A private copy of the tokenizer (one parse)."""
        return Tokenizer.from_str(self.text)


def tokenizer_json(tokenizer: Tokenizer) -> TokenizerJson:
    """The JSON of ``tokenizer``: serialized once, then given back while the tokenizer is unchanged.

    Example:
        >>> tok = pp.examples.tokenizer()
        >>> before = tokenizer_json(tok)
        >>> before is tokenizer_json(tok), tok.add_tokens(["<new>"]), tokenizer_json(tok).vocab_size
        (True, 1, 8001)
    """
    key = _key(tokenizer)
    found = _memo.get(id(tokenizer))
    if found is not None and found[0]() is tokenizer and found[1] == key:
        return found[2]
    result = TokenizerJson(_untruncated(tokenizer.to_str()), tokenizer.get_vocab_size(True), _id_bound(tokenizer))
    for old in list(_memo)[: max(0, len(_memo) + 1 - MEMO_SIZE)]:  # (list(): a copy, safe beside other threads)
        _memo.pop(old, None)
    _memo[id(tokenizer)] = (weakref.ref(tokenizer), key, result)
    return result


GAP_PROBES = 4096
"""Ids past the vocabulary size probed for more ids (a vocabulary with gaps, e.g. CamemBERT's missing id 3)."""


def _id_bound(tokenizer: Tokenizer) -> int:
    """One past the highest id: the vocabulary size, unless ids leave gaps (probed up to ``GAP_PROBES`` past the
    last one found, a microsecond each, not a whole vocabulary read).

    Example:
        >>> from tokenizers.models import WordLevel
        >>> _id_bound(Tokenizer(WordLevel({"a": 0, "[UNK]": 1, "z": 9}, unk_token="[UNK]")))
        10
    """
    bound = probe = tokenizer.get_vocab_size(True)
    while probe < bound + GAP_PROBES:
        if tokenizer.id_to_token(probe) is not None:
            bound = probe + 1
        probe += 1
    return bound


def _key(tokenizer: Tokenizer) -> tuple[Any, ...]:
    """What can change in a tokenizer in place, read without serializing its vocabulary."""
    parts = (tokenizer.normalizer, tokenizer.pre_tokenizer, tokenizer.post_processor, tokenizer.decoder)
    model = tokenizer.model
    return (
        tokenizer.get_vocab_size(True),
        tokenizer.get_vocab_size(False),
        repr(sorted(tokenizer.get_added_tokens_decoder().items())),
        tuple(None if part is None else part.__getstate__() for part in parts),
        type(model).__name__,
        _settings(model),
    )


def _settings(model: Any) -> tuple[tuple[str, Any], ...]:
    """Every setting the model exposes (BPE's ``dropout``, ``ignore_merges``, ``fuse_unk``, WordPiece's
    ``max_input_chars_per_word``...): all its public attributes that are not methods, so none is left out."""
    values = ((name, getattr(model, name)) for name in dir(model) if not name.startswith("_"))
    return tuple((name, value) for name, value in values if not callable(value))


def _untruncated(text: str) -> str:
    """``text`` with ``"truncation"`` and ``"padding"`` null. The serializer writes them first, before
    ``"added_tokens"``; a quote inside a JSON string is escaped, so the first ``,"added_tokens":`` is that key.

    Example:
        >>> _untruncated('{"version":"1.0","truncation":{"max_length":8},"padding":null,"added_tokens":[]}')
        '{"version":"1.0","truncation":null,"padding":null,"added_tokens":[]}'
    """
    start, end = text.find(',"truncation":'), text.find(',"added_tokens":')
    if not 0 < start < end:
        raise ValueError("tokenizer_json(): the tokenizer's JSON does not start with its truncation and padding.")
    return text[:start] + ',"truncation":null,"padding":null' + text[end:]
