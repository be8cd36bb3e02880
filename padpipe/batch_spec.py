"""What a batch held in a state must be before padpipe yields it again: its tensors checked against each other.

A crafted state could make the batches it holds anything; :class:`HeldBatch` refuses, as one
:class:`~padpipe.state.StateMismatchError` line, a dict batch whose token keys are no tensors, of the wrong dtype,
or that disagree with ``input_ids``, in time and memory linear in the batch. A batch that is no dict is its
stage's to judge.

Example:
    >>> batch_problem({"input_ids": torch.ones(2, 3), "labels": torch.zeros(2, 3, dtype=torch.long)})
    ('`input_ids` is an integer tensor', 'a tensor of torch.float32')
    >>> batch_problem({"input_ids": torch.ones(4, 3, dtype=torch.long), "labels": torch.zeros(2, 3, dtype=torch.long)})
    ("`labels` has the batch's 4 rows", 'a tensor of shape (2, 3)')
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from padpipe.state import Invalid, Spec
from padpipe.state_walk import show

INTEGER = ("input_ids", "shift_labels", "position_ids", "token_type_ids", "seq_idx", "completion_mask")  # one a token
BOUNDS = ("cu_seq_lens_q", "cu_seq_lens_k")
LENGTHS = ("max_length_q", "max_length_k")
MARKS = ("is_filler", "is_repeat")
TENSORS = (*INTEGER, "labels", "attention_mask", *BOUNDS, *MARKS, "num_items_in_batch")


def _is_int(t: torch.Tensor) -> bool:
    return not t.dtype.is_floating_point and not t.dtype.is_complex and t.dtype != torch.bool


def _tensor(t: torch.Tensor) -> str:
    return f"a tensor of shape {tuple(t.shape)}"


def batch_problem(batch: Mapping[Any, Any]) -> tuple[str, str] | None:
    """What is wrong with a dict batch, as ``(expected, found)``, or ``None`` if nothing is: each key's type,
    dtype, rows and shape checked against ``input_ids`` as the stages make them (``labels`` may hold one float a
    row or more; ``cu_seq_lens_*`` bound ``input_ids``' tokens).
    """
    for key, value in batch.items():
        if not isinstance(key, str):
            return "keys are strings", f"a key {show(key, 40)}"
        if key in TENSORS and not isinstance(value, torch.Tensor):
            return f"`{key}` is a tensor", show(value, 40)
    if "use_cache" in batch and batch["use_cache"] is not False:  # pack() makes it False, and only that
        return "`use_cache` is False", show(batch["use_cache"], 40)
    ids = batch.get("input_ids")
    for key in (*INTEGER, *BOUNDS):
        if key in batch and not _is_int(batch[key]):
            return f"`{key}` is an integer tensor", f"a tensor of {batch[key].dtype}"
    for key in MARKS:
        if key in batch and (batch[key].dim() != 0 or batch[key].dtype != torch.bool):
            return f"`{key}` is a 0-d bool tensor", f"{_tensor(batch[key])} of {batch[key].dtype}"
    count = batch.get("num_items_in_batch")
    if count is not None and (count.dim() or not _is_int(count)):
        return "`num_items_in_batch` is a 0-d integer tensor", _tensor(count)
    for key in (*INTEGER, "labels", "attention_mask"):
        if key in batch and batch[key].dim() == 0:
            return f"`{key}` is a tensor of one row or more", _tensor(batch[key])
    rowed = (v for k, v in batch.items() if k not in BOUNDS and isinstance(v, torch.Tensor) and v.dim() > 0)
    first = ids if isinstance(ids, torch.Tensor) else next(rowed, None)
    if first is None:
        return None
    rows = len(first)
    for key, value in batch.items():
        if key in BOUNDS:
            continue
        if isinstance(value, torch.Tensor) and value.dim() > 0 and len(value) != rows:
            return f"`{key}` has the batch's {rows} rows", _tensor(value)
        if isinstance(value, (list, tuple)) and len(value) != rows:
            return f"`{key}` has the batch's {rows} rows", f"a list of {len(value)}"
    if not isinstance(ids, torch.Tensor):
        return None
    return _tokens_problem(batch, ids)


def _tokens_problem(batch: Mapping[str, Any], ids: torch.Tensor) -> tuple[str, str] | None:
    """The per-token keys against ``input_ids``."""
    for key in INTEGER[1:]:
        if key in batch and batch[key].shape != ids.shape:
            return f"`{key}` has the shape of `input_ids`, {tuple(ids.shape)}", _tensor(batch[key])
    labels = batch.get("labels")
    if isinstance(labels, torch.Tensor):
        if labels.dtype.is_complex or labels.dtype == torch.bool:
            return "`labels` is a tensor of numbers", f"a tensor of {labels.dtype}"
        token_level = labels.dim() == ids.dim()
        if token_level and labels.shape != ids.shape:
            return f"`labels` has the shape of `input_ids`, {tuple(ids.shape)}, or one label a row", _tensor(labels)
        if token_level and not _is_int(labels):
            return "`labels` holds integers where it has one a token", f"a tensor of {labels.dtype}"
    mask = batch.get("attention_mask")
    if isinstance(mask, torch.Tensor) and (mask.dtype.is_complex or mask.dim() == 2 and mask.shape != ids.shape):
        return f"`attention_mask` has the shape of `input_ids`, {tuple(ids.shape)}", _tensor(mask)
    if ids.numel() and int(ids.min()) < 0:
        return "`input_ids` are ids >= 0", f"a tensor holding {int(ids.min())}"
    for key in BOUNDS:
        if key in batch and not _bounds_fit(batch[key], ids.numel()):
            expected = f"`{key}` holds 1-D bounds from 0 up to {ids.numel()}, the tokens of `input_ids`"
            return expected, _tensor(batch[key])
    bounds = batch.get("cu_seq_lens_q")
    longest = int((bounds[1:] - bounds[:-1]).max()) if isinstance(bounds, torch.Tensor) else None
    for key in LENGTHS:
        if key not in batch:
            continue
        value = batch[key]
        if longest is None or isinstance(value, bool) or not isinstance(value, int) or value != longest:
            return f"`{key}` is the longest segment of `cu_seq_lens_q`, {longest}", show(value, 40)
    return None


def _bounds_fit(bounds: torch.Tensor, tokens: int) -> bool:
    if bounds.dim() != 1 or len(bounds) < 2:
        return False
    return int(bounds[0]) == 0 and int(bounds[-1]) == tokens and bool((bounds[1:] >= bounds[:-1]).all())


@dataclass(frozen=True)
class HeldBatch(Spec):
    """A batch a state holds: a dict batch is checked by :func:`batch_problem`; anything else, unless ``labelled``.

    Args:
        labelled: The batch must be a dict with ``labels``, ``shift_labels`` or (a preference batch)
            ``completion_mask`` (what a window of accumulation steps counts).
    """

    labelled: bool = False

    def load(self, value: Any) -> Any:
        if self.labelled and (
            not isinstance(value, Mapping) or not {"labels", "shift_labels", "completion_mask"} & set(value)
        ):
            raise Invalid("a batch dict with `labels`, `shift_labels` or `completion_mask`")
        if isinstance(value, Mapping) and (problem := batch_problem(value)) is not None:
            raise Invalid(f"a batch whose {problem[0]}", problem[1])
        return value
