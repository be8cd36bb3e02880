"""The batch text encoder behind ``tokenize``: a private copy of a fast (Rust) tokenizer, truncating as
``transformers`` does, its batch call's output one flat :class:`~padpipe.chunks.TokenChunk`."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from functools import cached_property
from itertools import chain
from operator import attrgetter
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from padpipe._optional import require
from padpipe.chunks import ID_DTYPE, TYPE_ID_DTYPE, TokenChunk, exclusive_cumsum
from padpipe.errors import check_bool, positive
from padpipe.tokenizer.prefix import cut, prefix_chars
from padpipe.tokenizer.serialized import TokenizerJson, tokenizer_json
from padpipe.tokenizer.truncate import truncate_pairs

HUB_NAME = re.compile(r"[A-Za-z0-9][\w.\-]{0,95}(/[A-Za-z0-9][\w.\-]{0,95})?")
"""A Hugging Face Hub repo id: ``name`` or ``org/name`` (what ``from_pretrained`` may look up online)."""
MODEL_MAX_LENGTH_LIMIT = int(1e9)
"""A ``model_max_length`` at or above this is ``transformers``' "no limit" placeholder."""
PAD_TOKENS = ("[PAD]", "<pad>")
EOS_TOKENS = ("</s>", "<|endoftext|>", "<eos>", "<|end_of_text|>")
BOS_TOKENS = ("<s>", "<bos>", "<|begin_of_text|>", "<|endoftext|>")
_IDS = attrgetter("ids")
_TYPE_IDS = attrgetter("type_ids")


