"""Sequence packing: documents into rows of exactly ``seq_len`` tokens, best fit decreasing over a bounded pool."""

from __future__ import annotations

import bisect
from typing import Any

import numpy as np
import torch
from torchdata.nodes import BaseNode

from padpipe.chunks import TokenChunk
from padpipe.errors import check_bool, check_int, one_of, positive
from padpipe.graph import EpochAware
from padpipe.pipes.flat import bins, check_layout, flat_width
from padpipe.pipes.packing import MASK_DTYPES, assemble, best_fit_decreasing
from padpipe.pipes.piece_state import Pieces
from padpipe.pipes.pieces import IGNORE, Piece, cut_pieces, pieces_to_chunk
from padpipe.state import Bool, Child, Int, ListOf, Loaded, StateSchema, invalid
from padpipe.stats import PipelineStats

LONG_DOCS = (None, "split", "truncate", "drop", "raise")
BATCH_KEYS = tuple(
    "input_ids position_ids labels seq_idx cu_seq_lens_q cu_seq_lens_k max_length_q max_length_k attention_mask "
    "use_cache".split()
)
"""The keys a packed batch holds of its own (a kept column may not take one of these names)."""


PLAN_SHARE = 8
"""A packing of the pool plans whole batches of its fullest rows holding at least this share of its pieces (1/8)."""

EAGER_ROWS = 2
"""An epoch's first batch is placed once the pool holds this many batches' worth of tokens (or is full)."""


def check_pack_options(
    *,
    seq_len: int,
    batch_size: int,
    buffer_size: int,
    long_docs: str | None,
    keep_tail: bool,
    position_offset: int,
    block_mask: bool,
    mask_dtype: torch.dtype | None,
    pad_id: int,
    label_pad_id: int,
    keep: tuple[str, ...] = (),
    vocab_size: int | None = None,
    layout: str = "rows",
) -> None:
    """Raise ``ValueError``/``TypeError`` for packing settings that cannot work.

    Example:
        >>> check_pack_options(seq_len=1, batch_size=1, buffer_size=8, long_docs="split", keep_tail=True,
        ...                    position_offset=0, block_mask=False, mask_dtype=None, pad_id=0, label_pad_id=-100)
        Traceback (most recent call last):
        ...
        ValueError: `seq_len` must be at least 2, but is 1 instead.
    """
    positive("seq_len", seq_len)
    if seq_len < 2:
        raise ValueError(f"`seq_len` must be at least 2, but is {seq_len} instead.")
    positive("batch_size", batch_size)
    positive("buffer_size", buffer_size)
    one_of("long_docs", long_docs, LONG_DOCS)
    check_bool("keep_tail", keep_tail)
    check_bool("block_mask", block_mask)
    check_layout(layout, block_mask=block_mask)
    if mask_dtype is not None:
        if not block_mask:
            raise ValueError(f"`mask_dtype` must be None without `block_mask=True`, but is {mask_dtype} instead.")
        one_of("mask_dtype", mask_dtype, MASK_DTYPES)
    if isinstance(position_offset, bool) or not isinstance(position_offset, int) or position_offset < 0:
        raise ValueError(f"`position_offset` must be a non-negative int, but is {position_offset!r} instead.")
    check_int("pad_id", pad_id)
    check_int("label_pad_id", label_pad_id)
    if vocab_size is not None:
        positive("vocab_size", vocab_size)
    if not isinstance(keep, tuple) or not all(isinstance(name, str) for name in keep):
        raise TypeError(f"`keep` must be a tuple of column names, but is {keep!r} instead.")
    if len(set(keep)) != len(keep) or set(keep) & set(BATCH_KEYS):
        raise ValueError(
            f"`keep` must name distinct columns other than the packed batch's own keys {BATCH_KEYS!r}, but is "
            f"{keep!r} instead."
        )


