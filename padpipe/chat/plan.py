"""What each conversation of a batch becomes before it is tokenized: the rows read from the columns, rendered by the
template, and planned as texts with the character spans trained in them (:class:`Planner`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from padpipe.chat import rows as read
from padpipe.chat.conversation import conversation_rows
from padpipe.chat.options import ChatOptions
from padpipe.chat.problems import special_text
from padpipe.chat.rows import SPECIAL, TEMPLATE, RowProblem
from padpipe.chat.spans import chosen, completion_span, message_spans
from padpipe.chat.template import ChatTemplate

DROPPED = "chat.dropped_"
"""The prefix of the counters of what a template did not render (``chat.dropped_reasoning``, ...)."""
Counts = list[tuple[int, str, int]]
"""``(batch row, counter, n)``: what the rows of a batch add to the counters."""


@dataclass(frozen=True)
class Plan:
    """A conversation's text and its character spans: trained, or (``invert``) the only ones not trained."""

    text: str
    spans: list[tuple[int, int]]
    invert: bool = False
    plain: bool = False  # plain prompt/completion text, tokenized with the tokenizer's special tokens
    kind: str | None = None  # a row besides the conversation's own: its counter (chat.reasoning_rows, ...)


class Planner:
    """Plan the rows of a batch of conversations with ``template`` under ``options`` (thread-safe, no state).

    Example:
        >>> template = ChatTemplate(pp.examples.hf_tokenizer(), "{% for m in messages %}{{ m.role }}: "
        ...     "{{ m.content }} [SEP]{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}")
        >>> planner = Planner(template, ChatOptions())
        >>> chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
        >>> plans, counts = planner.plans(planner.rows(pa.RecordBatch.from_pylist([{"messages": chat}])))
        >>> [(p.text, p.spans) for p in plans[0]], counts
        ([('user: hi [SEP]assistant: hello [SEP]', [(24, 36)])], [])
    """

    def __init__(self, template: ChatTemplate, options: ChatOptions) -> None:
        self.template, self.options = template, options

    def rows(self, batch: pa.RecordBatch) -> list[Any]:
        """Per row: ``(conversation or (prompt, completion), tools, kwargs)``, or a RowProblem."""
        o, names = self.options, batch.schema.names
        missing = [name for name in o.required() if name not in names]
        if missing:  # under on_error="skip" (else refused by the batch check): every row lacks it
            return [RowProblem(read.BAD, f"{missing[0]!r} is missing")] * batch.num_rows
        if o.prompt is not None and o.completion is not None:
            values = read.read_prompt_completion(
                batch.column(o.prompt), batch.column(o.completion), (o.prompt, o.completion)
            )
        else:
            values = read.read_messages(batch.column(o.messages), o.messages)
        tools = read.read_tools(batch.column(o.tools) if o.tools in names else None, str(o.tools))
        kwargs_column = batch.column(o.kwargs_column) if o.kwargs_column in names else None
        kwargs = read.read_kwargs(kwargs_column, str(o.kwargs_column))
        rows = zip(values, tools or [None] * len(values), kwargs or [{}] * len(values))
        return [next((v for v in row if isinstance(v, RowProblem)), row) for row in rows]

    def plans(self, rows: list[Any]) -> tuple[list[Any], Counts]:
        """Per row (``None`` rows left out): its :class:`Plan` s (``[]`` when nothing in it is trained), or the
        RowProblem that refuses it; and what the rows add to the counters."""
        rendered = self._render_shared(rows)
        counts: Counts = []
        plans = [
            None if row is None else read.or_problem(self._plan, row, rendered.get(i), _Counts(i, counts))
            for i, row in enumerate(rows)
        ]
        return plans, counts

    def _render_shared(self, rows: list[Any]) -> dict[int, tuple[str, list[tuple[int, int]] | None]]:
        """The conversations without tools or template arguments of their own, rendered in one call."""
        conversations = [i for i, row in enumerate(rows) if isinstance(row, tuple) and isinstance(row[0], list)]
        shared = [i for i in conversations if rows[i][1] is None and not rows[i][2]]
        if len(shared) < 2:
            return {}
        try:
            texts, blocks = self.template.render(
                [rows[i][0] for i in shared], kwargs=self.options.template_kwargs, markers=self.template.marked()
            )
        except Exception:  # a conversation the template refuses: each row renders alone and names its own error
            return {}
        return {i: (text, None if blocks is None else blocks[j]) for j, (i, text) in enumerate(zip(shared, texts))}

    def _plan(self, row: tuple[Any, list | None, dict[str, Any]], rendered: Any, count: _Counts) -> list[Plan]:
        """The rows the conversation becomes (``rendered``: its text and markers, when rendered already)."""
        value, tools, row_kwargs = row
        kwargs, o = {**self.options.template_kwargs, **row_kwargs}, self.options
        invert = o.train_on == "all"
        if isinstance(value, tuple) and isinstance(value[0], str):  # plain text: the EOS ends the completion
            prompt, completion = value
            eos = self.template.tokenizer.eos_token
            text = prompt + completion + ("" if completion.endswith(eos) else eos)
            return [Plan(text, [] if invert else [(len(prompt), len(text))], invert, plain=True)]
        if isinstance(value, tuple):
            self._check_special(value[0] + value[1], tools, count)
            full = _render(self.template, value[0] + value[1], tools, kwargs, False)[0]
            span = completion_span(self.template, value[0], value[1], full, tools, kwargs)
            return [Plan(full, [] if invert else [span], invert)]
        self._check_special(value, tools, count)
        trained, untrained = chosen(value, o.train_on, o.training_field)
        if not invert and not trained:
            return []
        marked = self.template.marked(tools is not None)
        full, blocks = rendered if rendered is not None else _render(self.template, value, tools, kwargs, marked)
        if invert:
            spans = message_spans(self.template, value, untrained, full=full, blocks=blocks, tools=tools, kwargs=kwargs)
            return [Plan(full, spans, invert)]

        def spans_in(messages: list[dict[str, Any]], indices: Any, text: str, marks: Any) -> list[tuple[int, int]]:
            return message_spans(self.template, messages, indices, full=text, blocks=marks, tools=tools, kwargs=kwargs)

        rows = conversation_rows(
            value,
            trained,
            full=full,
            blocks=blocks,
            spans=spans_in,
            render=lambda messages: _render(self.template, messages, tools, kwargs, marked),
            reasoning=o.reasoning,
        )
        for what, n in rows.dropped.items():
            count(f"{DROPPED}{what}", n)
        return [Plan(text, spans, kind=kind) for (text, spans), kind in zip(rows.texts, rows.kinds)]

    def _check_special(self, messages: list[dict[str, Any]], tools: list | None, count: _Counts) -> None:
        """Count (or refuse, by ``special_text``) a conversation whose text holds a special token's text."""
        found = special_text(self.template.special_tokens, messages, tools)
        if found is None:
            return
        if self.options.special_text == "keep":
            count(f"chat.{SPECIAL}", 1)
            return
        why = "a special token's text, which the tokenizer reads as that token (a turn boundary inside a message)"
        raise RowProblem(SPECIAL, f"{found}, {why}")


def _render(
    template: ChatTemplate, messages: list[dict[str, Any]], tools: list | None, kwargs: dict[str, Any], marked: bool
) -> tuple[str, list[tuple[int, int]] | None]:
    try:
        texts, blocks = template.render([messages], tools=tools, kwargs=kwargs, markers=marked)
    except Exception as exc:  # a template is user code: anything may come out of it
        raise RowProblem(TEMPLATE, f"the chat template raised {type(exc).__name__}: {exc}") from exc
    return texts[0], blocks[0] if blocks is not None else None


@dataclass(frozen=True)
class _Counts:
    """Counters one batch row adds, kept as ``(row, counter, n)`` in a list the batch's outcome gets."""

    row: int
    into: Counts

    def __call__(self, name: str, n: int) -> None:
        self.into.append((self.row, name, n))
