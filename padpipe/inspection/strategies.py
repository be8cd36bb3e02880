"""Run every batching strategy on token lengths alone, through padpipe's own stages.

Chunks of the given row lengths go through the real ``FixedBatcher``, ``Bucketizer`` and ``Packer`` nodes and
are padded by :func:`~padpipe.pipes.pad.padded_length`, so the figures are those of a real pass.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
from torchdata.nodes import BaseNode, IterableWrapper

from padpipe.chunks import ID_DTYPE, TokenChunk
from padpipe.pipes.batch import FixedBatcher
from padpipe.pipes.bucket import Bucketizer
from padpipe.pipes.cut import longest_row_allowed
from padpipe.pipes.pack import Packer
from padpipe.pipes.pad import padded_length
from padpipe.stats import PipelineStats


@dataclass(frozen=True)
class StrategyResult:
    """One strategy's batches over the rows inspected.

    Attributes:
        name: Short name, e.g. ``"bucket(max_tokens=4096)"``.
        code: The pipeline stages that do it, e.g. ``".bucket(max_tokens=4096).pad(pad_to_multiple_of=8)"``.
        batches: Batches (steps) over the rows inspected.
        rows: Rows in those batches (``pack``: document pieces).
        real_tokens: Non-padding tokens.
        padded_tokens: Token slots, padding included.
        attention: Attention work: sum over batches of rows x padded length squared (``pack``: over
            each whole packed row).
        varlen_attention: For ``pack``, a varlen kernel's work (sum of squared segment lengths).
        whole: The rows are the documents untruncated, longer ones split across packed rows.
    """

    name: str
    code: str
    batches: int
    rows: int
    real_tokens: int
    padded_tokens: int
    attention: float
    varlen_attention: float | None = None
    whole: bool = False

    @property
    def efficiency(self) -> float:
        """Real tokens over token slots."""
        return self.real_tokens / self.padded_tokens if self.padded_tokens else 0.0


class LengthChunks:
    """Re-iterable chunks of rows with the given lengths (ids all 0), made one at a time.

    Example:
        >>> [c.lengths.tolist() for c in LengthChunks([np.array([2, 1]), np.array([3])])]
        [[2, 1], [3]]
    """

    def __init__(self, stream: Sequence[np.ndarray]) -> None:
        self.stream = stream

    def __iter__(self) -> Iterator[TokenChunk]:
        for lengths in self.stream:
            offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
            np.cumsum(lengths, out=offsets[1:])
            yield TokenChunk(np.zeros(int(offsets[-1]), dtype=ID_DTYPE), offsets)


def padded(
    name: str, code: str, node: BaseNode[TokenChunk], *, pad_to_multiple_of: int | None, pad_to_length: int | None
) -> StrategyResult:
    """Run a batching node and pad each batch as ``pad(pad_to_multiple_of=..., pad_to_length=...)`` would."""
    batches = rows = real = slots = 0
    attention = 0.0
    pad = {"pad_to_multiple_of": pad_to_multiple_of, "pad_to_length": pad_to_length}
    for chunk in node:
        lengths = chunk.lengths
        width = int(padded_length(np.array([lengths.max()]), **pad)[0])
        batches, rows = batches + 1, rows + len(lengths)
        real, slots = real + int(lengths.sum()), slots + len(lengths) * width
        attention += len(lengths) * float(width) ** 2
    return StrategyResult(name, code, batches, rows, real, slots, attention)


def static(stream: Sequence[np.ndarray], *, batch_size: int, length: int) -> StrategyResult:
    """Batches of ``batch_size`` in arrival order, every row padded to ``length``."""
    node = FixedBatcher(IterableWrapper(LengthChunks(stream)), batch_size=batch_size)
    code = f".batch({batch_size}).pad(pad_to_length={length})"
    return padded(f"static: pad to {length}", code, node, pad_to_multiple_of=None, pad_to_length=length)


def dynamic(
    stream: Sequence[np.ndarray], *, batch_size: int, pad_to_multiple_of: int | None, shuffled: bool = True
) -> StrategyResult:
    """Batches of ``batch_size`` in arrival order (random when ``shuffled``), each padded to its longest row."""
    node = FixedBatcher(IterableWrapper(LengthChunks(stream)), batch_size=batch_size)
    code = f".batch({batch_size}).pad({_pad_args(pad_to_multiple_of)})"
    name = f"dynamic: random batches of {batch_size}" if shuffled else f"dynamic: batches of {batch_size} in order"
    return padded(name, code, node, pad_to_multiple_of=pad_to_multiple_of, pad_to_length=None)


def bucket(
    stream: Sequence[np.ndarray],
    *,
    batch_size: int | None = None,
    max_tokens: int | None = None,
    buffer_size: int,
    seed: int,
    pad_to_multiple_of: int | None,
) -> tuple[StrategyResult, int]:
    """``bucket(batch_size | max_tokens)`` then ``pad``; also the rows cut to fit ``max_tokens``.

    Rows longer than the budget allows are truncated (``on_oversize="truncate"``, then part of the
    strategy's ``code``); a pipeline with the default ``on_oversize="raise"`` would stop at the first one.
    """
    oversize = ""
    if max_tokens is not None:
        limit = longest_row_allowed(max_tokens, pad_to_multiple_of, None)
        if any(int(part.max(initial=0)) > limit for part in stream):
            oversize = ", on_oversize='truncate'"
    stats = PipelineStats()
    sizes = dict(batch_size=batch_size, max_tokens=max_tokens, buffer_size=buffer_size, seed=seed, stats=stats)
    chunks = IterableWrapper(LengthChunks(stream))
    node = Bucketizer(chunks, on_oversize="truncate", pad_to_multiple_of=pad_to_multiple_of, **sizes)
    size = f"batch_size={batch_size}" if max_tokens is None else f"max_tokens={max_tokens}"
    code = f".bucket({size}, buffer_size={buffer_size}{oversize}).pad({_pad_args(pad_to_multiple_of)})"
    result = padded(f"bucket({size})", code, node, pad_to_multiple_of=pad_to_multiple_of, pad_to_length=None)
    return result, stats.snapshot().counters.get("bucket.truncated", 0)


def pack(
    stream: Sequence[np.ndarray], *, seq_len: int, batch_size: int, buffer_size: int, whole: bool = False
) -> StrategyResult:
    """``pack(seq_len, batch_size, buffer_size)``: rows of exactly ``seq_len`` tokens, best fit decreasing over a pool.

    ``whole``: ``stream`` holds the documents untruncated, and the result says so (``long_docs='split'``).
    """
    stats = PipelineStats()
    sizes = dict(seq_len=seq_len, batch_size=batch_size, buffer_size=buffer_size)
    node = Packer(IterableWrapper(LengthChunks(stream)), pad_id=0, stats=stats, **sizes)
    attention = varlen = 0.0
    for batch in node:
        attention += batch["input_ids"].shape[0] * float(seq_len) ** 2
        segments = np.diff(batch["cu_seq_lens_q"].numpy()).astype(np.float64)
        varlen += float((segments**2).sum())
    s, split = stats.snapshot(), ", long_docs='split'" if whole else ""
    name = f"pack(seq_len={seq_len}){' split' if whole else ''}"
    code = f".pack({seq_len}, batch_size={batch_size}, buffer_size={buffer_size}{split})"
    return StrategyResult(name, code, s.batches, s.rows, s.real_tokens, s.padded_tokens, attention, varlen, whole)


def _pad_args(pad_to_multiple_of: int | None) -> str:
    return "" if pad_to_multiple_of is None else f"pad_to_multiple_of={pad_to_multiple_of}"
