"""Where batches go so that every rank takes the same steps with every row once: plans, made alike on every rank.

Every rank makes the same plan from the same gathered table (:func:`donations` while ranks read, :func:`tail_plan`
at the epoch's end), so no rank has to tell another what to do (docs/distributed.md, "Equal steps").

Example:
    >>> donations([3, 0, 2])
    [Move(src=0, dst=1, filler=False)]
    >>> plan = tail_plan([[4, 4], [], [1]])
    >>> plan.steps, plan.splits, [(m.src, m.dst) for m in plan.moves]
    (1, [[], [], []], [(0, 1)])
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from padpipe.runtime.batch_cut import rows_of, split_batch
from padpipe.runtime.row_pieces import cut_row, describe, halve, labels_of

FILLER_KEY = "is_filler"


@dataclass(frozen=True)
class Move:
    """One batch sent from rank ``src`` to rank ``dst``.

    With ``filler``, a filler made from ``src``'s first batch (a rank may make one for itself).
    """

    src: int
    dst: int
    filler: bool = False


def donations(counts: list[int]) -> list[Move] | None:
    """Moves that give every rank holding no batch one from a rank holding two or more; ``None`` if too few.

    Each empty rank, in rank order, takes the last batch of the rank with the most to spare (the lowest on a
    tie); the moves are ordered by ``(src, dst)``, the order every rank sends and receives in.

    Example:
        >>> donations([0, 4, 0, 2])
        [Move(src=1, dst=0, filler=False), Move(src=1, dst=2, filler=False)]
        >>> donations([0, 0, 2]) is None
        True
    """
    spare = [max(count - 1, 0) for count in counts]
    moves = []
    for dst, count in enumerate(counts):
        if count:
            continue
        src = max(range(len(counts)), key=lambda r: (spare[r], -r))
        if not spare[src]:
            return None
        spare[src] -= 1
        moves.append(Move(src, dst))
    return sorted(moves, key=lambda m: (m.src, m.dst))


@dataclass(frozen=True)
class TailPlan:
    """How the epoch's last batches are evened out: the ``steps`` every rank yields from here on, each rank's
    ``splits`` (the positions in its held list, as it stands when each is made, of the batches it cuts in two) and
    the ``moves`` (a donor sends its batches beyond its first ``steps``, in order; a filler is made from the
    sender's first batch)."""

    steps: int
    splits: list[list[int]] = field(default_factory=list)
    moves: list[Move] = field(default_factory=list)


def tail_plan(rows: list[list[int]], docs: list[list[tuple[tuple[int, ...], ...]]] | None = None) -> TailPlan:
    """The :class:`TailPlan` for ranks holding batches of ``rows[rank]`` rows each (0: a batch that is no dict).

    ``docs[rank][i]`` is a packed batch's rows' document codes (:func:`~padpipe.runtime.row_pieces.describe`;
    ``()`` for any other batch). ``steps`` is the held batches over the ranks, rounded up. Until the ranks
    hold that many, a batch is split: the one with the most rows first, then a one-row batch whose documents
    regroup (the most documents first), last one whose one document is cut (the most label tokens first),
    the lowest rank and position on a tie. Each rank keeps its first ``steps`` and sends the rest, in rank
    order, to the ranks short of them; a rank still short gets a filler from the lowest rank whose first
    batch is a dict. With no such rank the plan moves nothing and ``steps`` is the fewest any rank holds:
    the caller drops what it cannot even out, and counts it.

    Example:
        >>> tail_plan([[8, 8], [8]])  # 3 batches: rank 0 splits its first, then sends its last to rank 1
        TailPlan(steps=2, splits=[[0], []], moves=[Move(src=0, dst=1, filler=False)])
        >>> tail_plan([[1], [], []]).moves  # one row for three ranks: two fillers
        [Move(src=0, dst=1, filler=True), Move(src=0, dst=2, filler=True)]
        >>> tail_plan([[1], [], []], [[((6, 8, 4),)], [], []]).moves  # one row of 3 conversations: regrouped, no filler
        [Move(src=0, dst=1, filler=False), Move(src=0, dst=2, filler=False)]
    """
    ranks = len(rows)
    held = [list(mine) for mine in rows]
    pieces: list[list[tuple[tuple[int, ...], ...]]] = (
        [list(m) for m in docs] if docs is not None else [[()] * len(m) for m in rows]
    )
    total = sum(len(mine) for mine in held)
    steps = -(-total // ranks)
    splits: list[list[int]] = [[] for _ in range(ranks)]
    while total < steps * ranks:
        where = [
            key for r, mine in enumerate(held) for i, n in enumerate(mine) if (key := _split_key(n, pieces[r][i], r, i))
        ]
        if not where:
            break
        *_, r, i = min(where)
        n = held[r][i]
        known = pieces[r][i]
        if n >= 2:
            held[r][i : i + 1] = [n // 2, n - n // 2]
            pieces[r][i : i + 1] = [known[: n // 2], known[n // 2 :]] if known else [(), ()]
        else:
            plan = halve(known[0])
            assert plan is not None  # _split_key chose it
            held[r][i : i + 1] = [1, 1]
            pieces[r][i : i + 1] = [(plan.left,), (plan.right,)]
        splits[r].append(i)
        total += 1
    counts = [len(mine) for mine in held]
    surplus = [r for r in range(ranks) for _ in range(counts[r] - steps)]
    makers = [r for r in range(ranks) if held[r] and held[r][0] > 0]
    moves = []
    for dst in range(ranks):
        for _ in range(steps - counts[dst]):
            if surplus:
                moves.append(Move(surplus.pop(0), dst))
            elif makers:
                moves.append(Move(makers[0], dst, filler=True))
            else:  # nothing can fill: every rank yields as many as the fewest held, the rest is dropped and counted
                return TailPlan(min(counts), splits, [])
    return TailPlan(steps, splits, sorted(moves, key=lambda m: (m.src, m.dst)))


def _split_key(rows: int, known: tuple[tuple[int, ...], ...], rank: int, at: int) -> tuple[int, ...] | None:
    """How eagerly a batch is split (the least first), or ``None`` if it cannot be."""
    if rows >= 2:
        return (0, -rows, rank, at)
    if rows != 1 or len(known) != 1 or (plan := halve(docs := known[0])) is None:
        return None
    if plan.cuts_a_document:
        return (2, -sum(labels_of(d) for d in docs), rank, at)
    return (1, -len(docs), rank, at)


def splittable_rows(batch: Any) -> int:
    """What :func:`tail_plan` needs of a batch: its rows if it splits in two, 1 if it is a dict that does not, else 0.

    Example:
        >>> splittable_rows({"x": torch.ones(3, 2)}), splittable_rows({"x": torch.ones(1, 2)}), splittable_rows("row")
        (3, 1, 0)
    """
    if not isinstance(batch, dict):
        return 0
    rows = rows_of(batch) or 1
    return rows if rows >= 2 and split_batch(batch) is not None else 1


def documents(batch: Any) -> tuple[tuple[int, ...], ...]:
    """The document codes :func:`tail_plan` takes for a batch: each row's, for a batch of packed rows, else ``()``.

    Example:
        >>> row = {"input_ids": torch.tensor([[1, 2, 3]]), "labels": torch.tensor([[-100, 2, 3]]),
        ...        "cu_seq_lens_q": torch.tensor([0, 3])}
        >>> documents(row), documents({"x": torch.ones(3, 2)})
        (((5,),), ())
    """
    rows = splittable_rows(batch)
    if not rows or (described := describe(batch)) is None or len(described) != rows:
        return ()
    return described


def split(batch: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """Cut ``batch`` in two as :func:`tail_plan` planned: by rows if it has two or more, else by documents."""
    halves = split_batch(batch) if splittable_rows(batch) >= 2 else cut_row(batch)
    if halves is None:  # the plan is made from these same batches on every rank
        raise RuntimeError("equal steps planned to split a batch that cannot be split")
    return halves


def filler(batch: dict[str, Any]) -> dict[str, Any]:
    """A batch that trains nothing, shaped as ``batch``: its first row, marked ``"is_filler"`` (a bool tensor).

    Its labels are the row's own (so any loss is finite); the loop multiplies its loss by 0 and
    :func:`~padpipe.runtime.loss_tokens.label_tokens` counts none of its tokens.

    Example:
        >>> out = filler({"input_ids": torch.arange(6).reshape(3, 2), "labels": torch.tensor([1, 0, 1])})
        >>> out["input_ids"].tolist(), out["labels"].tolist(), bool(out["is_filler"])
        ([[0, 1]], [1], True)
    """
    row = batch
    while (rows_of(row) or 1) > 1 and (halves := split_batch(row)) is not None:
        row = halves[0]
    return {**row, FILLER_KEY: torch.tensor(True)}
