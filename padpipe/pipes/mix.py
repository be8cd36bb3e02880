"""Weighted mixing of several pipelines, row by row: each output row's source is drawn by weight."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa
from torchdata.nodes import BaseNode

from padpipe.chunks import Chunk, Records, TokenChunk, records_to_state
from padpipe.errors import DataError, check_seed, one_of, positive
from padpipe.graph import EpochAware, start_at_epoch
from padpipe.readers.schema import untag_source
from padpipe.state import Bool, Int, Invalid, ListOf, Optional, Plain, Rng, Spec, StateSchema, invalid
from padpipe.stats import PipelineStats

_RNG_STREAM = 0x313C  # keeps this stage's random stream apart from other stages seeded alike
STOPS = ("all_exhausted", "first_exhausted", "cycle")
Item = pa.RecordBatch | TokenChunk


def check_weights(names: list[str], weights: Mapping[str, float]) -> dict[str, float]:
    """Weights for exactly ``names``, each a finite number > 0, as floats in ``names`` order.

    Example:
        >>> check_weights(["a"], {"a": -1})
        Traceback (most recent call last):
        ...
        ValueError: `weights['a']` must be a number greater than zero, but is -1 instead.
    """
    if not isinstance(weights, Mapping):
        raise TypeError(f"`weights` must be a dict of name -> weight, but is {type(weights).__name__} instead.")
    missing, extra = [n for n in names if n not in weights], sorted(set(weights) - set(names), key=str)
    if missing or extra:
        raise ValueError(
            f"`weights` must have exactly the keys {names!r}, but misses {missing!r} and has extra {extra!r} instead."
        )
    for name in names:
        w = weights[name]
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not np.isfinite(w) or w <= 0:
            raise ValueError(f"`weights[{name!r}]` must be a number greater than zero, but is {w!r} instead.")
    return {name: float(weights[name]) for name in names}


class Buffered(Spec):
    """A source's buffered rows in a mixer state: ``{"tokens": chunk}`` or ``{"records": batch}``."""

    def load(self, value: Any) -> Item:
        if not isinstance(value, Mapping) or len(value) != 1 or next(iter(value)) not in ("tokens", "records"):
            raise Invalid("a dict {'tokens': chunk} or {'records': record batch}")
        kind, data = next(iter(value.items()))
        return Chunk().load(data) if kind == "tokens" else Records().load(data)


