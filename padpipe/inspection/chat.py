"""``inspect`` on conversations: read as ``.chat()`` reads them (JSON columns as written) and rendered, tokenized and
labelled by the chat stage's own :class:`~padpipe.pipes.chat.ChatTokenizer`, untruncated, with ``on_error="skip"``
unless told (a refused conversation is counted by reason, as ``stats()`` counts it)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from padpipe._progress import Progress
from padpipe.chat.labels import positions, row_sums
from padpipe.inspection.advice import num, round_up
from padpipe.pipeline import Pipeline
from padpipe.pipes.chat import ChatTokenizer
from padpipe.pipes.threads import OrderedMapper
from padpipe.readers.schema import require_columns
from padpipe.stats import PipelineStats

MESSAGES = "messages"
"""The conversations' column ``inspect`` looks for when no text field is asked for."""


def chat_stage(
    pipe: Pipeline,
    tokenizer: Any,
    *,
    columns: list[str],
    messages: str | None,
    chat_template: str | None,
    chat_options: Mapping[str, Any] | None,
) -> Pipeline | None:
    """``pipe.chat(...)`` (its source reads the conversations as written), or ``None`` to inspect text: conversations
    when ``messages`` or ``chat_template`` is given, or ``columns`` (the data's, or ``[]``) has ``messages``."""
    if messages is None and chat_template is None and MESSAGES not in columns:
        return None
    options = {"on_error": "skip", **(chat_options or {})}
    taken = {"messages", "chat_template", "max_length", "cache"} & set(options)
    if taken:
        raise ValueError(f"`chat_options` must not repeat inspect's own arguments, but sets {sorted(taken)!r}.")
    name = messages or MESSAGES
    try:
        return pipe.chat(tokenizer, messages=name, chat_template=chat_template, **options)
    except TypeError as exc:  # not a tokenizer that renders a template: one line for the command, as a ValueError
        raise ValueError(
            f"the conversations (column {name!r}) are inspected as .chat() renders them: {str(exc).rstrip('.')}; "
            "or name a text column in `fields`."
        ) from exc


def check_columns(where: str, names: list[str], chat: Pipeline) -> tuple[str, ...]:
    """The columns the stage reads that the data has (conversations, tools, template arguments; the first a must)."""
    settings = chat.stages[-1].options["options"]
    require_columns(where, names, settings.named())
    return tuple(c for c in settings.consumed() if c in names)


@dataclass(frozen=True)
class ChatFigures:
    """What ``.chat()`` made of the conversations inspected (untruncated), and what ``max_length`` cuts of it.

    Attributes:
        messages: The conversations' column.
        conversations: Conversations that gave rows.
        rows: Their rows: one each, and one per answer whose reasoning the conversation drops (``reasoning_rows``).
        tokens: Tokens of all rows; ``trained_tokens`` those trained; ``reasoning_*`` those of the reasoning rows.
        max_length: The cut measured (``sft(seq_len=...)`` cuts every row to it): ``truncated_rows`` are longer,
            ``trained_cut`` trained tokens lie past it, ``emptied_rows`` keep no trained token (dropped).
        skipped: Conversations the stage drops, by reason (``chat.not_prefix``, ...).
        unrendered: What the template does not render, by what (``{"reasoning": 12}``: messages).
    """

    messages: str
    conversations: int
    rows: int
    reasoning_rows: int
    tokens: int
    trained_tokens: int
    reasoning_tokens: int
    reasoning_trained: int
    max_length: int
    truncated_rows: int
    trained_cut: int
    emptied_rows: int
    skipped: dict[str, int] = field(default_factory=dict)
    unrendered: dict[str, int] = field(default_factory=dict)

    @property
    def read(self) -> int:
        """Conversations read: those that gave rows and those dropped."""
        return self.conversations + sum(self.skipped.values())

    def lines(self) -> list[str]:
        """The report's section on the conversations.

        Example:
            >>> figures = ChatFigures("messages", 50, 94, 44, 30_000, 12_000, 9_000, 2_000, 1024, 3, 40, 1,
            ...                       {"chat.not_prefix": 2})
            >>> print("\\n".join(figures.lines()))
            conversations (column messages, rendered and labelled by .chat())
              50 conversations -> 94 rows (44 rows of their own for reasoning: 30.0% of the tokens); dropped: chat.not_prefix 2
              trained tokens (labels other than -100): 12,000 of 30,000 (40.0%)
              longer than max_length 1024: 3 rows (3.2%), cutting 40 trained tokens (0.3%); 1 left with nothing trained
        """  # noqa: E501
        reasoning = f" ({self.reasoning_rows:,} rows of their own for reasoning: {_share(self.reasoning_tokens, self.tokens)} of the tokens)"  # noqa: E501
        dropped = ", ".join(f"{k} {v:,}" for k, v in sorted(self.skipped.items()))
        unrendered = ", ".join(f"the {what} of {n:,} messages" for what, n in sorted(self.unrendered.items()))
        return [
            f"conversations (column {self.messages}, rendered and labelled by .chat())",
            f"  {self.conversations:,} conversations -> {self.rows:,} rows{reasoning if self.reasoning_rows else ''}"
            + (f"; dropped: {dropped}" if dropped else ""),
            f"  trained tokens (labels other than -100): {self.trained_tokens:,} of {self.tokens:,} "
            f"({_share(self.trained_tokens, self.tokens)})",
            f"  longer than max_length {self.max_length}: {self.truncated_rows:,} rows "
            f"({_share(self.truncated_rows, self.rows)}), cutting {self.trained_cut:,} trained tokens "
            f"({_share(self.trained_cut, self.trained_tokens)})"
            + (f"; {self.emptied_rows:,} left with nothing trained" if self.emptied_rows else ""),
            *([f"  not rendered by the template (trained as rendered): {unrendered}"] if unrendered else []),
        ]

    def advice(self, lengths: np.ndarray) -> list[str]:
        """Recommendations on conversations: a ``seq_len`` that fits them, the cost of reasoning rows, refusals.

        Example:
            >>> figures = ChatFigures("messages", 50, 94, 44, 30_000, 12_000, 9_000, 2_000, 1024, 3, 40, 1)
            >>> figures.advice(np.array([300] * 90 + [1500] * 4))[0]
            "max_length=1024 (sft's seq_len) cuts 3.2% of the rows and 0.3% of the trained tokens, leaving 1 with nothing trained (dropped); seq_len=1504 fits 99% of the rows whole (p99 is 1,500 tokens), 1504 all."
        """  # noqa: E501
        p99, longest = float(np.percentile(lengths, 99)), round_up(int(lengths.max()), 8)
        fit = f"seq_len={round_up(p99, 8)} fits 99% of the rows whole (p99 is {num(p99)} tokens), {longest} all."
        out = [
            f"max_length={self.max_length} (sft's seq_len) cuts {_share(self.truncated_rows, self.rows)} of the rows "
            f"and {_share(self.trained_cut, self.trained_tokens)} of the trained tokens"
            + (f", leaving {self.emptied_rows:,} with nothing trained (dropped)" if self.emptied_rows else "")
            + f"; {fit}"
        ]
        if self.reasoning_rows:
            out.append(
                f"reasoning: {self.reasoning_rows:,} of {self.rows:,} rows are rows of their own for reasoning the "
                f"whole conversation drops, {_share(self.reasoning_tokens, self.tokens)} of the tokens for "
                f"{_share(self.reasoning_trained, self.trained_tokens)} of the trained ones (each repeats its "
                "conversation's start); reasoning='as_rendered' saves them and leaves that reasoning untrained."
            )
        refused = {k: v for k, v in sorted(self.skipped.items()) if k != "chat.no_trained_tokens"}  # (always a drop)
        if refused:
            out.append(
                f".chat() refuses {sum(refused.values()):,} conversations ({', '.join(f'{k} {v:,}' for k, v in refused.items())}): "  # noqa: E501
                "under on_error='raise' (its default) the first stops training; on_error='skip' trains without them."
            )
        return out