class TextEncoder:
    """Encodes batches of texts (or text pairs) into flat token arrays with a private Rust tokenizer.

    Build one with :meth:`load`. Ids and type ids equal ``tok(text, text_pair, truncation=True,
    max_length=max_length, add_special_tokens=add_special_tokens)``'s. Thread-safe (the Rust batch call
    releases the GIL) and picklable (DataLoader workers get their own copy).

    Args:
        tokenizer: A ``tokenizers.Tokenizer`` this encoder owns (configured in place).
        source: Its JSON (:func:`~padpipe.tokenizer.serialized.tokenizer_json`).
        max_length: Truncate every row (or pair, ``longest_first``) to this many tokens, special
            tokens included; ``None`` for no truncation.
        truncation_side: ``"right"`` or ``"left"``.
        add_special_tokens: Apply the post-processor's template (``[CLS] A [SEP]`` ...).
        encode_special_tokens: Split special-token text like any other text (``split_special_tokens``).
        pad_id, eos_id, bos_id: The pad, end- and beginning-of-sequence token ids, or ``None``.
        returns_token_type_ids: Whether :meth:`encode` returns token type ids.

    Example:
        >>> from padpipe.tokenizer import TextEncoder
        >>> enc = TextEncoder.load(pp.examples.tokenizer(), max_length=None, truncation=True,
        ...                        add_special_tokens=True)
        >>> chunk = enc.encode(["hello world", ""])
        >>> chunk.lengths.tolist(), enc.pad_id
        ([4, 2], 0)
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        source: TokenizerJson,
        *,
        max_length: int | None,
        truncation_side: str,
        add_special_tokens: bool,
        encode_special_tokens: bool,
        pad_id: int | None,
        eos_id: int | None,
        bos_id: int | None,
        returns_token_type_ids: bool,
    ) -> None:
        self._tokenizer, self._source = tokenizer, source
        self.max_length, self.truncation_side = max_length, truncation_side
        self.add_special_tokens, self.encode_special_tokens = add_special_tokens, encode_special_tokens
        self.pad_id, self.eos_id, self.bos_id = pad_id, eos_id, bos_id
        self.returns_token_type_ids = returns_token_type_ids
        self._configure()

    @classmethod
    def load(cls, tokenizer: Any, *, max_length: int | None, truncation: bool, add_special_tokens: bool) -> TextEncoder:
        """Make an encoder from a fast tokenizer, a ``tokenizers.Tokenizer`` or a path/name.

        Args:
            tokenizer: A ``transformers`` fast tokenizer, a ``tokenizers.Tokenizer``, a path to a
                ``tokenizer.json`` file, or a folder or hub name for ``AutoTokenizer.from_pretrained``.
            max_length: Most tokens per row, special tokens included. ``None`` with ``truncation=True``
                uses the ``transformers`` tokenizer's ``model_max_length`` when it is a real limit; a bare
                ``tokenizers.Tokenizer`` has none (its baked-in truncation gives only the side).
            truncation: Whether to truncate at all (``False`` ignores ``max_length``, as ``transformers`` does).
            add_special_tokens: Add the template's special tokens.

        Raises:
            TypeError: For a slow (Python) ``transformers`` tokenizer or an unknown object.
            FileNotFoundError: For a path that names nothing and is no hub name, at once.
            MissingDependencyError: For a folder or hub name without ``transformers`` (``padpipe[hf]``).

        Example:
            >>> from padpipe.tokenizer import TextEncoder
            >>> enc = TextEncoder.load(pp.examples.TOKENIZER_DIR, max_length=None, truncation=True,
            ...                        add_special_tokens=True)
            >>> enc.max_length, enc.returns_token_type_ids
            (512, True)
        """
        positive("max_length", max_length, allow_none=True)
        check_bool("truncation", truncation)
        check_bool("add_special_tokens", add_special_tokens)
        if isinstance(tokenizer, (str, os.PathLike)):
            tokenizer = _from_path(tokenizer)
        if isinstance(tokenizer, Tokenizer):
            return cls._from_rust(tokenizer, max_length, truncation, add_special_tokens)
        if isinstance(getattr(tokenizer, "backend_tokenizer", None), Tokenizer):
            return cls._from_transformers(tokenizer, max_length, truncation, add_special_tokens)
        if hasattr(tokenizer, "model_input_names") and hasattr(tokenizer, "is_fast"):
            raise TypeError(
                f"tokenize() needs a fast (Rust) tokenizer, but {type(tokenizer).__name__} is a slow (Python) one; "
                "load it with AutoTokenizer.from_pretrained(..., use_fast=True) or pass a tokenizers.Tokenizer."
            )
        raise TypeError(
            "`tokenizer` must be a transformers fast tokenizer, a tokenizers.Tokenizer or a path, "
            f"but is {type(tokenizer).__name__} instead."
        )

    @classmethod
    def _from_transformers(cls, tok: Any, max_length: int | None, truncation: bool, special: bool) -> TextEncoder:
        source = tokenizer_json(tok.backend_tokenizer)
        rust = source.copy()
        if truncation and max_length is None:
            limit = tok.model_max_length
            max_length = int(limit) if limit is not None and limit < MODEL_MAX_LENGTH_LIMIT else None
        return cls(
            rust,
            source,
            max_length=max_length if truncation else None,
            truncation_side=tok.truncation_side,
            add_special_tokens=special,
            encode_special_tokens=bool(getattr(tok, "split_special_tokens", False)),
            pad_id=_first_id(rust, [tok.pad_token_id, _padding_id(tok.backend_tokenizer)], PAD_TOKENS),
            eos_id=tok.eos_token_id,
            bos_id=tok.bos_token_id,
            returns_token_type_ids="token_type_ids" in tok.model_input_names,
        )

    @classmethod
    def _from_rust(cls, tok: Tokenizer, max_length: int | None, truncation: bool, special: bool) -> TextEncoder:
        source = tokenizer_json(tok)
        rust = source.copy()
        baked = tok.truncation or {}
        pad_id = _first_id(rust, [_padding_id(tok)], PAD_TOKENS)
        rust.no_truncation()
        rust.no_padding()
        pair = rust.encode("a", "b")
        return cls(
            rust,
            source,
            max_length=max_length if truncation else None,
            truncation_side=str(baked.get("direction", "right")).lower(),
            add_special_tokens=special,
            encode_special_tokens=tok.encode_special_tokens,
            pad_id=pad_id,
            eos_id=_first_id(rust, [], EOS_TOKENS),
            bos_id=_first_id(rust, [], BOS_TOKENS),
            returns_token_type_ids=1 in pair.type_ids,
        )

    def _configure(self) -> None:
        tok = self._tokenizer
        tok.no_padding()
        if self.max_length is None:
            tok.no_truncation()
        else:
            tok.enable_truncation(self.max_length, stride=0, strategy="longest_first", direction=self.truncation_side)
        tok.encode_special_tokens = self.encode_special_tokens
        # encode_batch_fast (tokenizers >= 0.20) gives the same ids without computing offsets
        self._encode_batch = getattr(tok, "encode_batch_fast", tok.encode_batch)
        # long single texts are cut before encoding where that gives the same ids (see padpipe.tokenizer.prefix)
        self._prefix_chars = prefix_chars(self._source.text, self.max_length, self.truncation_side)
        # pairs are encoded whole by an untruncated twin (parsed at the first pair) and cut by _truncate (see there)
        self._pair_limit = None
        if self.max_length is not None:
            added = tok.num_special_tokens_to_add(True) if self.add_special_tokens else 0
            # the Rust tokenizer does not truncate at all when max_length < added tokens
            self._pair_limit = self.max_length - added if self.max_length >= added else None

    def encode(self, texts: Sequence[str], pairs: Sequence[str] | None = None) -> TokenChunk:
        """Encode ``texts`` (and their ``pairs``) with one Rust batch call into a flat chunk (no columns;
        ``type_ids`` only with :attr:`returns_token_type_ids`).

        Args:
            texts: The first text of every row.
            pairs: The second text of every row, or ``None`` for single texts.

        Example:
            >>> from padpipe.tokenizer import TextEncoder
            >>> enc = TextEncoder.load(pp.examples.tokenizer(), max_length=8, truncation=True,
            ...                        add_special_tokens=True)
            >>> enc.encode(["hello"], ["world"]).type_ids.tolist()
            [0, 0, 0, 1, 1]
        """
        special = self.add_special_tokens
        if pairs is None:
            return flatten(self._encode_singles(texts, special), self.returns_token_type_ids)
        inputs = list(zip(texts, pairs))
        if self.max_length is None:
            return flatten(self._encode_batch(inputs, add_special_tokens=special), self.returns_token_type_ids)
        encodings = self._encode_pairs(inputs, add_special_tokens=special)
        chunk = flatten(encodings, self.returns_token_type_ids)
        lengths = chunk.lengths
        rows = np.flatnonzero(lengths > self.max_length) if self._pair_limit is not None else []
        if len(rows) == 0:
            return chunk
        mask, kept = truncate_pairs(encodings, lengths, chunk.offsets, rows, self._pair_limit, self.truncation_side)
        lengths[rows] = kept
        offsets = exclusive_cumsum(lengths)
        type_ids = None if chunk.type_ids is None else chunk.type_ids[mask]
        return TokenChunk(chunk.ids[mask], offsets, type_ids)

    @property
    def vocab_size(self) -> int:
        """The vocabulary size, added tokens included: ids are below it (past the highest id where ids leave gaps).

        Example:
            >>> enc = TextEncoder.load(pp.examples.tokenizer(), max_length=8, truncation=True, add_special_tokens=True)
            >>> enc.vocab_size
            8000
        """
        return self._source.id_bound

    def special_tokens_added(self, pair: bool = True) -> int:
        """How many special tokens a row gets (of a sentence pair when ``pair``), whatever ``add_special_tokens`` says.

        Example:
            >>> enc = TextEncoder.load(pp.examples.tokenizer(), max_length=8, truncation=True, add_special_tokens=True)
            >>> enc.special_tokens_added()
            3
        """
        return self._tokenizer.num_special_tokens_to_add(pair)

    def special_tokens(self) -> list[str]:
        """The tokenizer's special tokens, in id order (what an EOS could be set to).

        Example:
            >>> enc = TextEncoder.load(pp.examples.tokenizer(), max_length=8, truncation=True, add_special_tokens=True)
            >>> enc.special_tokens()
            ['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]']
        """
        added = self._tokenizer.get_added_tokens_decoder()
        return [token.content for _, token in sorted(added.items()) if token.special]

    def fingerprint(self) -> str:
        """The tokenizer's identity, checked on resume: vocabulary size and a digest of its JSON (truncation and
        padding left out; ``max_length`` is checked on its own).

        Example:
            >>> enc = TextEncoder.load(pp.examples.tokenizer(), max_length=8, truncation=True, add_special_tokens=True)
            >>> enc.fingerprint()
            'vocab=... sha1=...'
        """
        return self._source.fingerprint

    @cached_property
    def _encode_pairs(self) -> Any:
        """The batch call of an untruncated copy, for pairs (parsed once, at the first pair)."""
        copy = self._source.copy()
        copy.encode_special_tokens = self.encode_special_tokens
        return getattr(copy, "encode_batch_fast", copy.encode_batch)

    def _encode_singles(self, texts: Sequence[str], special: bool) -> list:
        """Encodings of single texts; long ones from their start only where the ids are the same."""
        if self._prefix_chars is None:
            return self._encode_batch(texts, add_special_tokens=special)
        starts, rows = cut(texts, self._prefix_chars)
        encodings = self._encode_batch(starts, add_special_tokens=special)
        short = [i for i in rows if len(encodings[i].ids) < self.max_length]  # ran out of text before the limit
        if short:
            for i, encoding in zip(short, self._encode_batch([texts[i] for i in short], add_special_tokens=special)):
                encodings[i] = encoding
        return encodings

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)  # the tokenizer travels as its source's JSON: nothing serialized here
        for derived in ("_tokenizer", "_encode_batch", "_encode_pairs", "_pair_limit", "_prefix_chars"):
            state.pop(derived, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._tokenizer = self._source.copy()
        self._configure()

    def __repr__(self) -> str:
        return (
            f"TextEncoder(max_length={self.max_length}, truncation_side={self.truncation_side!r}, "
            f"add_special_tokens={self.add_special_tokens}, pad_id={self.pad_id})"
        )


def flatten(encodings: Sequence, with_type_ids: bool = False) -> TokenChunk:
    """The Rust encodings of a batch as one flat chunk (the fastest of the variants measured)."""
    ids_lists = list(map(_IDS, encodings))
    lengths = np.fromiter(map(len, ids_lists), dtype=np.int64, count=len(ids_lists))
    offsets = exclusive_cumsum(lengths)
    total = int(offsets[-1])
    ids = np.fromiter(chain.from_iterable(ids_lists), dtype=ID_DTYPE, count=total)
    type_ids = None
    if with_type_ids:
        type_ids = np.fromiter(chain.from_iterable(map(_TYPE_IDS, encodings)), dtype=TYPE_ID_DTYPE, count=total)
    return TokenChunk(ids, offsets, type_ids)


def _from_path(path: str | os.PathLike) -> Any:
    """A ``tokenizer.json`` file as a ``tokenizers.Tokenizer``; a folder or hub name via ``AutoTokenizer``. A name
    that can only be a local path (``./x``, ``a/b/c``, ``x.json``, an ``org/name`` whose ``org`` is a local folder)
    and names nothing fails at once, before ``transformers`` would try the Hub."""
    name = os.fspath(path)
    p = Path(name).expanduser()
    if p.is_file():
        return Tokenizer.from_file(str(p))
    if not p.is_dir() and (not isinstance(path, str) or not _is_hub_name(name)):
        raise FileNotFoundError(f"Tokenizer {name!r}: no such file or folder.")
    if not p.is_dir() and "/" in name and Path(name.split("/")[0]).is_dir():
        raise FileNotFoundError(
            f"Tokenizer {name!r}: no such file or folder ({name.split('/')[0]!r} is a local folder; for the hub "
            f"name, pass AutoTokenizer.from_pretrained({name!r}))."
        )
    what = f"loading the tokenizer folder {name!r}" if p.is_dir() else f"loading the tokenizer {name!r} from the Hub"
    transformers = require("transformers", what)
    return transformers.AutoTokenizer.from_pretrained(str(p) if p.is_dir() else name)


def _is_hub_name(name: str) -> bool:
    """Whether ``name`` has the form of a Hugging Face Hub repo id: ``name`` or ``org/name``.

    Example:
        >>> _is_hub_name("bert-base-uncased"), _is_hub_name("org/model.v2"), _is_hub_name("data/tok/"), _is_hub_name("tok.json")
        (True, True, False, False)
    """  # noqa: E501
    return bool(HUB_NAME.fullmatch(name)) and ".." not in name and "--" not in name and not name.endswith(".json")


def _padding_id(tok: Tokenizer) -> int | None:
    return (tok.padding or {}).get("pad_id")


def _first_id(tok: Tokenizer, known: list[int | None], names: Sequence[str]) -> int | None:
    """The first id in ``known`` that is set, else the first of ``names`` in the vocab, else ``None``."""
    for value in known:
        if value is not None:
            return int(value)
    for name in names:
        token_id = tok.token_to_id(name)
        if token_id is not None:
            return token_id
    return None
