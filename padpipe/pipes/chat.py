"""The chat stage's work: one Arrow record batch of conversations in, one :class:`TokenChunk` with labels out.

:class:`ChatTokenizer` is a plain callable; ``padpipe._build.chat`` runs it in an
:class:`~padpipe.pipes.threads.OrderedMapper` of threads, as ``tokenize``, so it keeps no state between
calls and resume is the upstream reader's position. Per conversation it renders the template (Python,
unavoidable) and finds the trained spans (padpipe.chat.spans); the chunk's texts are tokenized in one
Rust batch call, and labels, truncation and dropping are vectorized.

A call is two steps: :meth:`ChatTokenizer.outcome` (what each conversation becomes: token rows, trained
tokens, the counters it adds) and :meth:`ChatTokenizer.chunk` (the token chunk, labels and counting).
With ``.chat(cache=...)`` the cache stores each conversation's outcome and gives it back on later epochs,
and ``chunk`` builds the same chunk and counters from it (:mod:`padpipe.token_cache.chat_fill`).
"""

from __future__ import annotations

import json
import threading
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from padpipe.chat import rows as read
from padpipe.chat.conversation import conversation_rows
from padpipe.chat.encode import SpanEncoder, Tokens
from padpipe.chat.labels import IGNORE, cut, row_sums
from padpipe.chat.options import MISSING_COLUMN, ChatOptions
from padpipe.chat.outcome import SKIP, Outcome
from padpipe.chat.rows import CHECK, NOT_PREFIX, SPECIAL, TEMPLATE, RowProblem
from padpipe.chat.spans import chosen, completion_span, message_spans
from padpipe.chat.template import ChatTemplate
from padpipe.chunks import TokenChunk
from padpipe.errors import DataError, positive
from padpipe.readers.schema import row_of
from padpipe.stats import PipelineStats
from padpipe.tokenizer.rows import LABELS, ROW_ID_COLUMNS, row_origin

NO_TRAINED = "no_trained_tokens"
DROPPED = "chat.dropped_"
_SAID_LOCK = threading.Lock()
HINTS = {
    NOT_PREFIX: "the conversation is not well-formed for this template, or the template renders the turns in a way "
    "padpipe cannot align: pass chat_template= one with {% generation %} markers, or on_error='skip' to drop such "
    "rows",
    CHECK: "pass chat_template= one with {% generation %} markers, or on_error='skip' to drop such rows",
    SPECIAL: "special_text='keep' trains it as the tokenizer reads it (counted), 'skip' drops such rows",
}


def chat_options(tokenizer: Any, *, chat_template: str | None, num_threads: int, **options: Any) -> dict[str, Any]:
    """Check the chat stage's settings, load the tokenizer and its template, and return the stage's options.

    Cheap checks come first, so a bad argument fails before any tokenizer is loaded.

    Example:
        >>> chat_options(pp.examples.hf_tokenizer(), chat_template=None, num_threads=2)
        Traceback (most recent call last):
        ...
        ValueError: chat() needs a chat template, but the tokenizer (BertTokenizer) has none and no `chat_template=` was given: pass chat_template= a Jinja template string.
    """  # noqa: E501
    positive("num_threads", num_threads)
    settings = ChatOptions(**options)
    template = ChatTemplate(tokenizer, chat_template, required=settings.prompt is None)
    if settings.prompt is not None and template.tokenizer.eos_token is None:
        raise ValueError(
            "prompt/completion rows of plain text get the tokenizer's EOS token after the completion "
            "(as TRL appends it), but this tokenizer has none: set tokenizer.eos_token."
        )
    return {"template": template, "options": settings, "num_threads": num_threads}


@dataclass(frozen=True)
class Plan:
    """A conversation's text and its character spans: trained, or (``invert``) the only ones not trained."""

    text: str
    spans: list[tuple[int, int]]
    invert: bool = False
    plain: bool = False  # plain prompt/completion text, tokenized with the tokenizer's special tokens
    kind: str | None = None  # a row besides the conversation's own: its counter (chat.reasoning_rows, ...)


