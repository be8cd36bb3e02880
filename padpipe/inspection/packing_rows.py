"""Where the documents of a packed batch lie (from ``seq_idx``, ``cu_seq_lens_q`` or ``position_ids``), and which
few :func:`padpipe.check_packing` runs alone."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from padpipe.loader import PipelineLoader


@dataclasses.dataclass(frozen=True)
class Document:
    """One document of a packed batch: ``input_ids[row, start:end]`` of batch number ``batch``."""

    batch: int
    row: int
    start: int
    end: int

    def __str__(self) -> str:
        return f"batch {self.batch}, row {self.row}, tokens {self.start}:{self.end}"


def read_batches(batches: Mapping[str, Any] | Iterable[Mapping[str, Any]], limit: int) -> list[dict]:
    """The first ``limit`` batches of ``batches`` (or the one batch it is), read so that training is not moved.

    A padpipe loader is read through :meth:`~padpipe.loader.PipelineLoader.copy` (its loop, state and
    stats stay as they were); another loader with ``state_dict``/``load_state_dict`` is restored after.

    Example:
        >>> loader = pp.from_iterable([{"text": "a b"}] * 4).tokenize(pp.examples.tokenizer()).pack(8).loader()
        >>> first = read_batches(loader, 1)[0]["input_ids"]
        >>> torch.equal(next(iter(loader))["input_ids"], first)
        True
    """
    if isinstance(batches, Mapping):
        return [dict(batches)]
    if isinstance(batches, PipelineLoader):
        return [dict(b) for b in itertools.islice(batches.copy(), limit)]
    resumable = callable(getattr(batches, "state_dict", None)) and callable(getattr(batches, "load_state_dict", None))
    saved = batches.state_dict() if resumable else None  # type: ignore[attr-defined]
    try:
        return [dict(b) for b in itertools.islice(batches, limit)]
    finally:
        if saved is not None:
            batches.load_state_dict(saved)  # type: ignore[attr-defined]


def find_documents(batch: Mapping[str, Any], number: int, *, pad_id: int | None = None) -> list[Document]:
    """The documents of ``batch`` (its padding runs left out), in row order.

    A row's last segment is padding when its ids are one value and all its labels -100 (or all ``pad_id``).

    Args:
        batch: A packed batch as the loader yields it.
        number: The batch's number, kept in each :class:`Document`.
        pad_id: The padding id, used only when the batch has no ``labels``.

    Example:
        >>> batch = {"input_ids": torch.tensor([[5, 6, 7, 8, 0, 0]]),
        ...          "position_ids": torch.tensor([[0, 1, 0, 1, 0, 1]]),
        ...          "labels": torch.tensor([[-100, 6, -100, 8, -100, -100]])}
        >>> [str(d) for d in find_documents(batch, 0)]
        ['batch 0, row 0, tokens 0:2', 'batch 0, row 0, tokens 2:4']
    """
    ids = batch.get("input_ids")
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2:
        found = "no input_ids" if ids is None else f"input_ids of shape {tuple(getattr(ids, 'shape', ()))}"
        raise ValueError(f"check_packing: batch {number} has {found}; expected input_ids of shape [rows, seq_len].")
    rows, length = ids.shape
    starts = _segment_starts(batch, number, rows, length)
    labels = batch.get("labels")
    out = []
    for row, row_starts in enumerate(starts):
        bounds = [*row_starts, length]
        for i, (a, b) in enumerate(zip(bounds, bounds[1:])):
            piece = ids[row, a:b]
            if i == len(bounds) - 2 and bool((piece == piece[0]).all()):
                if labels is not None and bool((labels[row, a:b] == -100).all()):
                    continue  # the padding run
                if labels is None and pad_id is not None and int(piece[0]) == pad_id:
                    continue
            out.append(Document(number, row, a, b))
    return out


def choose(documents: list[Document], limit: int) -> list[Document]:
    """At most ``limit`` documents, those after another in their row first (where a causal leak shows).

    Example:
        >>> docs = [Document(0, 0, 0, 4), Document(0, 0, 4, 6), Document(0, 1, 0, 5)]
        >>> [str(d) for d in choose(docs, 2)]
        ['batch 0, row 0, tokens 0:4', 'batch 0, row 0, tokens 4:6']
    """
    later = [d for d in documents if d.start > 0]
    first = [d for d in documents if d.start == 0]
    return sorted((later + first)[:limit], key=lambda d: (d.batch, d.row, d.start))


def _segment_starts(batch: Mapping[str, Any], number: int, rows: int, length: int) -> list[list[int]]:
    seq_idx, cu, positions = batch.get("seq_idx"), batch.get("cu_seq_lens_q"), batch.get("position_ids")
    change = torch.ones(rows, length, dtype=torch.bool)  # where a segment starts: seq_idx changes, positions restart
    if isinstance(seq_idx, torch.Tensor) and seq_idx.shape == (rows, length):
        change[:, 1:] = seq_idx[:, 1:].cpu() != seq_idx[:, :-1].cpu()
    elif isinstance(cu, torch.Tensor) and cu.dim() == 1 and int(cu[-1]) == rows * length:
        bounds = cu.tolist()[:-1]
        return [[b - r * length for b in bounds if r * length <= b < (r + 1) * length] for r in range(rows)]
    elif isinstance(positions, torch.Tensor) and positions.shape[-1] == length:
        positions = positions.cpu().expand(rows, length)
        change[:, 1:] = positions[:, 1:] != positions[:, :-1] + 1
    else:
        raise ValueError(
            f"check_packing: batch {number} has no seq_idx, cu_seq_lens_q or position_ids to find its documents in; "
            "expected a batch as pack() yields it (check the batches before anything drops keys from them)."
        )
    return [change[r].nonzero().flatten().tolist() for r in range(rows)]
