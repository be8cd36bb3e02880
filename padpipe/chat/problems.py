"""What the chat stage refuses, and how it says so: a batch it cannot read, a refused row's message and hint,
a special token's text inside a message, and the warning for what a template does not render."""

from __future__ import annotations

import json
import re
import threading
import warnings
from typing import Any

import pyarrow as pa

from padpipe.chat.options import MISSING_COLUMN, ChatOptions
from padpipe.chat.rows import CHECK, NOT_PREFIX, SPECIAL, RowProblem
from padpipe.errors import DataError
from padpipe.tokenizer.rows import LABELS, row_origin, row_place

MARKERS = "pass chat_template= one with {% generation %} markers, or on_error='skip' to drop such rows"
HINTS = {
    NOT_PREFIX: "the conversation is not well-formed for this template, or the template renders the turns in a way "
    f"padpipe cannot align: {MARKERS}",
    CHECK: MARKERS,
    SPECIAL: "special_text='keep' trains it as the tokenizer reads it (counted), 'skip' drops such rows",
}
_SAID_LOCK = threading.Lock()


def check_columns(batch: pa.RecordBatch, options: ChatOptions) -> None:
    """Raise ``TypeError``/``DataError`` for a batch the stage cannot read at all (not one of its rows)."""
    if not isinstance(batch, pa.RecordBatch):
        raise TypeError(f"chat expects a pyarrow.RecordBatch, but got {type(batch).__name__} instead.")
    names = batch.schema.names
    for name in options.named():
        if name not in names and (options.on_error == "raise" or name not in options.required()):
            missing = MISSING_COLUMN.format(names)
            raise DataError(f"chat: column {name!r} is not in the data{row_origin(batch)}; {missing}")
    if LABELS in names:
        raise DataError(
            f"chat: the data{row_origin(batch)} has a column {LABELS!r}, which the token-level labels of .chat() "
            "would replace; drop or rename it."
        )


def row_message(batch: pa.RecordBatch, row: int, problem: RowProblem) -> str:
    """The ``DataError`` message of a refused row: where it is, what is wrong, what to do.

    Example:
        >>> batch = pa.RecordBatch.from_pylist([{"messages": None, "id": 7}])
        >>> row_message(batch, 0, RowProblem("bad_messages", "'messages' is None"))
        "chat: row 0 of the chunk (id=7): 'messages' is None; pass on_error='skip' to drop such rows (counted as chat.bad_messages)."
    """  # noqa: E501
    hint = HINTS.get(problem.reason, "pass on_error='skip' to drop such rows")
    return f"chat: {row_place(batch, row)}: {problem}; {hint} (counted as chat.{problem.reason})."


def special_text(specials: re.Pattern[str], messages: list[dict[str, Any]], tools: list | None) -> str | None:
    """Where a conversation's text holds a special token's text (which the tokenizer reads as that token: a turn
    boundary faked inside a message's content, reasoning or tool calls, or a tool), or ``None``.

    Example:
        >>> special_text(re.compile("<eos>"), [{"role": "user", "content": "a<eos>b"}], None)
        "message 0's content holds '<eos>'"
    """
    for k, message in enumerate(messages):
        for key in ("content", "reasoning_content", "tool_calls"):
            value = message.get(key)
            text = value if isinstance(value, str) else "" if value is None else json.dumps(value, ensure_ascii=False)
            if (match := specials.search(text)) is not None:
                return f"message {k}'s {key} holds {match.group()!r}"
    if tools and (match := specials.search(json.dumps(tools))):
        return f"its tools hold {match.group()!r}"
    return None


def warn_dropped(what: str, key: str, said: set[str]) -> None:
    """Warn, once per ``said``, that the template does not render the ``what`` of some conversations (``key``)."""
    with _SAID_LOCK:
        if key in said:
            return
        said.add(key)
    how = (
        "pass chat_template= a training template that renders it (docs/sft.md, 'Reasoning')"
        if what == "reasoning"
        else "pass chat_template= a template that renders it, or fold it into a message the template renders"
    )
    warnings.warn(
        f"chat(): the chat template does not render the {what.replace('_', ' ')} of some conversations; they "
        f"are trained as rendered and counted as {key} in stats(). To train it, {how}.",
        stacklevel=2,
    )
