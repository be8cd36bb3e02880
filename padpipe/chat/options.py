"""The chat stage's options: which columns hold what, and how conversations are labelled and truncated.

Checked when ``.chat()`` is called (``ValueError``/``TypeError`` in one line), before any tokenizer is loaded.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from padpipe.chat.conversation import REASONING
from padpipe.chat.labels import TRUNCATION
from padpipe.chat.spans import TRAIN_ON
from padpipe.errors import one_of, positive

MISSING_COLUMN = (
    "expected one of the columns {} (messages= names the conversations' column; prompt= and completion= name a "
    "prompt's and its completion's)."
)
"""The end of the error for a conversation column that is not in the data (the stage's, and loader()'s check)."""
SPECIAL_TEXT = ("keep", "skip", "raise")
"""What ``.chat()`` does with a conversation whose text holds a special token's text: keep it (counted), skip it
(counted) or raise."""


@dataclass(frozen=True)
class ChatOptions:
    """What the chat stage reads and how it labels (see ``Pipeline.chat`` for each).

    Example:
        >>> ChatOptions(prompt="question", completion="answer").consumed()
        ('question', 'answer', 'tools', 'chat_template_kwargs')
        >>> ChatOptions(prompt="question")
        Traceback (most recent call last):
        ...
        ValueError: `prompt` and `completion` go together: pass both column names, or neither.
    """

    messages: str = "messages"
    prompt: str | None = None
    completion: str | None = None
    train_on: str = "assistant"
    training_field: str | None = "training"
    max_length: int | None = None
    truncation: str = "keep_start"
    tools: str | None = "tools"
    kwargs_column: str | None = "chat_template_kwargs"
    template_kwargs: Mapping[str, Any] = field(default_factory=dict)
    on_error: str = "raise"
    reasoning: str = "every_turn"
    special_text: str = "keep"

    def __post_init__(self) -> None:
        for name in ("messages", "prompt", "completion", "training_field", "tools", "kwargs_column"):
            value = getattr(self, name)
            if not (isinstance(value, str) or (value is None and name != "messages")):
                raise TypeError(f"`{name}` must be a column name, but is {value!r} instead.")
        if (self.prompt is None) != (self.completion is None):
            raise ValueError("`prompt` and `completion` go together: pass both column names, or neither.")
        one_of("train_on", self.train_on, TRAIN_ON)
        if self.prompt is not None and self.train_on == "last":
            raise ValueError("train_on='last' needs `messages`; with `prompt`/`completion` the completion is trained.")
        positive("max_length", self.max_length, allow_none=True)
        one_of("truncation", self.truncation, TRUNCATION)
        if self.truncation == "turns" and self.train_on == "all":
            raise ValueError(
                "truncation='turns' cuts after the last trained turn that fits; with train_on='all' "
                "there is none: use truncation='keep_start'."
            )
        if not isinstance(self.template_kwargs, Mapping) or not all(isinstance(k, str) for k in self.template_kwargs):
            raise TypeError(f"`template_kwargs` must be a dict of template arguments, but is {self.template_kwargs!r}.")
        object.__setattr__(self, "template_kwargs", dict(self.template_kwargs))  # the caller's dict may change
        one_of("on_error", self.on_error, ("raise", "skip"))
        one_of("reasoning", self.reasoning, REASONING)
        one_of("special_text", self.special_text, SPECIAL_TEXT)

    def settings(self) -> dict[str, Any]:
        """The options as plain data, checked on resume (``on_error`` left out, as for ``tokenize``)."""
        out = {k: v for k, v in self.__dict__.items() if k not in ("on_error", "template_kwargs")}
        return {**out, "template_kwargs": json.dumps(dict(self.template_kwargs), sort_keys=True, default=repr)}

    def required(self) -> tuple[str, ...]:
        """The columns every row must have: ``messages``, or ``prompt`` and ``completion``."""
        return (self.messages,) if self.prompt is None or self.completion is None else (self.prompt, self.completion)

    def named(self) -> tuple[str, ...]:
        """The columns every row must have, and the optional ones named other than their defaults (``tools="tool"``
        where the data has ``tools`` is a misspelling, not a conversation without tools)."""
        optional = ((self.tools, "tools"), (self.kwargs_column, "chat_template_kwargs"))
        return self.required() + tuple(c for c, default in optional if c is not None and c != default)

    def consumed(self) -> tuple[str, ...]:
        """The columns the stage reads (the others pass through)."""
        return tuple(c for c in (*self.required(), self.tools, self.kwargs_column) if c is not None)
