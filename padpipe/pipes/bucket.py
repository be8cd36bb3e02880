"""Length bucketing: sort a bounded buffer of rows by length and cut it into batches."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torchdata.nodes import BaseNode

from padpipe.buffers import BufferedChunk, References, chunk_state, drop_ref
from padpipe.chunks import TokenChunk
from padpipe.errors import check_bool, check_seed, one_of, positive
from padpipe.graph import EpochAware
from padpipe.pipes.cut import cut_by_budget, handle_oversize, longest_row_allowed
from padpipe.pipes.pad import padded_length
from padpipe.state import Array, Bool, Child, Int, Loaded, Optional, Rng, StateSchema, invalid, load_value
from padpipe.stats import PipelineStats

_RNG_STREAM = 0xB0C7  # keeps this stage's random stream apart from other stages seeded alike
SPREAD = 0.98
"""An eager batch is final when every row of it pads to at least this share of its longest row."""


def check_bucket_options(
    *,
    batch_size: int | None,
    max_tokens: int | None,
    buffer_size: int,
    drop_last: bool,
    shuffle: bool,
    seed: int | None,
    on_oversize: str,
    eager: bool = True,
) -> None:
    """Raise ``ValueError``/``TypeError`` for bucket settings that cannot work (``seed=None`` is ok).

    Example:
        >>> check_bucket_options(batch_size=None, max_tokens=None, buffer_size=8, drop_last=False,
        ...                      shuffle=True, seed=0, on_oversize="raise", eager=True)
        Traceback (most recent call last):
        ...
        ValueError: Pass exactly one of `batch_size` or `max_tokens` to bucket().
    """
    if (batch_size is None) == (max_tokens is None):
        raise ValueError("Pass exactly one of `batch_size` or `max_tokens` to bucket().")
    positive("batch_size", batch_size, allow_none=True)
    positive("max_tokens", max_tokens, allow_none=True)
    positive("buffer_size", buffer_size)
    for name, flag in (("drop_last", drop_last), ("shuffle", shuffle), ("eager", eager)):
        check_bool(name, flag)
    if drop_last and max_tokens is not None:
        raise ValueError("`drop_last` needs `batch_size`: with `max_tokens` no batch is short of a full size.")
    if seed is not None:
        check_seed(seed)
    one_of("on_oversize", on_oversize, ("raise", "drop", "truncate"))


class Bucketizer(EpochAware, BaseNode[TokenChunk]):
    """Group rows of similar length into batches, from a buffer of about ``buffer_size`` rows.

    Each buffer is sorted by length (stable) and cut into batches of ``batch_size`` rows or, greedily,
    under ``max_tokens`` padded tokens (``rows x`` the longest row padded as ``pad`` will pad it;
    never exceeded). With ``shuffle`` each buffer's batches come out in an order seeded by ``(seed,
    epoch)``, else by ascending length. With ``batch_size``, rows short of a full batch (random ones
    with ``shuffle``, else the longest) wait for the next buffer; the epoch's remainder is its last,
    smaller batch unless ``drop_last`` (counted as ``bucket.drop_last``).

    With ``eager`` (and ``shuffle``), while the epoch's first buffer fills each chunk is sorted in with
    the waiting rows and every batch a bigger buffer could not improve leaves at once: a full one
    whose rows all pad to at least :data:`SPREAD` of its longest. So the first batch comes within a
    few chunks, with no more padding.

    With ``max_tokens``, a row longer than the budget allows (``pad_to_length``, if set, is the
    longest allowed) is handled by ``on_oversize``: ``"raise"`` a ``ValueError``, ``"drop"`` it
    (``bucket.oversize``) or ``"truncate"`` it, token-level labels alike (``bucket.truncated``).
    The waiting rows, the cut batches not yet emitted and the generator are in the state: resume is
    exact.

    Args:
        source: Upstream node yielding :class:`~padpipe.chunks.TokenChunk`.
        batch_size: Rows per batch (exactly one of ``batch_size`` and ``max_tokens``).
        max_tokens: Budget on padded tokens per batch.
        buffer_size: Rows sorted together.
        drop_last: Drop the epoch's last batch when smaller than ``batch_size`` (``batch_size`` only).
        shuffle: Shuffle the batch order within each buffer.
        seed: Non-negative seed; the epoch is mixed in.
        on_oversize: ``"raise"``, ``"drop"`` or ``"truncate"``.
        eager: Emit final batches before the buffer is full (see above; ignored without ``shuffle``).
        pad_to_multiple_of: The padding rule the downstream ``pad`` stage applies.
        pad_to_length: Static padding length of the downstream ``pad`` stage.
        stats: Counters to report into (time under ``"bucket"``).
        references: The token cache's, where its rows come with references: buffered rows are saved as those.

    Example:
        >>> from torchdata.nodes import IterableWrapper
        >>> rows = TokenChunk.from_lists([[1] * n for n in (5, 1, 4, 2, 3, 1)])
        >>> node = Bucketizer(IterableWrapper([rows]), max_tokens=6, shuffle=False)
        >>> [b.lengths.tolist() for b in node]
        [[1, 1, 2], [3], [4], [5]]
    """

    STATE = StateSchema(
        "Bucketizer",
        3,
        source=Child(),
        epoch=Int(0),
        rng=Rng(),
        exhausted=Bool(),
        seen=Int(0),
        carry=Optional(BufferedChunk()),  # rows in a token cache: references, re-read
        ready=Optional(BufferedChunk()),  # both cut to the longest row allowed when truncating (specs in reset)
        sizes=Array(torch.int64, lo=1),
        batch=Int(0),
        pos=Int(0),
    )

    def __init__(
        self,
        source: BaseNode[TokenChunk],
        *,
        batch_size: int | None = None,
        max_tokens: int | None = None,
        buffer_size: int = 10_000,
        drop_last: bool = False,
        shuffle: bool = True,
        seed: int = 0,
        on_oversize: str = "raise",
        eager: bool = True,
        pad_to_multiple_of: int | None = None,
        pad_to_length: int | None = None,
        stats: PipelineStats | None = None,
        references: References | None = None,
    ) -> None:
        super().__init__()
        check_bucket_options(
            batch_size=batch_size,
            max_tokens=max_tokens,
            buffer_size=buffer_size,
            drop_last=drop_last,
            shuffle=shuffle,
            seed=seed,
            on_oversize=on_oversize,
            eager=eager,
        )
        positive("pad_to_multiple_of", pad_to_multiple_of, allow_none=True)
        positive("pad_to_length", pad_to_length, allow_none=True)
        self.source = source
        self.batch_size, self.max_tokens, self.buffer_size = batch_size, max_tokens, buffer_size
        self.drop_last, self.shuffle, self.seed, self.on_oversize = drop_last, shuffle, seed, on_oversize
        self.eager = eager and shuffle
        self.pad_to_multiple_of, self.pad_to_length = pad_to_multiple_of, pad_to_length
        self.stats = stats or PipelineStats()
        self.references = references
        self._limit = None if max_tokens is None else longest_row_allowed(max_tokens, pad_to_multiple_of, pad_to_length)
        self._fill_rows = max(buffer_size, batch_size or 1)
        self._epoch = -1

    # -- BaseNode -----------------------------------------------------------------------------------
    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        super().reset(initial_state)
        self._carry_state: dict[str, Any] | None = None
        self._ready_state: dict[str, Any] | None = None
        if initial_state is None:
            self.source.reset(None)
            self._epoch += 1
            self._rng = np.random.default_rng([self.seed, self._epoch, _RNG_STREAM])
            self._exhausted, self._carry, self._seen = False, None, 0
            self._set_ready(None, np.zeros(0, np.int64))
            return
        cut = self._limit if self.on_oversize == "truncate" else None  # rows re-read from a token cache
        buffer = Optional(BufferedChunk(cut, self.references))
        specs = {"carry": buffer, "ready": buffer}

        def check(loaded: Loaded) -> None:  # the ready rows are cut into `sizes`; `batch` of them were emitted
            ready, sizes, batch = loaded.ready, loaded.sizes, loaded.batch
            rows = 0 if ready is None else ready.num_rows
            if rows != int(sizes.sum()) or (ready is None) != (len(sizes) == 0):
                expected = f"batch sizes adding up to the {rows} ready rows"
                raise invalid(self.STATE.stage, "sizes", expected, sizes.tolist())
            load_value(self.STATE.stage, "batch", batch, Int(0, max(len(sizes) - 1, 0)))
            emitted = int(sizes[:batch].sum())
            load_value(self.STATE.stage, "pos", loaded.pos, Int(emitted, emitted))

        loaded = self.STATE.check(initial_state, self._settings(), specs=specs, check=check)
        self.source.reset(loaded.source)
        self._epoch, self._rng = loaded.epoch, loaded.rng
        self._exhausted, self._carry = loaded.exhausted, loaded.carry
        self._seen = loaded.seen
        self._set_ready(loaded.ready, loaded.sizes)
        self._batch, self._pos = loaded.batch, loaded.pos
        self._carry_state, self._ready_state = initial_state["carry"], initial_state["ready"]

    def next(self) -> TokenChunk:
        while self._ready is None:
            if self._exhausted:
                raise StopIteration
            self._fill()
        with self.stats.timer("bucket"):
            size, start = int(self._sizes[self._batch]), self._pos
            out = drop_ref(self._ready.take(np.arange(start, start + size)))
            self._batch, self._pos = self._batch + 1, start + size
            if self._batch == len(self._sizes):
                self._set_ready(None, np.zeros(0, np.int64))
            return out

    def get_state(self) -> dict[str, Any]:
        # buffers are serialised once after each cut and shared by every later state
        if self._carry is not None and self._carry_state is None:
            self._carry_state = chunk_state(self._carry, self.references)
        if self._ready is not None and self._ready_state is None:
            self._ready_state = chunk_state(self._ready, self.references)
        return self.STATE.make(
            self._settings(),
            source=self.source.state_dict(),
            epoch=self._epoch,
            rng=self._rng.bit_generator.state,
            exhausted=self._exhausted,
            seen=self._seen,
            carry=self._carry_state,
            ready=self._ready_state,
            sizes=self._sizes,
            batch=self._batch,
            pos=self._pos,
        )

    # -- buffer -------------------------------------------------------------------------------------
    def _settings(self) -> dict[str, Any]:
        names = ("batch_size", "max_tokens", "buffer_size", "drop_last", "shuffle", "seed", "on_oversize", "eager")
        return {name: getattr(self, name) for name in names + ("pad_to_multiple_of", "pad_to_length")}

    def _set_ready(self, chunk: TokenChunk | None, sizes: np.ndarray) -> None:
        self._ready, self._sizes, self._batch, self._pos = chunk, np.asarray(sizes, np.int64), 0, 0
        self._ready_state = None

    def _fill(self) -> None:
        """Read up to a buffer of rows after the waiting ones, then cut it into ready batches."""
        parts = [] if self._carry is None else [self._carry]
        rows = sum(p.num_rows for p in parts)
        while rows < self._fill_rows:
            try:
                chunk = next(self.source)
            except StopIteration:
                self._exhausted = True
                break
            if self._limit is not None:
                with self.stats.timer("bucket"):
                    chunk = handle_oversize(chunk, self._limit, self.max_tokens, self.on_oversize, self.stats)
            if chunk.num_rows:
                parts.append(chunk)
                rows += chunk.num_rows
                self._seen += chunk.num_rows
                if self.eager and self._seen < self._fill_rows:  # the epoch's first buffer is still filling
                    with self.stats.timer("bucket"):
                        parts = [TokenChunk.concat(parts)]
                        if self._emit_final(parts[0]):
                            return
        self._carry, self._carry_state = None, None
        if rows:
            with self.stats.timer("bucket"):
                self._cut(TokenChunk.concat(parts))

    def _cut(self, buffer: TokenChunk) -> None:
        """Sort ``buffer`` by length, cut it into batches, order them; keep the rest waiting."""
        n = buffer.num_rows
        order, _, sizes = self._sorted(buffer)
        left = np.zeros(0, np.int64)
        if self.batch_size is not None and n % self.batch_size:
            waiting = np.zeros(n, dtype=bool)
            spare = n % self.batch_size  # rows short of a full batch wait: random ones with shuffle, else the longest
            waiting[self._rng.choice(n, size=spare, replace=False) if self.shuffle else order[n - spare :]] = True
            left, order = order[waiting[order]], order[~waiting[order]]
        if self.shuffle and len(sizes) > 1:
            perm = self._rng.permutation(len(sizes))
            starts = np.cumsum(sizes) - sizes
            sizes = sizes[perm]
            # row k of the reordered batches reads sorted row (its batch's old start + k - new start)
            shift = np.repeat(starts[perm] - (np.cumsum(sizes) - sizes), sizes)
            order = order[np.arange(len(order)) + shift]
        if len(left) and self._exhausted:
            if self.drop_last:
                self.stats.record_skip("bucket.drop_last", len(left))
            else:
                order, sizes = np.concatenate([order, left]), np.append(sizes, len(left))
        elif len(left):
            self._carry = buffer.take(left)
        if len(sizes):
            self._set_ready(buffer.take(order), sizes)

    def _sorted(self, buffer: TokenChunk) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``buffer``'s rows by length (stable), their padded lengths, and the sizes of the full batches they make."""
        order = np.argsort(buffer.lengths, kind="stable")
        padded = padded_length(
            buffer.lengths[order], pad_to_multiple_of=self.pad_to_multiple_of, pad_to_length=self.pad_to_length
        )
        if self.batch_size is not None:
            return order, padded, np.full(len(order) // self.batch_size, self.batch_size, dtype=np.int64)
        return order, padded, cut_by_budget(padded, self.max_tokens)  # type: ignore[arg-type]

    def _emit_final(self, buffer: TokenChunk) -> bool:
        """Make the batches of ``buffer`` that a bigger buffer could not improve ready; the rest waits."""
        order, padded, sizes = self._sorted(buffer)
        ends = np.cumsum(sizes)
        starts = ends - sizes
        final = padded[starts] >= SPREAD * padded[ends - 1] if len(sizes) else np.zeros(0, bool)
        if self.max_tokens is not None:
            final &= (sizes + 1) * padded[ends - 1] > self.max_tokens
        if not final.any():
            return False
        picked = np.flatnonzero(final)
        picked = picked[self._rng.permutation(len(picked))]
        taken = np.concatenate([np.arange(starts[i], ends[i]) for i in picked])
        waiting = np.ones(len(order), bool)
        waiting[taken] = False
        self._carry, self._carry_state = (buffer.take(order[waiting]) if waiting.any() else None), None
        self._set_ready(buffer.take(order[taken]), sizes[picked])
        return True
