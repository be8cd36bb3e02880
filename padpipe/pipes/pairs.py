"""Preference pairs as batches: padded in TRL's DPO layout, or packed with each member its own sequence.

A pair arrives as one token row (``.preference()``: the chosen member's tokens then the rejected one's, ``labels``
on the completions, :data:`CHOSEN`) and stays one row until the last stage: :class:`PairPadder` (``.pad()``) or
:class:`PairLayout` (on ``.pack()``) lays it out as docs/preference.md shows.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import torch
from torchdata.nodes import BaseNode

from padpipe.chunks import TokenChunk, exclusive_cumsum
from padpipe.pipes.packing import block_causal_mask
from padpipe.pipes.pad import LABELS, Padder
from padpipe.state import Child, StateSchema

CHOSEN = "chosen_tokens"
"""The column of a pair row: how many of its tokens are the chosen member's (the rest are the rejected one's)."""
MEMBER = "chosen"
"""The batch key saying which rows (padded) or tokens (packed) belong to a chosen member."""
COMPLETION_MASK = "completion_mask"
IGNORE = -100
"""The label of a prompt token (and the ``label_pad_id`` pairs are padded and packed with)."""


def members(chunk: TokenChunk) -> TokenChunk:
    """Pair rows as member rows: the chosen members, then the rejected ones, each with its pair's other columns
    and :data:`MEMBER`.

    Example:
        >>> pairs = TokenChunk.from_lists([[1, 2, 3], [4, 5, 6, 7]], {"chosen_tokens": [2, 1], "id": [8, 9]})
        >>> out = members(pairs)
        >>> [out.row(i).tolist() for i in range(4)], out.columns["id"].to_pylist(), out.columns["chosen"].to_pylist()
        ([[1, 2], [4], [3], [5, 6, 7]], [8, 9, 8, 9], [True, True, False, False])
    """
    chosen = chunk.columns[CHOSEN].to_numpy(zero_copy_only=False).astype(np.int64)
    starts = np.concatenate([chunk.offsets[:-1], chunk.offsets[:-1] + chosen])
    lengths = np.concatenate([chosen, chunk.lengths - chosen])
    offsets = exclusive_cumsum(lengths)
    index = np.repeat(starts - offsets[:-1], lengths) + np.arange(int(offsets[-1]))
    rows = pa.array(np.tile(np.arange(chunk.num_rows), 2))
    columns = {name: column.take(rows) for name, column in chunk.columns.items() if name not in (CHOSEN, LABELS)}
    if LABELS in chunk.columns:
        labels = pa.array(chunk.columns[LABELS].flatten().to_numpy(zero_copy_only=False)[index])
        columns[LABELS] = pa.LargeListArray.from_arrays(pa.array(offsets), labels)
    columns[MEMBER] = pa.array(np.arange(2 * chunk.num_rows) < chunk.num_rows)
    return TokenChunk(chunk.ids[index], offsets, None, columns)


class PairPadder(Padder):
    """:class:`~padpipe.pipes.pad.Padder` for pair rows: TRL's DPO layout (module docstring), ``labels`` turned
    into ``completion_mask`` (1 on the completions' tokens)."""

    def _collate(self, chunk: TokenChunk) -> dict[str, Any]:
        out = super()._collate(members(chunk))
        out[COMPLETION_MASK] = (out.pop(LABELS) != IGNORE).long()
        return out


class PairLayout(BaseNode[dict]):
    """Lay out the pairs of packed batches (``pack(keep=(CHOSEN, ...))``) as two sequences each (:func:`pair_layout`).

    Args:
        source: A :class:`~padpipe.pipes.pack.Packer` keeping :data:`CHOSEN`.
        position_offset: The packer's first position id.
        mask_dtype: Build the 4-D block-diagonal causal mask of the members in this dtype (``None``: none; the
            packer below builds none).
    """

    STATE = StateSchema("PairLayout", 1, source=Child())

    def __init__(self, source: BaseNode, *, position_offset: int = 0, mask_dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.source, self.position_offset, self.mask_dtype = source, position_offset, mask_dtype

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        super().reset(initial_state)
        self.source.reset(None if initial_state is None else self.STATE.check(initial_state, {}).source)

    def next(self) -> dict:
        return pair_layout(next(self.source), self.position_offset, self.mask_dtype)

    def get_state(self) -> dict[str, Any]:
        return self.STATE.make({}, source=self.source.state_dict())


def pair_layout(
    batch: dict[str, Any], position_offset: int = 0, mask_dtype: torch.dtype | None = None
) -> dict[str, Any]:
    """A packed batch of pair rows with each member its own sequence: each pair's segment cut where its rejected
    member starts (``position_ids``, ``seq_idx``, ``cu_seq_lens_*``, ``max_length_*`` and the block mask with it),
    ``labels`` turned into ``completion_mask`` and ``chosen`` per token.

    Example:
        >>> batch = {"input_ids": torch.tensor([[1, 2, 3, 4, 5, 0]]), "position_ids": torch.tensor([[0, 1, 2, 3, 4, 0]]),
        ...          "labels": torch.tensor([[-100, 2, -100, -100, 5, -100]]), "seq_idx": torch.tensor([[0, 0, 0, 0, 0, 1]]),
        ...          "cu_seq_lens_q": torch.tensor([0, 5, 6]), "max_length_q": 5, "chosen_tokens": [[2]]}
        >>> out = pair_layout(batch)
        >>> out["position_ids"].tolist(), out["completion_mask"].tolist(), out["chosen"].tolist()
        ([[0, 1, 0, 1, 2, 0]], [[0, 1, 0, 0, 1, 0]], [[True, True, False, False, False, False]])
        >>> out["cu_seq_lens_q"].tolist(), out["seq_idx"].tolist(), out["max_length_q"]
        ([0, 2, 5, 6], [[0, 0, 1, 1, 1, 2]], 3)
    """  # noqa: E501
    out = {key: value for key, value in batch.items() if key != CHOSEN}
    rows, width = batch["input_ids"].shape
    bounds = batch["cu_seq_lens_q"].numpy().astype(np.int64)
    counts = [len(row) for row in batch[CHOSEN]]  # pairs per row; each row's pairs come first, then its padding
    first = np.searchsorted(bounds, np.arange(rows) * width)  # each row's first segment
    slots = np.arange(max(counts, default=0))[None, :]
    pair_segments = (first[:, None] + slots)[slots < np.array(counts)[:, None]]
    splits = bounds[pair_segments] + np.array([n for row in batch[CHOSEN] for n in row], dtype=np.int64)
    new = np.sort(np.concatenate([bounds, splits]))
    segments = np.diff(new)
    seq_idx = np.repeat(np.arange(len(segments)), segments)
    position = np.arange(rows * width) - np.repeat(new[:-1], segments) + position_offset
    chosen = np.zeros(len(segments), bool)
    chosen[np.searchsorted(new, bounds[pair_segments])] = True
    labels = batch[LABELS].reshape(-1).clone()
    labels[torch.from_numpy(new[:-1])] = IGNORE
    out.pop(LABELS)
    shape = (rows, width)
    out["position_ids"] = torch.from_numpy(position.reshape(shape))
    out["seq_idx"] = torch.from_numpy(seq_idx.reshape(shape).astype(np.int32))
    for key in ("cu_seq_lens_q", "cu_seq_lens_k"):
        if key in batch:
            out[key] = torch.from_numpy(new.astype(np.int32))
    for key in ("max_length_q", "max_length_k"):
        if key in batch:
            out[key] = int(segments.max())
    if mask_dtype is not None:
        out["attention_mask"] = block_causal_mask(segments, rows, width, mask_dtype)
    out[COMPLETION_MASK] = (labels != IGNORE).long().reshape(shape)
    out[MEMBER] = torch.from_numpy(np.repeat(chosen, segments).reshape(shape))
    return out


def pair_logps(logits: torch.Tensor, batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """Each pair's chosen and rejected completion log-probabilities, summed over their tokens, in pair order.

    Token ``t`` of a completion counts ``log_softmax(logits[t - 1])[input_ids[t]]``, as TRL's DPO sums them; works on
    either layout (a packed batch's members are told apart by ``seq_idx``).

    Args:
        logits: The model's ``[rows, L, vocab]`` logits for ``batch`` (float32 for exact sums).
        batch: A padded or packed preference batch.

    Returns:
        ``(chosen, rejected)``, each ``[pairs]``.

    Example:
        >>> batch = {"input_ids": torch.tensor([[1, 2], [1, 3]]), "completion_mask": torch.tensor([[0, 1], [0, 1]]),
        ...          "chosen": torch.tensor([True, False])}
        >>> chosen, rejected = pair_logps(torch.zeros(2, 2, 4), batch)
        >>> chosen.tolist(), rejected.tolist()  # log(1/4)
        ([-1.3862943649291992], [-1.3862943649291992])
    """  # noqa: E501
    ids, mask = batch["input_ids"], batch[COMPLETION_MASK][:, 1:].to(logits.dtype)
    logps = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1) * mask
    if batch[MEMBER].dim() == 1:  # padded: one member a row
        sums = logps.sum(1)
        return sums[batch[MEMBER]], sums[~batch[MEMBER]]
    seq = batch["seq_idx"][:, 1:].reshape(-1).long()
    size = int(batch["seq_idx"].max()) + 1
    sums = torch.zeros(size, dtype=logps.dtype, device=logps.device).index_add_(0, seq, logps.reshape(-1))
    chosen = torch.nonzero(batch[MEMBER].reshape(-1)[batch["cu_seq_lens_q"][:-1].long()]).squeeze(1)
    return sums[chosen], sums[chosen + 1]  # a pair's rejected member is the sequence after its chosen one


def count_pairs(batch: dict[str, Any]) -> int | None:
    """The pairs of a preference batch (what ``num_items_in_batch`` counts for it), or ``None`` for another batch.

    Example:
        >>> count_pairs({"chosen": torch.tensor([True, True, False, False]), "completion_mask": torch.ones(4, 3)})
        2
    """
    member = batch.get(MEMBER)
    if not isinstance(member, torch.Tensor) or COMPLETION_MASK not in batch:
        return None
    if member.dim() == 1:
        return int(member.sum())
    return int(member.reshape(-1)[batch["cu_seq_lens_q"][:-1].long()].sum())


def paired_rows(batch: dict[str, Any]) -> int | None:
    """``B`` for a padded preference batch of ``2B`` rows (chosen rows, then rejected rows), else ``None``.

    Example:
        >>> paired_rows({"chosen": torch.tensor([True, False]), "completion_mask": torch.ones(2, 3)})
        1
    """
    member = batch.get(MEMBER)
    if not isinstance(member, torch.Tensor) or member.dim() != 1 or COMPLETION_MASK not in batch or len(member) % 2:
        return None
    half = len(member) // 2
    return half if bool(member[:half].all()) and not bool(member[half:].any()) else None
