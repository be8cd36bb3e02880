"""The chat stage's options, each defined, documented and checked here once: ``.chat()`` builds them from its
keywords, ``.preference()`` from its ``chat_options``; checked before any tokenizer is loaded."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from padpipe.chat.conversation import REASONING
from padpipe.chat.labels import TRUNCATION
from padpipe.chat.spans import TRAIN_ON
from padpipe.chat.template import ChatTemplate
from padpipe.errors import one_of, positive

MISSING_COLUMN = (
    "expected one of the columns {} (messages= names the conversations' column; prompt= and completion= name a "
    "prompt's and its completion's)."
)
"""The end of the error for a conversation column that is not in the data (the stage's, and loader()'s check)."""
SPECIAL_TEXT = ("keep", "skip", "raise")


@dataclass(frozen=True)
class ChatOptions:
    """What the chat stage reads and how it labels: the options of :meth:`padpipe.Pipeline.chat`.

    Attributes:
        messages: The column of conversations: lists of messages (``role``; ``content`` as text or a list of
            parts; an answer may hold ``tool_calls`` and no content), as structs or as JSON text. A message's
            ``None`` values are dropped, as ``apply_chat_template`` does.
        prompt: With ``completion``, the columns of a prompt and its completion: two lists of messages (rendered
            as one conversation; the completion is trained: what follows the prompt's generation prompt, through
            its last end-of-turn token), or two strings (tokenized as ``tokenizer(prompt + completion +
            eos_token)``, as TRL does: the completion and the EOS are trained). ``train_on="all"`` trains the
            prompt too.
        completion: See ``prompt``.
        train_on: ``"assistant"``: every answer; ``"last"``: the last answer; ``"all"``: every token.
        training_field: The message key whose ``True``/``False`` turns training on or off for that message
            whatever ``train_on`` says (axolotl's ``training``); ``None``: none. A message of another role turned
            on trains its whole turn, header included. Any other value than ``true``, ``false`` or null
            (``"false"``, ``0``) refuses the row (``chat.bad_messages``).
        max_length: Keep a longer conversation's first ``max_length`` tokens (ids a prefix of the whole
            conversation's, labels of that prefix).
        truncation: ``"keep_start"`` (TRL's), or ``"turns"``: cut a longer conversation after its last trained
            span that fits whole (nothing of a cut answer is trained).
        tools: The column of tool schemas (a list of JSON objects or their JSON text), passed to the template
            when the data has it.
        kwargs_column: The column of per-row template arguments (a struct or JSON object), used when the data
            has it; its values win over ``template_kwargs``.
        template_kwargs: Template arguments for every row (``{"enable_thinking": False}``).
        on_error: ``"raise"`` a ``DataError`` naming the file and row of a conversation that cannot be rendered
            or labelled, or ``"skip"`` it, counted by reason.
        reasoning: ``"every_turn"``: reasoning the whole conversation drops is trained in rows of their own;
            ``"as_rendered"``: one row per conversation, the whole rendering.
        special_text: A message whose text holds a special token's text (``<|im_end|>`` written in an answer:
            the tokenizer reads it as the token, a turn boundary inside a message): ``"keep"`` it as the
            tokenizer reads it (counted as ``chat.special_text``), ``"skip"`` the conversation (counted) or
            ``"raise"`` a ``DataError`` naming the row.

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

    @classmethod
    def of(cls, values: Mapping[str, Any]) -> ChatOptions:
        """The options among ``values`` (a call's keywords: the others are left out; ``None`` template arguments
        are none).

        Example:
            >>> ChatOptions.of({"train_on": "last", "template_kwargs": None, "num_threads": 2}).train_on
            'last'
        """
        given = {f.name: values[f.name] for f in dataclasses.fields(cls) if f.name in values}
        if given.get("template_kwargs", {}) is None:
            given["template_kwargs"] = {}
        return cls(**given)

    def template(self, tokenizer: Any, chat_template: str | None) -> ChatTemplate:
        """The chat template these options render with (``ValueError`` when there is none, or for plain-text
        prompt/completion rows a tokenizer without EOS).

        Example:
            >>> ChatOptions().template(pp.examples.hf_tokenizer(), None)
            Traceback (most recent call last):
            ...
            ValueError: chat() needs a chat template, but the tokenizer (BertTokenizer) has none and no `chat_template=` was given: pass chat_template= a Jinja template string.
        """  # noqa: E501
        template = ChatTemplate(tokenizer, chat_template, required=self.prompt is None)
        if self.prompt is not None and template.tokenizer.eos_token is None:
            raise ValueError(
                "prompt/completion rows of plain text get the tokenizer's EOS token after the completion "
                "(as TRL appends it), but this tokenizer has none: set tokenizer.eos_token."
            )
        return template

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
