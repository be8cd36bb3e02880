"""torchtitan's batches from padpipe's packed ones: ``({"input": ids, "positions": positions}, labels)``.

torchtitan 0.3.0 does not shift labels, so :func:`titan_batch` shifts a ``.pack()`` batch's within each document
(``-100`` at a document's last token, padding and masked tokens), and positions start at 0 where a piece starts
inside a document (torchtitan starts a document's mask only there). Every batch is exactly ``rows`` x
``seq_len`` (:func:`fill_rows`). Pure ``torch``: no torchtitan import here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from padpipe.runtime.rebalance import FILLER_KEY

IGNORE_INDEX = -100
"""The label torchtitan's loss leaves out (``torchtitan.components.loss.IGNORE_INDEX``; pinned in titan_api)."""

TitanBatch = tuple[dict[str, torch.Tensor], torch.Tensor]


def titan_batch(batch: Mapping[str, Any], *, rows: int, seq_len: int, pad_id: int) -> tuple[TitanBatch, int]:
    """torchtitan's batch of ``batch`` (a ``.pack()`` batch) as ``rows`` x ``seq_len``, and how many rows were filled.

    Args:
        batch: A packed batch: ``input_ids``, ``position_ids`` and ``labels``, ``[b, n]``, ``b <= rows``,
            ``n <= seq_len``.
        rows: The rows torchtitan takes per batch (its ``local_batch_size``).
        seq_len: The tokens torchtitan takes per row.
        pad_id: The token id of filled rows and padding runs.

    Raises:
        ValueError: A key is missing, the shapes differ, or the batch has more than ``rows`` rows.

    Example:
        >>> packed = {"input_ids": torch.tensor([[5, 6, 7, 8, 9, 0]]),  # documents 5 6 7 and 8 9, one padding slot
        ...           "position_ids": torch.tensor([[0, 1, 2, 0, 1, 0]]),
        ...           "labels": torch.tensor([[-100, 6, 7, -100, 9, -100]])}
        >>> (inputs, labels), filled = titan_batch(packed, rows=2, seq_len=6, pad_id=0)
        >>> inputs["input"].tolist(), inputs["positions"][0].tolist(), filled
        ([[5, 6, 7, 8, 9, 0], [0, 0, 0, 0, 0, 0]], [0, 1, 2, 0, 1, 0], 1)
        >>> labels.tolist()
        [[6, 7, -100, 9, -100, -100], [-100, -100, -100, -100, -100, -100]]
    """
    missing = [key for key in ("input_ids", "position_ids", "labels") if key not in batch]
    if missing:
        raise ValueError(
            f"padpipe.integrations.torchtitan needs packed batches (a pipeline ending in .pack()), but a batch has no "
            f"{', '.join(missing)}: found keys {sorted(batch)}."
        )
    ids, positions, labels = batch["input_ids"], batch["position_ids"], batch["labels"]
    shapes = [list(t.shape) for t in (ids, positions, labels)]
    if ids.dim() != 2 or ids.shape[1] > seq_len or shapes.count(shapes[0]) != 3 or len(ids) > rows:
        raise ValueError(
            f"padpipe.integrations.torchtitan: a packed batch must be [at most {rows}, at most {seq_len}] in "
            f"input_ids, position_ids and labels alike, but they are {shapes}."
        )
    shifted = torch.full_like(labels, IGNORE_INDEX)
    mark = batch.get(FILLER_KEY)
    if not (isinstance(mark, torch.Tensor) and bool(mark)):  # equal steps' filler: one real row, to train nothing
        shifted[:, :-1] = labels[:, 1:]
    lead = (positions == 0).cumsum(1) == 0  # a piece equal steps cut inside a document, up to the row's first 0:
    positions = torch.where(lead, positions - positions[:, :1], positions)  # torchtitan starts documents at 0
    if ids.shape[1] < seq_len:  # a piece of a cut row: a padding run, positions from 0, trains nothing
        run, runs = seq_len - ids.shape[1], len(ids)
        ids = torch.cat([ids, ids.new_full((runs, run), pad_id)], 1)
        positions = torch.cat([positions, torch.arange(run, dtype=positions.dtype).expand(runs, run)], 1)
        shifted = torch.cat([shifted, shifted.new_full((runs, run), IGNORE_INDEX)], 1)
    filled = rows - len(ids)
    if filled:
        (fill_inputs, fill_labels) = fill_rows(filled, seq_len, pad_id)
        ids, positions = torch.cat([ids, fill_inputs["input"]]), torch.cat([positions, fill_inputs["positions"]])
        shifted = torch.cat([shifted, fill_labels])
    return ({"input": ids, "positions": positions}, shifted), filled


def fill_rows(rows: int, seq_len: int, pad_id: int) -> TitanBatch:
    """``rows`` rows that train nothing: ``pad_id`` tokens, positions ``0..seq_len-1``, every label ``-100``.

    Example:
        >>> inputs, labels = fill_rows(1, 3, 0)
        >>> inputs["input"].tolist(), inputs["positions"].tolist(), labels.tolist()
        ([[0, 0, 0]], [[0, 1, 2]], [[-100, -100, -100]])
    """
    ids = torch.full((rows, seq_len), pad_id, dtype=torch.int64)
    positions = torch.arange(seq_len, dtype=torch.int64).expand(rows, seq_len).contiguous()
    return {"input": ids, "positions": positions}, torch.full((rows, seq_len), IGNORE_INDEX, dtype=torch.int64)
