"""The packer's pieces in its state: a sealed chunk, every leaf checked before one piece is placed.

A state edited with its checksums recomputed passes the CRC, so these checks (:meth:`Pieces.load`) are what keeps a
crafted piece from the model; each is a reduction over the whole chunk (numpy, Arrow), none loops per piece.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from padpipe.chunks import TokenChunk
from padpipe.errors import DataError
from padpipe.pipes.pieces import IGNORE, Piece, kept_values, token_labels, token_problem
from padpipe.state import Invalid, Spec
from padpipe.tokenizer.rows import LABELS


@dataclass(frozen=True)
class Pieces(Spec):
    """Pieces saved by :func:`~padpipe.pipes.pieces.pieces_to_chunk` with these ``keep`` columns; loads a list.

    Attributes:
        keep: The kept columns each piece carries.
        seq_len: The most tokens a piece holds (``None``: any).
        vocab_size: Every id is below it (``None``: not known, every id ``>= 0``).
        ignore: Labels a loss leaves out; every other label is an id.

    Example:
        >>> from padpipe.pipes.pieces import pieces_to_chunk
        >>> saved = pieces_to_chunk([Piece(np.array([3, 4], np.int32), None, ())]).to_state()
        >>> [p.ids.tolist() for p in Pieces(seq_len=4, vocab_size=8).load(saved)]
        [[3, 4]]
        >>> Pieces(seq_len=4, vocab_size=4).load(saved)
        Traceback (most recent call last):
        ...
        padpipe.state_specs.Invalid: pieces with ids from 0 to 3
    """

    keep: tuple[str, ...] = ()
    seq_len: int | None = None
    vocab_size: int | None = None
    ignore: tuple[int, ...] = (IGNORE,)

    def load(self, value: Any) -> list[Piece]:
        chunk = TokenChunk.from_state(value)
        names = sorted(chunk.columns)
        if chunk.num_rows and (set(names) - {LABELS, *self.keep} or set(self.keep) - set(names)):
            raise Invalid(f"pieces with the kept columns {list(self.keep)} (and labels)", f"pieces with {names}")
        if chunk.type_ids is not None:
            raise Invalid("pieces without token type ids", "pieces with token type ids")
        lengths = np.diff(chunk.offsets)
        longest = len(chunk.ids) if self.seq_len is None else self.seq_len
        bad = np.flatnonzero((lengths < 1) | (lengths > longest))
        if len(bad):
            at = int(bad[0])
            raise Invalid(f"pieces of 1 to {longest} tokens", f"a piece of {int(lengths[at])} tokens at index {at}")
        try:
            labels = token_labels(chunk)
        except DataError as exc:
            raise Invalid("pieces with one integer label per token", str(exc)[:120]) from None
        try:
            values = kept_values(chunk, self.keep) if chunk.num_rows else []
        except DataError as exc:
            raise Invalid("pieces whose kept columns are integers or strings", str(exc)[:120]) from None
        problem = token_problem(chunk.ids, labels, vocab_size=self.vocab_size, ignore=self.ignore)
        if problem is not None:
            at, expected, found = problem
            piece = int(np.searchsorted(chunk.offsets, at, side="right")) - 1
            raise Invalid(f"pieces with {expected}", f"{found} in the piece at index {piece}")
        rows = list(zip(*values)) if self.keep else [()] * chunk.num_rows
        bounds = chunk.offsets.tolist()
        return [
            Piece(chunk.ids[a:b], None if labels is None else labels[a:b], tuple(row))
            for a, b, row in zip(bounds, bounds[1:], rows)
        ]