class Packer(EpochAware, BaseNode[dict]):
    """Pack a stream of documents (one :class:`TokenChunk` row each) into ``[B, seq_len]`` batches.

    Documents longer than ``seq_len`` are first cut into pieces (``long_docs``), which wait in a pool
    of ``buffer_size``. When a batch is due and no planned rows are left, the pool is packed *best
    fit decreasing* (each piece, longest first, ties to the oldest, into the row with the fewest
    slots left that holds it, else a new row) and its fullest rows are planned: whole batches
    holding at least ``1/PLAN_SHARE`` of the pooled pieces. The other rows' pieces go back to wait
    with the next pieces, so a piece that fits nowhere well now meets the pieces after it. Once the
    input is all pooled, every row is planned.

    A batch holds the keys ``transformers`` models read, named as ``DataCollatorWithFlattening(
    return_flash_attn_kwargs=True, return_seq_idx=True)`` names them, over each row's *segments* (its
    pieces, then its padding run): ``input_ids``, ``position_ids`` (from ``position_offset`` at every
    segment) and ``labels`` (each piece's token-level labels, else its ids; ``label_pad_id`` at its
    first token and at padding) ``[B, seq_len]`` int64; ``seq_idx`` int32; ``cu_seq_lens_q/k`` and
    ``max_length_q/k``; the 4-D ``attention_mask`` with ``block_mask``; ``use_cache=False``; each kept
    column as a list of ``B`` lists (each row's pieces' values). What each attention and model needs
    of them, and fill rates: docs/packing.md.

    Args:
        source: Upstream node yielding :class:`TokenChunk`.
        seq_len: Tokens per packed row (at least 2).
        batch_size: Packed rows per batch.
        buffer_size: Pieces held to choose fits from (more while they hold less than a batch's tokens).
            An epoch's first batch is planned once the pool holds two batches' worth of tokens.
        long_docs: A document longer than ``seq_len``: ``"split"`` (:func:`~padpipe.pipes.pieces.cut_pieces`;
            counted as ``pack.split_docs`` and ``pack.context_tokens``), ``"truncate"``
            (``pack.truncated_docs``), ``"drop"`` (skip ``pack.long_doc``) or ``"raise"`` a
            :class:`~padpipe.errors.DataError` naming it. ``None`` (the default): ``"raise"`` for
            rows with token-level labels, ``"split"`` for the others. Empty documents are skipped
            (``pack.empty_doc``).
        keep_tail: With ``"split"``, keep the last piece shorter than ``seq_len`` (else skipped as
            ``pack.long_doc_tail``).
        position_offset: First position id of every segment.
        block_mask: Also emit the 4-D ``attention_mask``.
        mask_dtype: The mask's dtype with ``block_mask=True``: ``torch.float32`` (the default), the
            model's own float dtype, or ``torch.bool`` (sdpa only); ``None`` without ``block_mask``.
        pad_id: Id at unfilled slots.
        label_pad_id: Label at document starts and padding.
        keep: Columns of the input (integers or strings, such as ``idx``) to carry into batches,
            as a list per row; a column missing from the input raises ``DataError``.
        vocab_size: Every id is below it, every label such an id, ``-100`` or ``label_pad_id``
            (``DataError`` naming the row otherwise; a state holding another is refused); ``None``:
            not known, ids and labels are checked ``>= 0`` only.
        layout: ``"rows"`` (``[batch_size, seq_len]``) or ``"flat"``: each batch one row of
            ``batch_size * seq_len`` tokens, of pieces of at most ``seq_len`` (:mod:`padpipe.pipes.flat`).
        stats: Counters to report into (``record_batch`` per batch, time under ``"pack"``).

    Example:
        >>> from padpipe.chunks import TokenChunk
        >>> from torchdata.nodes import IterableWrapper
        >>> src = IterableWrapper([TokenChunk.from_lists([[5, 6, 7], [8, 9]])])
        >>> batch = next(Packer(src, seq_len=6, pad_id=0))
        >>> batch["input_ids"].tolist(), batch["position_ids"].tolist(), batch["labels"].tolist()
        ([[5, 6, 7, 8, 9, 0]], [[0, 1, 2, 0, 1, 0]], [[-100, 6, 7, -100, 9, -100]])
        >>> batch["seq_idx"].tolist(), batch["cu_seq_lens_q"].tolist(), batch["max_length_q"]
        ([[0, 0, 0, 1, 1, 2]], [0, 3, 5, 6], 3)
    """

    STATE = StateSchema(
        "pack",
        6,
        source=Child(),
        epoch=Int(0),
        incoming=Pieces(),  # pieces pulled but not yet pooled (``keep`` columns: specs in reset)
        pool=Pieces(),  # in arrival order
        planned=Pieces(),  # pieces of the planned rows, in row order
        planned_rows=ListOf(Int(0)),  # the planned row of each (rising from 0)
        exhausted=Bool(),
        started=Bool(),  # a batch of this epoch came out (the first does not wait for a full pool)
    )

    _incoming: list[Piece]  # pieces pulled but not yet pooled (from ``_in_pos`` on)
    _keys: list[tuple[int, int]]  # pool, sorted by (length, -arrival seq)
    _store: dict[int, Piece]  # arrival seq -> piece, in arrival order

    def __init__(
        self,
        source: BaseNode,
        *,
        seq_len: int,
        batch_size: int = 1,
        buffer_size: int = 256,
        long_docs: str | None = None,
        keep_tail: bool = True,
        position_offset: int = 0,
        block_mask: bool = False,
        mask_dtype: torch.dtype | None = None,
        pad_id: int,
        label_pad_id: int = -100,
        keep: tuple[str, ...] = (),
        vocab_size: int | None = None,
        layout: str = "rows",
        stats: PipelineStats | None = None,
    ) -> None:
        super().__init__()
        check_pack_options(
            seq_len=seq_len,
            batch_size=batch_size,
            buffer_size=buffer_size,
            long_docs=long_docs,
            keep_tail=keep_tail,
            position_offset=position_offset,
            block_mask=block_mask,
            mask_dtype=mask_dtype,
            pad_id=pad_id,
            label_pad_id=label_pad_id,
            keep=keep,
            vocab_size=vocab_size,
            layout=layout,
        )
        self.source = source
        self.seq_len, self.batch_size = bins(seq_len, batch_size, layout)  # the rows it fills
        self.buffer_size, self.piece_len, self.layout = buffer_size, seq_len, layout  # pieces of at most seq_len
        self.long_docs, self.keep_tail = long_docs, keep_tail
        self.position_offset, self.block_mask = position_offset, block_mask
        self.mask_dtype = (mask_dtype or torch.float32) if block_mask else None
        self.pad_id, self.label_pad_id, self.keep = pad_id, label_pad_id, keep
        self.vocab_size, self._ignore = vocab_size, tuple(sorted({IGNORE, label_pad_id}))
        self.stats = stats or PipelineStats()
        self._epoch = -1
        self._clear()

    # -- BaseNode ---------------------------------------------------------------------------------
    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        super().reset(initial_state)
        self._clear()
        if initial_state is None:
            self._epoch += 1
            self.source.reset(None)
            return
        pieces = Pieces(self.keep, self.piece_len, self.vocab_size, self._ignore)  # every leaf (piece_state.py)
        specs = {"incoming": pieces, "pool": pieces, "planned": pieces}
        loaded = self.STATE.check(initial_state, self._settings(), specs=specs, check=self._check_loaded)
        self.source.reset(loaded.source)
        self._epoch = loaded.epoch
        self._incoming = loaded.incoming
        for piece in loaded.pool:  # in arrival order: ties resolve as before
            self._add_to_pool(piece)
        for piece, row in zip(loaded.planned, loaded.planned_rows):
            if row == len(self._planned):
                self._planned.append([])
            self._planned[row].append(piece)
        self._exhausted, self._started = loaded.exhausted, loaded.started

    def next(self) -> dict:
        if len(self._planned) < self.batch_size:
            while True:
                self._fill_pool()
                if self._exhausted or self._pool_ready():
                    break
                if self._incoming_left() == 0:
                    self._pull()  # upstream time is not the packer's own
            with self.stats.timer("pack"):
                self._plan()
        if not self._planned:  # the epoch's input all placed
            raise StopIteration
        with self.stats.timer("pack"):
            rows, self._planned = self._planned[: self.batch_size], self._planned[self.batch_size :]
            return self._emit(rows)

    def get_state(self) -> dict[str, Any]:
        return self.STATE.make(
            self._settings(),
            source=self.source.state_dict(),
            epoch=self._epoch,
            incoming=pieces_to_chunk(self._incoming[self._in_pos :], self.keep).to_state(),
            pool=pieces_to_chunk(list(self._store.values()), self.keep).to_state(),  # dict order = arrival
            planned=pieces_to_chunk([piece for row in self._planned for piece in row], self.keep).to_state(),
            planned_rows=[number for number, row in enumerate(self._planned) for _ in row],
            exhausted=self._exhausted,
            started=self._started,
        )

    # -- internals --------------------------------------------------------------------------------
    def _check_loaded(self, loaded: Loaded) -> None:
        """The pool fits ``buffer_size``, the planned pieces their rows and each row ``seq_len`` (the pieces
        themselves are their spec's to check: :class:`~padpipe.pipes.piece_state.Pieces`)."""
        stage = self.STATE.stage
        lengths = [len(p.ids) for p in loaded.pool]
        if len(lengths) > self.buffer_size and sum(lengths[:-1]) >= self.batch_size * self.seq_len:
            limit = f"at most buffer_size={self.buffer_size} pieces, or fewer than a batch's tokens before the last"
            raise invalid(stage, "pool", limit, f"{len(lengths)} pieces of {sum(lengths)} tokens")
        rows = loaded.planned_rows
        rising = not rows or (rows[0] == 0 and np.isin(np.diff(rows), (0, 1)).all())
        if len(rows) != len(loaded.planned) or not rising:
            raise invalid(stage, "planned_rows", "one row per planned piece, rising by 0 or 1 from 0", rows[:8])
        used = np.bincount(rows, weights=[len(p.ids) for p in loaded.planned]) if rows else np.zeros(0)
        if (used > self.seq_len).any():
            raise invalid(stage, "planned", f"rows of at most seq_len={self.seq_len} tokens", used.astype(int).tolist())

    def _settings(self) -> dict[str, Any]:
        names = ("seq_len", "batch_size", "buffer_size", "long_docs", "keep_tail", "keep")
        return {name: getattr(self, name) for name in names}

    def _clear(self) -> None:
        self._incoming, self._in_pos = [], 0
        self._keys, self._store, self._next_seq = [], {}, 0
        self._pooled = 0  # tokens in the pool
        self._planned: list[list[Piece]] = []  # rows taken from the pool, emitted batch_size at a time
        self._exhausted = self._started = False

    def _incoming_left(self) -> int:
        return len(self._incoming) - self._in_pos

    def _pull(self) -> None:
        try:
            chunk = next(self.source)
        except StopIteration:
            self._exhausted = True
            return
        if not isinstance(chunk, TokenChunk):
            raise TypeError(f"pack() needs tokenized rows (TokenChunk) as input, but got {type(chunk).__name__}.")
        with self.stats.timer("pack"):
            pieces, counts = cut_pieces(
                chunk,
                seq_len=self.piece_len,
                long_docs=self.long_docs,
                keep_tail=self.keep_tail,
                keep=self.keep,
                vocab_size=self.vocab_size,
                ignore=self._ignore,
            )
            self.stats.add("pack.split_docs", counts["split"])
            self.stats.add("pack.context_tokens", counts["context"])
            self.stats.add("pack.truncated_docs", counts["truncated"])
            self.stats.record_skip("pack.long_doc", counts["dropped"])
            self.stats.record_skip("pack.long_doc_tail", counts["tails_dropped"])
            self.stats.record_skip("pack.empty_doc", counts["empty"])
            self._incoming, self._in_pos = pieces, 0

    def _add_to_pool(self, piece: Piece) -> None:
        bisect.insort(self._keys, (len(piece.ids), -self._next_seq))
        self._store[self._next_seq] = piece
        self._next_seq += 1
        self._pooled += len(piece.ids)

    def _pool_ready(self) -> bool:
        """Whether the pool holds enough to choose fits from: ``buffer_size`` pieces and a batch's tokens, or, for
        an epoch's first batch, twice the batch's tokens (so the first batch comes without waiting for a full
        pool)."""
        eager = not self._started and self._pooled >= EAGER_ROWS * self.batch_size * self.seq_len
        return not self._room() or eager

    def _room(self) -> bool:
        """Whether the pool takes another piece: it holds fewer than ``buffer_size``, or less than a batch's tokens
        (so a small pool still fills its rows)."""
        return len(self._keys) < self.buffer_size or self._pooled < self.batch_size * self.seq_len

    def _fill_pool(self) -> None:
        """Pool the pulled pieces while there is room (:meth:`_room`)."""
        while self._room() and self._incoming_left():
            self._add_to_pool(self._incoming[self._in_pos])
            self._in_pos += 1

    def _plan(self) -> None:
        """Pack the pool best fit decreasing and move its fullest rows to the plan (class docstring): whole batches
        holding at least ``1 / PLAN_SHARE`` of the pooled pieces, or every row once the input is all pooled."""
        longest_first = ((length, -neg_seq) for length, neg_seq in reversed(self._keys))  # ties to the oldest
        rows, used = best_fit_decreasing(longest_first, self.seq_len)
        enough, taken = len(self._keys) // PLAN_SHARE, 0
        for row in sorted(range(len(rows)), key=lambda row: -used[row]):  # stable: ties in the order opened
            batches = len(self._planned) >= self.batch_size and len(self._planned) % self.batch_size == 0
            if not self._exhausted and batches and taken >= enough:
                break
            self._planned.append([self._take(seq) for seq in rows[row]])  # longest first, as placed
            taken += len(rows[row])

    def _take(self, seq: int) -> Piece:
        """Take the pooled piece of arrival number ``seq`` out of the pool."""
        piece = self._store.pop(seq)
        del self._keys[bisect.bisect_left(self._keys, (len(piece.ids), -seq))]
        self._pooled -= len(piece.ids)
        return piece

    def _emit(self, rows: list[list[Piece]]) -> dict:
        """Assemble planned rows as one batch."""
        placed = [piece for row in rows for piece in row]
        placed_rows = [number for number, row in enumerate(rows) for _ in row]
        real = sum(len(p.ids) for p in placed)
        last = self._exhausted and not self._planned  # the epoch's last batch: a flat row of only the rows it needs
        width = flat_width(real, self.piece_len) if self.layout == "flat" and last else self.seq_len
        out = assemble(
            placed,
            placed_rows,
            len(rows),
            seq_len=width,
            pad_id=self.pad_id,
            position_offset=self.position_offset,
            label_pad_id=self.label_pad_id,
            mask_dtype=self.mask_dtype,
            keep=self.keep,
        )
        self.stats.record_batch(rows=len(placed), real_tokens=real, padded_tokens=len(rows) * width)
        self._started = True
        return out
