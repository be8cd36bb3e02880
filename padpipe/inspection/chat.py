"""``inspect`` on conversations: the rows ``.chat()`` makes of them, their trained tokens, reasoning rows, and what a
``max_length`` cuts.

Nothing here reads or renders on its own: the conversations are read as ``.chat()`` reads them (JSON columns as
written, so a tool call's arguments reach the template as the data has them) and rendered, tokenized and
labelled by the chat stage's own :class:`~padpipe.pipes.chat.ChatTokenizer`, untruncated (``on_error="skip"``
unless told: a conversation it refuses is counted by reason, as ``stats()`` would count it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from padpipe._progress import Progress
from padpipe.chat.labels import positions, row_sums
from padpipe.chat.outcome import Outcome
from padpipe.inspection.advice import num, round_up
from padpipe.pipeline import Pipeline
from padpipe.pipes.chat import ChatTokenizer
from padpipe.pipes.threads import OrderedMapper
from padpipe.readers.schema import require_columns
from padpipe.stats import PipelineStats
from padpipe.tokenizer.encoder import MODEL_MAX_LENGTH_LIMIT

MESSAGES = "messages"
"""The conversations' column ``inspect`` looks for when no text field is asked for."""


@dataclass(frozen=True)
class Chat:
    """The chat stage ``inspect`` runs: its pipeline (reading the conversations as ``.chat()`` does) and options."""

    pipe: Pipeline
    options: dict[str, Any]

    def model_limit(self) -> int | None:
        """The tokenizer's ``model_max_length`` (``None`` for ``transformers``' "no limit" placeholder)."""
        limit = self.options["template"].tokenizer.model_max_length
        return int(limit) if limit is not None and limit < MODEL_MAX_LENGTH_LIMIT else None


def chat_stage(
    pipe: Pipeline,
    tokenizer: Any,
    *,
    columns: list[str],
    messages: str | None,
    chat_template: str | None,
    chat_options: Mapping[str, Any] | None,
) -> Chat | None:
    """The chat stage for ``pipe``'s data, or ``None`` to inspect text: conversations when ``messages`` or
    ``chat_template`` is given, or the data has a ``messages`` column (``columns``: its columns, or ``[]`` when
    text fields were asked for)."""
    if messages is None and chat_template is None and MESSAGES not in columns:
        return None
    options = dict(chat_options or {})
    taken = {"messages", "chat_template", "max_length", "cache"} & set(options)
    if taken:
        raise ValueError(f"`chat_options` must not repeat inspect's own arguments, but sets {sorted(taken)!r}.")
    name = messages or MESSAGES
    try:
        chat = pipe.chat(tokenizer, messages=name, chat_template=chat_template, **{"on_error": "skip", **options})
    except TypeError as exc:  # not a tokenizer that renders a template: one line for the command, as a ValueError
        raise ValueError(
            f"the conversations (column {name!r}) are inspected as .chat() renders them: {str(exc).rstrip('.')}; "
            "or name a text column in `fields`."
        ) from exc
    return Chat(Pipeline(chat.source), chat.stages[-1].options)