def chat_lengths(
    records: Any, chat: Pipeline, stats: PipelineStats, *, max_length: int, num_threads: int, **progress: Any
) -> tuple[list[np.ndarray], list[np.ndarray], ChatFigures]:
    """The token length of every row ``.chat()`` makes of ``records`` untruncated, those of the rows that
    ``.chat(max_length=max_length)`` yields (cut, and without the rows left with no trained token), and figures.
    ``progress``: ``total`` and ``enabled`` for the progress bar."""
    options = chat.stages[-1].options
    chat_fn = ChatTokenizer(options["template"], options["options"], stats=stats)

    def render(batch: Any) -> tuple[int, Any]:
        chat_fn.check(batch)
        outcome = chat_fn.outcome(batch)
        chat_fn.chunk(batch, outcome)  # counts as the stage counts
        return batch.num_rows, outcome

    parts: list[tuple[np.ndarray, ...]] = []  # per batch: lengths, trained and kept tokens, reasoning row or not
    with Progress("inspect: rendering conversations", **progress) as bar:
        for conversations, out in OrderedMapper(records, render, num_threads=num_threads, stage="chat", settings={}):
            kept = out.trained & (positions(out.offsets) < max_length)
            reasoning = np.diff(out.source, append=-1) == 0  # a conversation's rows end with the whole one
            parts.append((out.lengths, row_sums(out.offsets, out.trained), row_sums(out.offsets, kept), reasoning))
            bar.update(conversations)
    empty = (np.zeros(0, np.int64),) * 3 + (np.zeros(0, bool),)
    lengths, trained, kept, reasoning = [np.concatenate(c) for c in zip(*parts)] if parts else empty
    snap = stats.snapshot()
    counters = snap.counters
    count = {name: counters.get(f"chat.{name}", 0) for name in ("conversations", "rows", "reasoning_rows")}
    figures = ChatFigures(
        options["options"].messages,
        **count,
        tokens=int(lengths.sum()),
        trained_tokens=int(trained.sum()),
        reasoning_tokens=int(lengths[reasoning].sum()),
        reasoning_trained=int(trained[reasoning].sum()),
        max_length=max_length,
        truncated_rows=int((lengths > max_length).sum()),
        trained_cut=int((trained - kept).sum()),
        emptied_rows=int(((kept == 0) & (trained > 0)).sum()),
        skipped={k: v for k, v in snap.skipped.items() if k.startswith("chat.")},  # not the reader's
        unrendered={k.removeprefix("chat.dropped_"): v for k, v in counters.items() if k.startswith("chat.dropped_")},
    )
    return [p[0] for p in parts], [np.minimum(p[0][p[2] > 0], max_length) for p in parts], figures


def _share(part: int, whole: int) -> str:
    return f"{part / whole:.1%}" if whole else "0.0%"
