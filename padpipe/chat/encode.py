"""Rendered conversations to token ids, as ``apply_chat_template`` tokenizes them, and character spans to tokens.

:class:`SpanEncoder` encodes with a private copy of the tokenizer's Rust core (the user's object is never changed)
without its post-processor: with ``add_special_tokens=False`` (what ``apply_chat_template`` passes) a post-processor
adds no token, so the ids are the same, and the character offsets of the tokens are the pre-tokenizer's own,
untrimmed (a byte-level post-processor trims a whitespace token's offsets to nothing, and a span test on those would
drop it from an answer). Plain-text prompt/completion rows are encoded with the special tokens, as TRL does, and
mapped onto the same offsets.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from itertools import chain
from operator import attrgetter
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from padpipe.chat.labels import positions
from padpipe.tokenizer import TextEncoder
from padpipe.tokenizer.encoder import flatten
from padpipe.tokenizer.serialized import tokenizer_json

_OFFSETS = attrgetter("offsets")


@dataclass(frozen=True)
class Tokens:
    """Encoded rows: row ``i`` is ``ids[offsets[i]:offsets[i + 1]]``; ``starts``/``ends``: each token's characters."""

    ids: np.ndarray
    offsets: np.ndarray
    starts: np.ndarray
    ends: np.ndarray


class SpanEncoder:
    """Encode texts as ``tokenizer(text, add_special_tokens=False)``, with each token's character span.

    Args:
        tokenizer: A ``transformers`` fast tokenizer.

    Example:
        >>> enc = SpanEncoder(pp.examples.hf_tokenizer())
        >>> tokens = enc.encode(["hello world", "hi"])
        >>> tokens.offsets.tolist(), enc.mask(tokens, np.array([0]), np.array([6]), np.array([11])).tolist()
        ([0, 2, 4], [False, True, False, False])
    """

    def __init__(self, tokenizer: Any) -> None:
        self._source = tokenizer_json(tokenizer.backend_tokenizer)  # serialized once per process
        self._tokenizer, self._lock = tokenizer, threading.Lock()
        self._copy: Tokenizer | None = None

    @property
    def _raw(self) -> Tokenizer:
        """The private copy (parsed at the first text to encode: an epoch read from a cache never needs it)."""
        with self._lock:
            if self._copy is None:
                raw = self._source.copy()
                raw.post_processor = None
                raw.encode_special_tokens = bool(getattr(self._tokenizer, "split_special_tokens", False))
                self._copy = raw
            return self._copy

    def fingerprint(self) -> str:
        """The tokenizer's identity (see :meth:`padpipe.tokenizer.TextEncoder.fingerprint`)."""
        return self._source.fingerprint

    @cached_property
    def _special(self) -> TextEncoder:
        """An encoder with the post-processor's special tokens, for plain prompt/completion text only."""
        return TextEncoder.load(self._tokenizer, max_length=None, truncation=False, add_special_tokens=True)

    def encode(self, texts: Sequence[str]) -> Tokens:
        """The tokens of ``texts`` (one Rust batch call) with their character spans."""
        encodings = self._raw.encode_batch(list(texts), add_special_tokens=False)
        chunk = flatten(encodings)
        pairs = chain.from_iterable(chain.from_iterable(map(_OFFSETS, encodings)))
        spans = np.fromiter(pairs, dtype=np.int64, count=2 * chunk.num_tokens).reshape(-1, 2)
        return Tokens(chunk.ids, chunk.offsets, spans[:, 0].copy(), spans[:, 1].copy())

    def encode_plain(self, texts: Sequence[str]) -> Tokens:
        """The tokens of ``texts`` with the special tokens the tokenizer adds (its post-processor's), as TRL
        tokenizes plain prompt/completion text; an added token's span is empty, at its text's start or end."""
        raw = self.encode(texts)
        chunk = self._special.encode(list(texts))
        head, tail = self._added
        lengths, raw_lengths = chunk.lengths, np.diff(raw.offsets)
        inner = np.repeat(chunk.offsets[:-1] + head, raw_lengths) + positions(raw.offsets)
        if (lengths != raw_lengths + head + tail).any() or not np.array_equal(chunk.ids[inner], raw.ids):
            raise ValueError(
                "chat(): the tokenizer's post-processor adds tokens inside the text; expected only "
                "before or after it (as BOS and EOS)."
            )
        ends = np.repeat(np.fromiter(map(len, texts), dtype=np.int64, count=len(texts)), lengths)
        starts, stops = np.zeros(len(chunk.ids), np.int64), ends.copy()  # added tokens after the text
        is_head = positions(chunk.offsets) < head
        starts[is_head] = stops[is_head] = 0
        starts[inner], stops[inner] = raw.starts, raw.ends
        return Tokens(chunk.ids, chunk.offsets, starts, stops)

    @staticmethod
    def mask(tokens: Tokens, rows: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """Which tokens overlap a character span ``[lo, hi)`` of their row (vectorized over all spans).

        An empty token (added by a post-processor) counts as inside when its place is: ``lo < place <= hi``.
        """
        total = len(tokens.ids)
        mask = np.zeros(total + 1, dtype=np.int64)
        if not len(rows) or not total:
            return mask[:total] > 0
        row_of = np.repeat(np.arange(len(tokens.offsets) - 1), np.diff(tokens.offsets))
        width = int(max(tokens.ends.max(), hi.max())) + 2
        empty = tokens.ends == tokens.starts
        ends = np.maximum.accumulate(row_of * width + tokens.ends)  # keyed by row: rises row by row
        starts = np.maximum.accumulate(row_of * width + np.where(empty, tokens.starts - 1, tokens.starts))
        first = np.searchsorted(ends, rows * width + lo, side="right")
        stop = np.searchsorted(starts, rows * width + hi, side="left")
        keep = stop > first
        np.add.at(mask, first[keep], 1)
        np.add.at(mask, stop[keep], -1)
        return np.cumsum(mask)[:total] > 0

    @cached_property
    def _added(self) -> tuple[int, int]:
        """How many tokens the post-processor adds before and after a text."""
        raw = self._raw.encode("a", add_special_tokens=False).ids
        full = self._special.encode(["a"]).ids.tolist()
        head = next((i for i in range(len(full) - len(raw) + 1) if full[i : i + len(raw)] == raw), None)
        if head is None:
            raise ValueError("chat(): the tokenizer's post-processor changes the text's tokens.")
        return head, len(full) - len(raw) - head
