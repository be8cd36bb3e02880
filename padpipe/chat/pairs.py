"""TRL's preference formats read into members: each row's ``(prompt, completion)`` for its chosen and rejected
completions (or, unpaired, its one completion), or a :class:`~padpipe.chat.rows.RowProblem` saying why not.

Conversational rows hold messages (a completion is one assistant message), plain rows strings; a pair without a
``prompt`` column has an implicit one, the common start of its two conversations, split as TRL's ``extract_prompt``
splits it. ``.preference()`` (``padpipe/pipes/preference.py``) encodes each member as a ``.chat()`` conversation.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from padpipe.chat.rows import BAD, RowProblem, read_prompt_completion
from padpipe.errors import DataError

PROMPT, CHOSEN_COLUMN, REJECTED, COMPLETION, LABEL = "prompt", "chosen", "rejected", "completion", "label"
"""The columns of TRL's preference formats (paired: ``prompt``, ``chosen``, ``rejected``; unpaired: ``prompt``,
``completion``, ``label``); ``prompt`` is optional for pairs (an implicit prompt)."""
PREFERENCE_COLUMNS = (PROMPT, CHOSEN_COLUMN, REJECTED, COMPLETION)
"""The columns a JSON Lines reader passes as written (JSON text), so conversations reach the template unchanged."""


def read_members(batch: pa.RecordBatch, *, unpaired: bool) -> list[Any]:
    """Per row: a tuple of ``(prompt, completion)``, one per member (chosen, rejected; or the unpaired completion),
    or a RowProblem; a ``DataError`` when a column the format needs is missing.

    Example:
        >>> batch = pa.RecordBatch.from_pylist([{"chosen": "Sky: blue", "rejected": "Sky: green"}])
        >>> read_members(batch, unpaired=False)
        [(('Sky:', ' blue'), ('Sky:', ' green'))]
    """
    names = batch.schema.names
    members = (COMPLETION,) if unpaired else (CHOSEN_COLUMN, REJECTED)
    needed = (PROMPT, *members, LABEL) if unpaired else (PROMPT, *members) if PROMPT in names else members
    missing = [name for name in needed if name not in names]
    if missing:
        other = (CHOSEN_COLUMN, REJECTED) if unpaired else (COMPLETION, LABEL)
        hint = (
            f"; these rows hold {' and '.join(other)}: pass unpaired={not unpaired}" if set(other) <= set(names) else ""
        )
        raise DataError(f"preference: the data has no column {missing[0]!r} (columns: {names}){hint}.")
    if PROMPT in names:
        pairs = [read_prompt_completion(batch.column(PROMPT), batch.column(m), (PROMPT, m)) for m in members]
        rows = [next((v for v in p if isinstance(v, RowProblem)), tuple(p)) for p in zip(*pairs)]
    else:  # an implicit prompt: the longest common start of both conversations (as TRL's extract_prompt)
        both = read_prompt_completion(batch.column(CHOSEN_COLUMN), batch.column(REJECTED), (CHOSEN_COLUMN, REJECTED))
        rows = [value if isinstance(value, RowProblem) else split_prompt(*value) for value in both]
    labels = batch.column(LABEL).to_pylist() if unpaired else [True] * batch.num_rows
    return [_problem(row, label) or row for row, label in zip(rows, labels)]


def split_prompt(chosen: Any, rejected: Any) -> tuple[tuple[Any, Any], tuple[Any, Any]]:
    """An implicit prompt split off as TRL's ``extract_prompt`` splits it: the longest common start (of messages,
    or of characters, then without a space it ends in).

    Example:
        >>> split_prompt("Sky is blue", "Sky is grey")
        (('Sky is', ' blue'), ('Sky is', ' grey'))
    """
    idx = 0
    for idx in range(min(len(chosen), len(rejected))):
        if chosen[idx] != rejected[idx]:
            if chosen[idx - 1] == " ":
                idx -= 1
            break
    return (chosen[:idx], chosen[idx:]), (rejected[:idx], rejected[idx:])


def _problem(row: Any, label: Any) -> RowProblem | None:
    """Why a row's members cannot be encoded: not what TRL's formats hold."""
    if isinstance(row, RowProblem):
        return row
    if not isinstance(label, bool):
        return RowProblem(BAD, f"'label' is {label!r}; expected true or false")
    for prompt, completion in row:
        if isinstance(prompt, str):
            continue
        if not prompt:
            return RowProblem(BAD, "the prompt is empty; expected the messages before the completion")
        if len(completion) != 1 or completion[0].get("role") != "assistant":
            return RowProblem(BAD, f"a completion is {completion!r:.80}; expected one assistant message")
    return None
