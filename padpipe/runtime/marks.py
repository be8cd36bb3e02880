"""The one line a training loop of your own needs for equal steps' marked batches: :func:`loss_weight`.

A filler (``"is_filler"``) or a repeat (``"is_repeat"``) is there only so that every rank takes the step: it
must train nothing, and a loop that passes it to the model as it is trains those rows twice.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

from padpipe.runtime.lockstep import REPEAT_KEY
from padpipe.runtime.rebalance import FILLER_KEY


def loss_weight(batch: MutableMapping[str, Any]) -> float:
    """Pop equal steps' marks from ``batch``: ``0.0`` for a filler or a repeat (multiply its loss by it), else ``1.0``.

    Call it before ``model(**batch)`` (the marks are no model input) and multiply the loss by it:
    the step still runs on every rank (DDP's collectives meet), and the marked batch trains
    nothing. A batch that is no dict, or holds no mark, weighs ``1.0``.

    Example:
        >>> batch = {"input_ids": [[5, 6, 7]], "is_filler": True}  # equal steps' marks are 0-d bool tensors
        >>> loss_weight(batch), sorted(batch)
        (0.0, ['input_ids'])
        >>> loss_weight({"input_ids": [[5, 6, 7]]})
        1.0
    """
    if not isinstance(batch, MutableMapping):
        return 1.0
    marks = [batch.pop(key, False) for key in (FILLER_KEY, REPEAT_KEY)]
    return 0.0 if any(bool(mark) for mark in marks) else 1.0