class ChatTokenizer:
    """Render each row's conversation with the chat template, tokenize it, and label its trained spans.

    Args:
        template: The :class:`~padpipe.chat.template.ChatTemplate` to render with.
        options: What to read and how to label.
        stats: Counters to report into (``chat`` time; ``chat.conversations``, ``chat.rows``, ``chat.tokens``,
            ``chat.trained_tokens``, ``chat.truncated``; skips ``chat.<reason>``); default: new.

    Example:
        >>> tok = pp.examples.hf_tokenizer()
        >>> template = ChatTemplate(tok, "{% for m in messages %}{{ m.role }}: {{ m.content }} [SEP]{% endfor %}"
        ...                             "{% if add_generation_prompt %}assistant:{% endif %}")
        >>> fn = ChatTokenizer(template, ChatOptions())
        >>> chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
        >>> chunk = fn(pa.RecordBatch.from_pylist([{"messages": chat, "id": 7}]))
        >>> tok.convert_ids_to_tokens(chunk.row(0))
        ['user', ':', 'h', '##i', '[SEP]', 'ass', '##ist', '##ant', ':', 'hello', '[SEP]']
        >>> chunk.columns["labels"][0].as_py(), chunk.columns["id"].to_pylist()
        ([-100, -100, -100, -100, -100, -100, -100, -100, -100, 5668, 3], [7])
    """  # noqa: E501

    def __init__(self, template: ChatTemplate, options: ChatOptions, stats: PipelineStats | None = None) -> None:
        if not isinstance(template, ChatTemplate):
            raise TypeError(f"`template` must be a ChatTemplate, but is {type(template).__name__} instead.")
        self.template, self.options = template, options
        self.encoder = SpanEncoder(template.tokenizer)
        self.stats = stats if stats is not None else PipelineStats()
        self._said: set[str] = set()

    def __call__(self, batch: pa.RecordBatch) -> TokenChunk:
        """Turn one record batch into token rows with labels (thread-safe: no state is kept between calls)."""
        with self.stats.timer("chat"):
            self.check(batch)
            return self.chunk(batch, self.outcome(batch))

    def check(self, batch: pa.RecordBatch) -> None:
        """Raise ``TypeError``/``DataError`` for a batch the stage cannot read at all (not one of its rows)."""
        if not isinstance(batch, pa.RecordBatch):
            raise TypeError(f"chat expects a pyarrow.RecordBatch, but got {type(batch).__name__} instead.")
        self._check_columns(batch)

    def outcome(self, batch: pa.RecordBatch, todo: np.ndarray | None = None) -> Outcome:
        """What the rows of ``batch`` (those ``todo`` marks, default all) become: token rows, trained tokens and
        counters per row; raises ``DataError`` for a row its policy refuses. Nothing is counted yet (:meth:`chunk`).

        Example:
            >>> template = ChatTemplate(pp.examples.hf_tokenizer(), "{% for m in messages %}{{ m.role }}: "
            ...     "{{ m.content }} [SEP]{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}")
            >>> fn = ChatTokenizer(template, ChatOptions(on_error="skip"))
            >>> chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
            >>> batch = pa.RecordBatch.from_pylist([{"messages": None}, {"messages": chat}, {"messages": chat}])
            >>> out = fn.outcome(batch, todo=np.array([True, True, False]))
            >>> out.source.tolist(), out.lengths.tolist(), out.counts
            ([1], [11], [(0, 'skip.chat.bad_messages', 1)])
        """
        values = self._rows(batch)
        if todo is not None:
            values = [value if wanted else None for value, wanted in zip(values, todo)]
        rendered = self._render_shared(values)
        counts: list[tuple[int, str, int]] = []
        plans = [
            None if value is None else _or_problem(self._plan, value, rendered.get(i), _Counts(i, counts))
            for i, value in enumerate(values)
        ]
        for i, plan in enumerate(plans):
            if isinstance(plan, RowProblem):
                policy = self.options.special_text if plan.reason == SPECIAL else self.options.on_error
                if policy == "raise":
                    raise DataError(self._message(batch, i, plan))
                counts.append((i, f"{SKIP}chat.{plan.reason}", 1))
        counts += [(i, f"{SKIP}chat.{NO_TRAINED}", 1) for i, plan in enumerate(plans) if plan == []]
        good = np.array([i for i, plan in enumerate(plans) if isinstance(plan, list) for _ in plan], dtype=np.int64)
        kinds = [row.kind for plan in plans if isinstance(plan, list) for row in plan]
        tokens, trained = self._encode([row for plan in plans if isinstance(plan, list) for row in plan])
        lengths, kept = cut(tokens.offsets, trained, self.options.max_length, self.options.truncation)
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        ids, trained = tokens.ids[kept], trained[kept]
        sums = row_sums(offsets, trained)
        counts += [(int(i), "chat.truncated", 1) for i in good[(lengths < np.diff(tokens.offsets)) & (sums > 0)]]
        counts += [(int(i), f"{SKIP}chat.{NO_TRAINED}", 1) for i in good[sums == 0]]
        counts += [(int(i), f"chat.{kind}", 1) for i, kind, n in zip(good, kinds, sums) if kind and n]  # rows given
        if (sums == 0).any():
            keep = np.repeat(sums > 0, lengths)
            ids, trained, lengths = ids[keep], trained[keep], lengths[sums > 0]
            offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
            np.cumsum(lengths, out=offsets[1:])
        return Outcome(good[sums > 0], ids, offsets, trained, counts)

    def chunk(self, batch: pa.RecordBatch, outcome: Outcome) -> TokenChunk:
        """The token chunk of ``batch``'s outcome (its other columns passed through, labels), counters counted."""
        ids, offsets, trained = outcome.ids, outcome.offsets, outcome.trained
        columns = self._pass_through(batch, outcome.source, dropped=len(outcome.source) < batch.num_rows)
        labels = np.where(trained, ids.astype(np.int64), IGNORE)
        columns[LABELS] = pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(labels))
        chunk = TokenChunk(ids, offsets, None, columns)
        for name, n in outcome.totals().items():
            if name.startswith(SKIP):
                self.stats.record_skip(name[len(SKIP) :], n)
            elif name.startswith(DROPPED):
                self._dropped(name[len(DROPPED) :], n)
            else:
                self.stats.add(name, n)
        self.stats.add("chat.conversations", len(np.unique(outcome.source)))  # those giving rows: 1, or more
        self.stats.add("chat.rows", chunk.num_rows)
        self.stats.add("chat.tokens", chunk.num_tokens)
        self.stats.add("chat.trained_tokens", int(trained.sum()))
        return chunk

    def _rows(self, batch: pa.RecordBatch) -> list[Any]:
        """Per row: ``(conversation or (prompt, completion), tools, kwargs)``, or a RowProblem."""
        o = self.options
        names = batch.schema.names
        missing = [name for name in o.required() if name not in names]
        if missing:  # under on_error="skip" (else refused by _check_columns): every row lacks it
            return [RowProblem(read.BAD, f"{missing[0]!r} is missing")] * batch.num_rows
        if o.prompt is not None:
            assert o.completion is not None
            values = read.read_prompt_completion(
                batch.column(o.prompt), batch.column(o.completion), (o.prompt, o.completion)
            )
        else:
            values = read.read_messages(batch.column(o.messages), o.messages)
        tools = read.read_tools(batch.column(o.tools) if o.tools in names else None, str(o.tools)) or [None] * len(
            values
        )
        kwargs = read.read_kwargs(
            batch.column(o.kwargs_column) if o.kwargs_column in names else None, str(o.kwargs_column)
        )
        kwargs = kwargs or [{}] * len(values)
        return [next((v for v in row if isinstance(v, RowProblem)), row) for row in zip(values, tools, kwargs)]

    def _render_shared(self, rows: list[Any]) -> dict[int, tuple[str, list[tuple[int, int]] | None]]:
        """The conversations without tools or template arguments of their own, rendered in one call."""
        shared = [
            i
            for i, row in enumerate(rows)
            if row is not None
            and not isinstance(row, RowProblem)
            and isinstance(row[0], list)
            and row[1] is None
            and not row[2]
        ]
        if len(shared) < 2:
            return {}
        try:
            texts, blocks = self.template.render(
                [rows[i][0] for i in shared], kwargs=self.options.template_kwargs, markers=self.template.marked()
            )
        except Exception:  # a conversation the template refuses: each row renders alone and names its own error
            return {}
        return {i: (text, None if blocks is None else blocks[j]) for j, (i, text) in enumerate(zip(shared, texts))}

    def _plan(
        self,
        row: tuple[Any, list | None, dict[str, Any]],
        rendered: tuple[str, Any] | None = None,
        count: _Counts | None = None,
    ) -> list[Plan]:
        """The rows the conversation becomes: texts and spans (``rendered``: its text and markers, when rendered
        already); ``[]`` when nothing in it is trained (it is dropped, counted). What it adds to the counters goes
        to ``count`` (default: nowhere)."""
        count = count if count is not None else _Counts(-1, [])
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
        """Count (or refuse) a conversation whose text holds a special token's text, which the tokenizer reads as
        that token: a turn boundary faked inside a message (its content, reasoning or tool calls) or a tool."""
        found = None
        for k, message in enumerate(messages):
            for key in ("content", "reasoning_content", "tool_calls"):
                value = message.get(key)
                text = (
                    value if isinstance(value, str) else "" if value is None else json.dumps(value, ensure_ascii=False)
                )
                if (match := self.template.special_tokens.search(text)) is not None:
                    found = f"message {k}'s {key} holds {match.group()!r}"
                    break
            if found:
                break
        if found is None and tools and (match := self.template.special_tokens.search(json.dumps(tools))):
            found = f"its tools hold {match.group()!r}"
        if found is None:
            return
        if self.options.special_text == "keep":
            count(f"chat.{SPECIAL}", 1)
            return
        raise RowProblem(
            SPECIAL,
            f"{found}, a special token's text, which the tokenizer reads as that token (a turn boundary inside a "
            "message)",
        )

    def _dropped(self, what: str, n: int) -> None:
        """Count what the template did not render of the conversations (trained as rendered), said once."""
        key = f"{DROPPED}{what}"
        self.stats.add(key, n)
        with _SAID_LOCK:
            if key in self._said:
                return
            self._said.add(key)
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

    def _encode(self, plans: list[Plan]) -> tuple[Tokens, np.ndarray]:
        texts = [plan.text for plan in plans]
        tokens = self.encoder.encode_plain(texts) if plans and plans[0].plain else self.encoder.encode(texts)
        spans = [(i, lo, hi) for i, plan in enumerate(plans) for lo, hi in plan.spans]
        rows, lo, hi = (np.array(v, dtype=np.int64) for v in zip(*spans)) if spans else (np.zeros(0, np.int64),) * 3
        inside = SpanEncoder.mask(tokens, rows, lo, hi)
        invert = np.repeat(np.array([plan.invert for plan in plans], dtype=bool), np.diff(tokens.offsets))
        return tokens, inside != invert

    def _check_columns(self, batch: pa.RecordBatch) -> None:
        names = batch.schema.names
        for name in self.options.named():
            if name not in names and (self.options.on_error == "raise" or name not in self.options.required()):
                missing = MISSING_COLUMN.format(names)
                raise DataError(f"chat: column {name!r} is not in the data{row_origin(batch)}; {missing}")
        if LABELS in names:
            raise DataError(
                f"chat: the data{row_origin(batch)} has a column {LABELS!r}, which the token-level labels of .chat() "
                "would replace; drop or rename it."
            )

    def _pass_through(self, batch: pa.RecordBatch, rows: np.ndarray, *, dropped: bool) -> dict[str, pa.Array]:
        """The other columns of the rows kept; where rows were dropped, without a column only they had values in
        (a field of a skipped row that is no conversation: pad() would refuse its nulls)."""
        consumed = self.options.consumed()
        taken = pa.array(rows, type=pa.int64())
        columns = {
            name: batch.column(i).take(taken) for i, name in enumerate(batch.schema.names) if name not in consumed
        }
        if dropped:
            columns = {name: c for name, c in columns.items() if not len(c) or c.null_count < len(c)}
        return columns

    def _message(self, batch: pa.RecordBatch, row: int, problem: RowProblem) -> str:
        name = next((c for c in ROW_ID_COLUMNS if c in batch.schema.names), None)
        row_id = f"{name}={batch.column(name)[row].as_py()!r}" if name else ""
        in_file = row_of(batch, row)
        if in_file:
            where = f"{in_file} ({row_id + '; ' if row_id else ''}row {row} of the chunk)"
        else:
            where = f"row {row} of the chunk" + (f" ({row_id})" if row_id else "") + row_origin(batch)
        hint = HINTS.get(problem.reason, "pass on_error='skip' to drop such rows")
        return f"chat: {where}: {problem}; {hint} (counted as chat.{problem.reason})."

    def __repr__(self) -> str:
        return f"ChatTokenizer({self.template!r}, {self.options!r})"


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
    into: list[tuple[int, str, int]]

    def __call__(self, name: str, n: int) -> None:
        self.into.append((self.row, name, n))


def _or_problem(plan: Any, row: Any, *more: Any) -> Any:
    if isinstance(row, RowProblem):
        return row
    try:
        return plan(row, *more)
    except RowProblem as problem:
        return problem