class WeightedMixer(EpochAware, BaseNode[Item]):
    """Interleave several sources row by row; each row's source is drawn with probability ~ weight.

    Each output item has ``chunk_rows`` rows (the epoch's last may have fewer), drawn i.i.d. by
    weight with a generator seeded by ``(seed, epoch)``, whatever the sources' chunk sizes. All
    sources yield the same kind with the same columns (record batches or token chunks). When a
    source runs out: ``"all_exhausted"``, it leaves the draw (every row of every source once);
    ``"first_exhausted"``, the epoch ends; ``"cycle"``, it restarts at its next epoch (restart ``c``
    of epoch ``e`` reads its epoch ``e + c``) until every source has run out once. Epoch ``e``
    starts every source at its epoch ``e``. The buffered rows, the generator and the flags are in
    the state: resume is exact.

    Args:
        sources: Name -> upstream node, in draw order.
        weights: Name -> weight (> 0; normalized).
        seed: Non-negative seed of the draws; the epoch is mixed in.
        stop: ``"all_exhausted"``, ``"first_exhausted"`` or ``"cycle"``.
        chunk_rows: Rows per output item.
        stats: Counters to report into (time under ``"mix"``).

    Example:
        >>> from torchdata.nodes import IterableWrapper
        >>> a = IterableWrapper([pa.record_batch({"i": [0, 1, 2]})])
        >>> b = IterableWrapper([pa.record_batch({"i": [10, 11]})])
        >>> node = WeightedMixer({"a": a, "b": b}, weights={"a": 1, "b": 1}, chunk_rows=5)
        >>> sorted(next(node).column("i").to_pylist())
        [0, 1, 2, 10, 11]
    """

    STATE = StateSchema(
        "WeightedMixer",
        2,
        source=Plain(),  # {name: that pipeline's state}, checked in reset
        epoch=Int(0),
        rng=Rng(),
        buffers=ListOf(Optional(Buffered())),  # this and the lists below: one per source, in `names` order
        stopped=Bool(),
        active=ListOf(Bool()),
        seen=ListOf(Bool()),
        cycles=ListOf(Int(0)),
        pass_rows=ListOf(Int(0)),
    )

    def __init__(
        self,
        sources: Mapping[str, BaseNode[Item]],
        *,
        weights: Mapping[str, float],
        seed: int = 0,
        stop: str = "all_exhausted",
        chunk_rows: int = 1024,
        stats: PipelineStats | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(sources, Mapping) or not sources:
            raise ValueError("`sources` must be a non-empty dict of name -> node.")
        self.names = list(sources)
        self.weights = check_weights(self.names, weights)
        check_seed(seed)
        one_of("stop", stop, STOPS)
        positive("chunk_rows", chunk_rows)
        self.source_nodes = dict(sources)
        self.seed, self.stop, self.chunk_rows = seed, stop, chunk_rows
        self.stats = stats or PipelineStats()
        self._p = np.array([self.weights[n] for n in self.names])
        self._epoch = -1
        self._signature: tuple[str, Any] | None = None
        self._columns: list[str] | None = None

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        super().reset(initial_state)
        n = len(self.names)
        if initial_state is None:
            self._epoch += 1
            for node in self.source_nodes.values():
                start_at_epoch(node, self._epoch)
                node.reset(None)
            self._rng = np.random.default_rng([self.seed, self._epoch, _RNG_STREAM])
            self._buffers: list[list[Item]] = [[] for _ in range(n)]
            self._active, self._seen = [True] * n, [False] * n
            self._cycles, self._pass_rows, self._stopped = [0] * n, [0] * n, False
            return
        flags, counts = ListOf(Bool(), length=n), ListOf(Int(0), length=n)
        buffers = ListOf(Optional(Buffered()), length=n)
        specs = {"buffers": buffers, "active": flags, "seen": flags, "cycles": counts, "pass_rows": counts}
        loaded = self.STATE.check(initial_state, self._settings(), specs=specs)
        sources = loaded.source
        if not isinstance(sources, Mapping) or sorted(sources) != sorted(self.names):
            found = sorted(sources) if isinstance(sources, Mapping) else type(sources).__name__
            raise invalid(self.STATE.stage, "source", f"a dict of the states of {self.names!r}", found)
        for name, node in self.source_nodes.items():
            node.reset(sources[name])
        self._epoch, self._rng = loaded.epoch, loaded.rng
        self._buffers = [[] if b is None else [b] for b in loaded.buffers]
        self._active, self._seen = loaded.active, loaded.seen
        self._cycles, self._pass_rows = loaded.cycles, loaded.pass_rows
        self._stopped = loaded.stopped

    def next(self) -> Item:
        if self._stopped:
            raise StopIteration
        keys = self._draw_chunk()  # reads the sources: their time is their own
        if not len(keys):
            raise StopIteration
        with self.stats.timer("mix"):
            order = np.argsort(keys, kind="stable")  # output positions grouped by source
            counts = np.bincount(keys, minlength=len(self.names))
            parts = [self._take(k, int(c)) for k, c in enumerate(counts) if c]
            inverse = np.empty(len(keys), np.int64)
            inverse[order] = np.arange(len(keys))
            out = _take_rows(_concat(parts), inverse)
            return untag_source(out) if isinstance(out, pa.RecordBatch) else out  # rows of several sources

    def get_state(self) -> dict[str, Any]:
        return self.STATE.make(
            self._settings(),
            source={name: node.state_dict() for name, node in self.source_nodes.items()},
            epoch=self._epoch,
            rng=self._rng.bit_generator.state,
            buffers=[_to_state(_concat(b)) if b else None for b in self._buffers],
            active=list(self._active),
            seen=list(self._seen),
            cycles=list(self._cycles),
            pass_rows=list(self._pass_rows),
            stopped=self._stopped,
        )

    # -- drawing ------------------------------------------------------------------------------------
    def _settings(self) -> dict[str, Any]:
        return {"weights": dict(self.weights), "seed": self.seed, "stop": self.stop, "chunk_rows": self.chunk_rows}

    def _draw(self, size: int) -> np.ndarray:
        active = np.flatnonzero(self._active)
        p = self._p[active] / self._p[active].sum()
        return active[self._rng.choice(len(active), size=size, p=p)]

    def _draw_chunk(self) -> np.ndarray:
        """Source index of each output row; stops the epoch where the stop criterion says."""
        done = np.zeros(0, np.int64)  # rows already settled (their source rows are buffered)
        keys = self._draw(self.chunk_rows)
        while True:
            reserved = np.bincount(done, minlength=len(self.names))
            short_at, short = len(keys), -1  # the first position a source cannot fill
            for k in np.unique(keys):
                positions = np.flatnonzero(keys == k)
                have = self._fill(int(k), int(reserved[k]) + len(positions)) - int(reserved[k])
                if have < len(positions) and positions[have] < short_at:
                    short_at, short = int(positions[have]), int(k)
            if short < 0:
                return np.concatenate([done, keys])
            self._seen[short] = True
            if self.stop == "cycle" and not all(self._seen) and self._pass_rows[short]:
                self._restart(short)
                continue
            done = np.concatenate([done, keys[:short_at]])
            self._active[short] = False
            if self.stop == "first_exhausted" or (self.stop == "cycle" and all(self._seen)) or not any(self._active):
                self._stopped = True
                return done
            keys = self._draw(len(keys) - short_at)

    def _fill(self, k: int, rows: int) -> int:
        """Read source ``k`` until ``rows`` rows are buffered or it runs out; the rows buffered."""
        have = sum(item.num_rows for item in self._buffers[k])
        while have < rows:
            try:
                item = next(self.source_nodes[self.names[k]])
            except StopIteration:
                break
            item = self._check(k, item)
            if item.num_rows:
                self._buffers[k].append(item)
                have += item.num_rows
                self._pass_rows[k] += item.num_rows
        return have

    def _restart(self, k: int) -> None:
        self._cycles[k] += 1
        node = self.source_nodes[self.names[k]]
        start_at_epoch(node, self._epoch + self._cycles[k])
        node.reset(None)
        self._pass_rows[k] = 0
        self.stats.add(f"mix.{self.names[k]}.restarts", 1)

    def _take(self, k: int, rows: int) -> Item:
        """The first ``rows`` buffered rows of source ``k``; the rest stay buffered."""
        buffered = _concat(self._buffers[k])
        rest = buffered.num_rows - rows
        self._buffers[k] = [_take_rows(buffered, np.arange(rows, buffered.num_rows))] if rest else []
        return _take_rows(buffered, np.arange(rows)) if rest else buffered

    def _check(self, k: int, item: Any) -> Item:
        """Every item is the same kind, with the same columns, as the first one of this epoch."""
        if isinstance(item, pa.RecordBatch):
            signature: Any = ("records", tuple(sorted(item.schema.names)))
        elif isinstance(item, TokenChunk):
            signature = ("tokens", tuple(sorted(item.columns)), item.type_ids is not None)
        else:
            raise TypeError(
                f"mix: pipeline {self.names[k]!r} yields {type(item).__name__}; "
                f"expected pyarrow.RecordBatch or TokenChunk items."
            )
        if self._signature is None:
            self._signature = (self.names[k], signature)
            self._columns = list(item.schema.names) if isinstance(item, pa.RecordBatch) else None
        elif signature != self._signature[1]:
            first, expected = self._signature
            raise DataError(
                f"mix: pipeline {self.names[k]!r} yields {signature!r}; expected {expected!r} "
                f"as pipeline {first!r} does (select the same columns in every reader)."
            )
        if isinstance(item, pa.RecordBatch) and item.schema.names != self._columns:
            return item.select(self._columns)  # the first item's column order, so batches concatenate
        return item


def _concat(items: list[Item]) -> Item:
    if len(items) == 1:
        return items[0]
    if isinstance(items[0], TokenChunk):
        return TokenChunk.concat(items)
    try:
        table = pa.concat_tables([pa.Table.from_batches([b]) for b in items], promote_options="permissive")
    except pa.ArrowException as exc:
        raise DataError(f"mix: the pipelines' record batches cannot be combined: {exc}") from exc
    return table.combine_chunks().to_batches()[0] if table.num_rows else items[0].slice(0, 0)


def _take_rows(item: Item, rows: np.ndarray) -> Item:
    if isinstance(item, TokenChunk):
        return item.take(rows)
    return item.take(pa.array(rows, type=pa.int64()))


def _to_state(item: Item) -> dict[str, Any]:
    if isinstance(item, TokenChunk):
        return {"tokens": item.to_state()}
    return {"records": records_to_state(item)}
