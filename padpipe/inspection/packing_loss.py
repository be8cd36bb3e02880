"""The labels half of ``pp.check_packing``: does each packed document get the loss it gets alone?

With the logits equal, the losses differ only where a label lets another document's token (or
padding) predict one of its own: not -100 at the document's first token. :func:`compare_loss` sums
each document's loss terms packed and alone as HF's losses compute them; :func:`label_cause` names it.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from padpipe.inspection.packing_causes import Cause
from padpipe.inspection.packing_rows import Document

IGNORE_INDEX = -100  # the label HF's losses leave out


@dataclasses.dataclass(frozen=True)
class LossCheck:
    """One document's summed loss and trained tokens, packed and alone, and the tolerance on the sums."""

    packed: float
    alone: float
    trained_packed: int
    trained_alone: int
    tolerance: float

    @property
    def exact(self) -> bool:
        return self.trained_packed == self.trained_alone and abs(self.packed - self.alone) <= self.tolerance

    def __str__(self) -> str:
        return (
            f"loss {self.packed:.4f} over {self.trained_packed} trained tokens packed, "
            f"{self.alone:.4f} over {self.trained_alone} alone"
        )


ROWS_AT_ONCE = 256
"""Tokens whose logits are compared, or turned into loss terms, at once: the temporaries of a check are
``ROWS_AT_ONCE x vocab`` floats (155 MB at a 151k vocabulary), never a document's or a batch's logits again."""


def _summed(logits: torch.Tensor, targets: torch.Tensor) -> tuple[float, int]:
    kept = (targets != IGNORE_INDEX).nonzero().flatten()
    total = 0.0
    for a in range(0, len(kept), ROWS_AT_ONCE):
        rows = kept[a : a + ROWS_AT_ONCE]
        total += float(F.cross_entropy(logits[rows].float(), targets[rows], reduction="sum"))
    return total, len(kept)


def max_difference(packed: torch.Tensor, alone: torch.Tensor) -> tuple[float, float]:
    """The largest ``|packed - alone|`` and the largest ``|alone|``, over ``ROWS_AT_ONCE`` tokens at a time.

    Example:
        >>> max_difference(torch.tensor([[1.0, 2.0], [3.0, 4.0]]), torch.tensor([[1.0, 2.5], [3.0, -5.0]]))
        (9.0, 5.0)
    """
    diff = top = 0.0
    for a in range(0, len(alone), ROWS_AT_ONCE):
        mine = alone[a : a + ROWS_AT_ONCE].float()
        diff = max(diff, (packed[a : a + ROWS_AT_ONCE].float() - mine).abs().max().item())
        top = max(top, mine.abs().max().item())
    return diff, top


def compare_loss(
    packed: torch.Tensor,
    alone: torch.Tensor,
    labels: torch.Tensor,
    document: Document,
    *,
    causal: bool,
    tolerance: float,
) -> LossCheck:
    """The loss terms whose targets are ``document``'s tokens, in the packed row and alone.

    A causal model's loss shifts the labels (HF's ``ForCausalLMLoss``): the target at a column is
    predicted from the column before, so packed, the document's first label is predicted from the
    token before it; alone, it is predicted from nothing and left out. Other models compare each
    column's own label. Each term differs by at most twice the largest logit difference, so the
    sums may differ by ``2 * tolerance`` per term.

    Args:
        packed: The packed row's logits, ``[seq_len, vocab]``.
        alone: The document's logits alone, ``[end - start, vocab]``.
        labels: The packed row's labels, ``[seq_len]`` (the document's alone are its slice).
        document: Where the document is.
        causal: Whether the model's loss shifts its labels.
        tolerance: The logits' tolerance for this document.

    Example:
        >>> logits = torch.zeros(4, 3)
        >>> check = compare_loss(logits, logits[1:], torch.tensor([-100, 2, 1, 0]), Document(0, 0, 1, 4),
        ...                      causal=True, tolerance=1e-5)
        >>> check.trained_packed, check.trained_alone, check.exact
        (3, 2, False)
    """
    labels = labels.to(packed.device)
    start, end = document.start, document.end
    if causal:
        first = max(start, 1)  # a row's first label has no token before it
        loss_packed = _summed(packed[first - 1 : end - 1], labels[first:end])
        loss_alone = _summed(alone[:-1], labels[start + 1 : end])
    else:
        loss_packed = _summed(packed[start:end], labels[start:end])
        loss_alone = _summed(alone, labels[start:end])
    terms = max(loss_packed[1], loss_alone[1])
    return LossCheck(loss_packed[0], loss_alone[0], loss_packed[1], loss_alone[1], 2 * terms * tolerance + 1e-6)


def label_cause(labels: torch.Tensor, document: Document) -> Cause | None:
    """Why ``document`` gets another loss packed than alone, its logits being its own; ``None`` if not its labels.

    Example:
        >>> label_cause(torch.tensor([[-100, 5, 6, 7]]), Document(0, 0, 2, 4)).what
        'labels[0, 2] is 6, not -100, at the first token of batch 0, row 0, tokens 2:4: the loss trains the token before it (of another document) to predict it'
    """  # noqa: E501
    row, start = document.row, document.start
    value = int(labels[row, start])
    if value == IGNORE_INDEX or start == 0:
        return None
    return Cause(
        "labels_cross_boundary",
        f"labels[{row}, {start}] is {value}, not -100, at the first token of {document}: the loss trains the "
        "token before it (of another document) to predict it",
        "put -100 at each document's first token and on padding, as pack() makes its labels (a stage or "
        "collator after pack() must keep them)",
    )