@dataclass(frozen=True)
class ChatFigures:
    """What ``.chat()`` made of the conversations inspected (untruncated), and what ``max_length`` cuts of it.

    Attributes:
        messages: The conversations' column.
        conversations: Conversations that gave rows.
        rows: The rows they gave: one each, plus a row of its own per answer whose reasoning the whole
            conversation does not render (``reasoning="every_turn"``).
        reasoning_rows: Those rows of their own.
        tokens: Tokens of all rows.
        trained_tokens: Of them trained (labels other than -100).
        reasoning_tokens: Tokens of the reasoning rows.
        reasoning_trained: Trained tokens of the reasoning rows.
        max_length: The cut measured (``sft(seq_len=...)`` cuts every row to it).
        truncated_rows: Rows longer than ``max_length``.
        trained_cut: Trained tokens past ``max_length`` (never trained once cut).
        emptied_rows: Rows left with no trained token by the cut (``.chat()`` drops them).
        skipped: Conversations the stage refuses or drops, by reason (``chat.not_prefix``, ...).
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
              50 conversations -> 94 rows (44 rows of their own for reasoning: 30.0% of the tokens); 2 dropped (chat.not_prefix 2)
              trained tokens (labels other than -100): 12,000 of 30,000 (40.0%)
              longer than max_length 1024: 3 rows (3.2%), cutting 40 trained tokens (0.3%); 1 row left with nothing trained
        """  # noqa: E501
        reasoning = (
            f" ({self.reasoning_rows:,} rows of their own for reasoning: {_share(self.reasoning_tokens, self.tokens)} "
            "of the tokens)"
            if self.reasoning_rows
            else ""
        )
        skipped = ", ".join(f"{k} {v:,}" for k, v in sorted(self.skipped.items()))
        out = [
            f"conversations (column {self.messages}, rendered and labelled by .chat())",
            f"  {self.conversations:,} conversations -> {self.rows:,} rows{reasoning}"
            + (f"; {sum(self.skipped.values()):,} dropped ({skipped})" if skipped else ""),
            f"  trained tokens (labels other than -100): {self.trained_tokens:,} of {self.tokens:,} "
            f"({_share(self.trained_tokens, self.tokens)})",
        ]
        emptied = f"; {self.emptied_rows:,} row{'s' if self.emptied_rows != 1 else ''} left with nothing trained"
        out.append(
            f"  longer than max_length {self.max_length}: {self.truncated_rows:,} rows "
            f"({_share(self.truncated_rows, self.rows)}), cutting {self.trained_cut:,} trained tokens "
            f"({_share(self.trained_cut, self.trained_tokens)})" + (emptied if self.emptied_rows else "")
        )
        if self.unrendered:
            listed = ", ".join(f"the {what} of {n:,} messages" for what, n in sorted(self.unrendered.items()))
            out.append(f"  not rendered by the template (trained as rendered): {listed}")
        return out

    def advice(self, lengths: np.ndarray, pack: Any) -> list[str]:
        """Recommendations on conversations: a ``seq_len`` that fits them, the cost of reasoning rows, packing,
        drops. ``pack``: the pack strategy's result (``None``: none).

        Example:
            >>> figures = ChatFigures("messages", 50, 94, 44, 30_000, 12_000, 9_000, 2_000, 1024, 3, 40, 1)
            >>> figures.advice(np.array([300] * 90 + [1500] * 4), None)[1]  # doctest: +ELLIPSIS
            "reasoning: 44 of 94 rows are rows of their own for reasoning the whole conversation drops, ..."
        """
        p99, longest = float(np.percentile(lengths, 99)), round_up(int(lengths.max()), 8)
        fit = f"seq_len={round_up(p99, 8)} fits 99% of the rows whole (p99 is {num(p99)} tokens), {longest} all"
        if not self.truncated_rows:
            out = [f"every row fits max_length={self.max_length}; {fit}."]
        else:
            out = [
                f"max_length={self.max_length} (sft's seq_len) cuts {_share(self.truncated_rows, self.rows)} of the "
                f"rows and {_share(self.trained_cut, self.trained_tokens)} of the trained tokens"
                + (f", and drops {self.emptied_rows:,} rows left with nothing trained" if self.emptied_rows else "")
                + f"; {fit}."
            ]
        if self.reasoning_rows:
            out.append(
                f"reasoning: {self.reasoning_rows:,} of {self.rows:,} rows are rows of their own for reasoning the "
                f"whole conversation drops, {_share(self.reasoning_tokens, self.tokens)} of the tokens for "
                f"{_share(self.reasoning_trained, self.trained_tokens)} of the trained ones (each repeats its "
                "conversation's start); reasoning='as_rendered' saves them and leaves that reasoning untrained."
            )
        if pack is not None:
            out.append(
                f"packing: {pack.name} fills {pack.efficiency:.1%} of the token slots with conversations, "
                "as sft(mode='pack') packs them."
            )
        refused = {k: v for k, v in self.skipped.items() if k != "chat.no_trained_tokens"}  # (always a drop)
        if refused:
            listed = ", ".join(f"{k} {v:,}" for k, v in sorted(refused.items()))
            out.append(
                f".chat() refuses {sum(refused.values()):,} conversations ({listed}): under on_error='raise' (its "
                "default) the first stops training; on_error='skip' trains without them (counted)."
            )
        return out


def chat_lengths(
    records: Any,
    chat: Chat,
    stats: PipelineStats,
    *,
    max_length: int,
    num_threads: int,
    total: int | None,
    progress: bool | None,
) -> tuple[list[np.ndarray], list[np.ndarray], ChatFigures]:
    """The token length of every row ``.chat()`` makes of ``records`` untruncated, the lengths of those that
    ``.chat(max_length=max_length)`` yields (cut, and without the rows left with no trained token), and figures."""
    chat_fn = ChatTokenizer(chat.options["template"], chat.options["options"], stats=stats)

    def render(batch: Any) -> tuple[int, Outcome]:
        chat_fn.check(batch)
        outcome = chat_fn.outcome(batch)
        chat_fn.chunk(batch, outcome)  # counts as the stage counts
        return batch.num_rows, outcome

    parts: list[tuple[np.ndarray, ...]] = []  # per batch: lengths, trained and kept tokens, reasoning row or not
    node = OrderedMapper(records, render, num_threads=num_threads, stage="chat", settings={})
    with Progress("inspect: rendering conversations", total=total, enabled=progress) as bar:
        for conversations, out in node:
            kept = out.trained & (positions(out.offsets) < max_length)
            reasoning = np.diff(out.source, append=-1) == 0  # a conversation's rows end with the whole one
            parts.append((out.lengths, row_sums(out.offsets, out.trained), row_sums(out.offsets, kept), reasoning))
            bar.update(conversations)
    empty = (np.zeros(0, np.int64),) * 3 + (np.zeros(0, bool),)
    lengths, trained, kept, reasoning = [np.concatenate(c) for c in zip(*parts)] if parts else empty
    snap = stats.snapshot()
    counters = snap.counters
    figures = ChatFigures(
        messages=chat.options["options"].messages,
        conversations=counters.get("chat.conversations", 0),
        rows=counters.get("chat.rows", 0),
        reasoning_rows=counters.get("chat.reasoning_rows", 0),
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
    raw = [part[0] for part in parts]
    return raw, [np.minimum(part[0][part[2] > 0], max_length) for part in parts], figures


def check_columns(where: str, names: list[str], chat: Chat) -> tuple[str, ...]:
    """The columns the stage reads that the data has (conversations, tools, template arguments; the first a must)."""
    require_columns(where, names, chat.options["options"].required())
    return tuple(c for c in chat.options["options"].consumed() if c in names)


def _share(part: int, whole: int) -> str:
    return f"{part / whole:.1%}" if whole else "0.0%"
