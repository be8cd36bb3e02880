"""The preference stage's work: rows of preference data in, one token row per pair (or per labelled completion) out.

Each member, ``prompt + [completion]``, is encoded by :meth:`padpipe.pipes.chat.ChatTokenizer.outcome`; a pair
becomes one token row that every later stage carries as one unit (:mod:`padpipe.pipes.pairs`, docs/preference.md).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from padpipe.chat.labels import IGNORE, positions
from padpipe.chat.options import ChatOptions
from padpipe.chat.outcome import SKIP, Outcome
from padpipe.chat.pairs import CHOSEN_COLUMN, COMPLETION, LABEL, PROMPT, REJECTED, read_members
from padpipe.chat.rows import RowProblem, read_kwargs, read_tools
from padpipe.chat.template import ChatTemplate
from padpipe.chunks import TokenChunk, exclusive_cumsum
from padpipe.errors import DataError, positive
from padpipe.pipes.chat import ChatTokenizer
from padpipe.pipes.pairs import CHOSEN
from padpipe.stats import PipelineStats
from padpipe.tokenizer.rows import LABELS, ROW_ID_COLUMNS, row_place

SHARED = {"tools", "kwargs_column", "template_kwargs", "on_error", "special_text"}  # what chat_options= may set
TOO_LONG = "too_long"


@dataclass(frozen=True)
class PreferenceOptions:
    """How the stage reads and cuts (see ``Pipeline.preference``)."""

    conversation: ChatOptions  # the .chat() options a member's conversation is encoded with
    plain: ChatOptions  # those of plain prompt/completion text
    max_length: int | None = None
    unpaired: bool = False

    def settings(self) -> dict[str, Any]:
        """What must match on resume."""
        return {**self.conversation.settings(), "max_length": self.max_length, "unpaired": self.unpaired}

    def consumed(self) -> tuple[str, ...]:
        """The columns the stage reads (the others pass through)."""
        shared = tuple(c for c in (self.conversation.tools, self.conversation.kwargs_column) if c is not None)
        return (PROMPT, COMPLETION) + shared if self.unpaired else (PROMPT, CHOSEN_COLUMN, REJECTED) + shared


class PreferenceTokenizer:
    """Encode each row's pair (or labelled completion) with the chat template and cut it to ``max_length``.

    Truncation, named ``prompt_start``: a member longer than ``max_length`` loses the start of its prompt, the same
    tokens from both members of a pair, as few as make the longer member fit, so the last turn and both completions
    stay whole (``preference.prompt_cut``); a pair whose completions do not fit with one token of prompt before them
    is skipped (``preference.too_long``).

    Args:
        template: The :class:`~padpipe.chat.template.ChatTemplate` to render with.
        options: What to read and how to cut.
        stats: Counters to report into (``preference`` time; counters ``preference.*``).

    Example:
        >>> options = preference_options(pp.examples.chat_tokenizer())
        >>> fn = PreferenceTokenizer(options["template"], options["options"])
        >>> row = {"prompt": [{"role": "user", "content": "2+2?"}], "chosen": [{"role": "assistant", "content": "4"}],
        ...        "rejected": [{"role": "assistant", "content": "5"}]}
        >>> chunk = fn(pa.RecordBatch.from_pylist([row]))
        >>> tok = pp.examples.chat_tokenizer(); ids, labels = chunk.row(0), chunk.columns["labels"][0].as_py()
        >>> n = chunk.columns["chosen_tokens"][0].as_py()
        >>> tok.decode(ids[:n]), tok.decode([t for t, label in zip(ids[n:], labels[n:]) if label != -100])
        ('<|im_start|>user\\n2+2?<|im_end|>\\n<|im_start|>assistant\\n4<|im_end|>\\n', '5<|im_end|>\\n')
    """  # noqa: E501

    def __init__(self, template: ChatTemplate, options: PreferenceOptions, stats: PipelineStats | None = None) -> None:
        self.options = options
        self.stats = stats if stats is not None else PipelineStats()
        self.template = template
        self.chat = ChatTokenizer(template, options.conversation, self.stats)
        self.plain = ChatTokenizer(template, options.plain, self.stats)

    def __call__(self, batch: pa.RecordBatch) -> TokenChunk:
        """One token row per kept pair (thread-safe: no state is kept between calls)."""
        with self.stats.timer("preference"):
            members = (COMPLETION,) if self.options.unpaired else (CHOSEN_COLUMN, REJECTED)
            values = self._read(batch)
            outcomes = [self._encode(batch, values, k, name) for k, name in enumerate(members)]
            return self._rows(batch, values, outcomes)

    def _read(self, batch: pa.RecordBatch) -> list[Any]:
        """Per row: ``(prompt, completion)`` per member, or a RowProblem (raised under ``on_error="raise"``)."""
        written = {LABELS, CHOSEN} & set(batch.schema.names)
        if written:
            raise DataError(f"preference: the data has a column {sorted(written)[0]!r}, which the stage writes.")
        values = read_members(batch, unpaired=self.options.unpaired)
        if self.options.conversation.on_error == "raise":
            for i, value in enumerate(values):
                if isinstance(value, RowProblem):
                    hint = "pass on_error='skip' to drop such rows"
                    raise DataError(f"preference: {row_place(batch, i)}: {value}; {hint}.")
        return values

    def _encode(self, batch: pa.RecordBatch, values: list[Any], k: int, member: str) -> Outcome:
        """Member ``k`` of every row encoded by ``.chat()``: conversations, and plain text rows."""
        pairs = [v[k] if isinstance(v, tuple) else (None, None) for v in values]  # (prompt, completion)
        plain = [isinstance(prompt, str) for prompt, _ in pairs]
        conversations = [json.dumps(p + c) if isinstance(p, list) else None for p, c in pairs]
        columns = {
            "messages": pa.array(conversations, pa.string()),
            PROMPT: pa.array([p if text else None for (p, _), text in zip(pairs, plain)], pa.string()),
            COMPLETION: pa.array([c if text else None for (_, c), text in zip(pairs, plain)], pa.string()),
        }
        names = batch.schema.names
        kept = (self.options.conversation.tools, self.options.conversation.kwargs_column, *ROW_ID_COLUMNS)
        columns.update({name: batch.column(name) for name in kept if name in names})
        synthetic = pa.RecordBatch.from_pydict(columns).replace_schema_metadata(batch.schema.metadata)
        parts = []
        try:
            for fn, todo in ((self.chat, [c is not None for c in conversations]), (self.plain, plain)):
                if any(todo):
                    parts.append(fn.outcome(synthetic, todo=np.array(todo)))
        except DataError as exc:
            text = str(exc).removeprefix("chat: ").replace("counted as chat.", "counted as preference.")
            raise DataError(f"preference: the {member} conversation of {text}") from None
        return Outcome.merge(parts)

    def _rows(self, batch: pa.RecordBatch, values: list[Any], outcomes: list[Outcome]) -> TokenChunk:
        """The kept rows, members cut to ``max_length`` and put side by side, with their counts."""
        counts = _Counts()
        ok = np.array([isinstance(v, tuple) for v in values], dtype=bool)
        for i in np.flatnonzero(~ok):
            counts.skip(int(i), values[i].reason)
        for outcome in outcomes:
            for i, name, count in outcome.counts:
                counts.chat(i, name, count)
        ids = np.concatenate([o.ids for o in outcomes])
        found, start, size, prompt = _members(outcomes, batch.num_rows)
        ok &= found.all(0)
        cut = np.zeros(batch.num_rows, np.int64)
        if self.options.max_length is not None:  # the prompt's first tokens go, the same from both members
            cut = np.maximum(size.max(0) - self.options.max_length, 0)
            fits = (cut == 0) | (cut < prompt.min(0))
            for i in np.flatnonzero(ok & ~fits):
                counts.skip(int(i), TOO_LONG)
            ok &= fits
        kept = np.flatnonzero(ok)
        if len(kept):
            counts.add("preference.prompt_not_prefix", self._not_prefix(batch, values, kept, ids, start, size))
        lengths = (size[:, kept] - cut[kept]).T.reshape(-1)  # member by member, pair by pair
        offsets = exclusive_cumsum(lengths)
        out_ids = ids[np.repeat((start[:, kept] + cut[kept]).T.reshape(-1) - offsets[:-1], lengths) + np.arange(
            int(offsets[-1])
        )]  # fmt: skip
        completion_from = np.repeat((prompt[:, kept] - cut[kept]).T.reshape(-1), lengths)
        labels = np.where(positions(offsets) >= completion_from, out_ids, IGNORE).astype(np.int64)
        rows = offsets[:: len(outcomes)]
        columns = self._pass_through(batch, kept)
        columns[LABELS] = pa.LargeListArray.from_arrays(pa.array(rows), pa.array(labels))
        if not self.options.unpaired:
            columns[CHOSEN] = pa.array(lengths[0::2], pa.int64())
        counts.add("preference.prompt_cut", int((cut[kept] > 0).sum()))
        counts.add("preference.rows", len(kept))
        counts.add("preference.tokens", len(out_ids))
        counts.add("preference.completion_tokens", int((labels != IGNORE).sum()))
        counts.report(self.stats)
        return TokenChunk(out_ids, rows, None, columns)

    def _not_prefix(
        self,
        batch: pa.RecordBatch,
        values: list[Any],
        kept: np.ndarray,
        ids: np.ndarray,
        start: np.ndarray,
        size: np.ndarray,
    ) -> int:
        """How many kept rows have a prompt that, tokenized alone (with the generation prompt), is no prefix of a
        member's ids: where TRL warns and starts the completion where they diverge."""
        o, names = self.options.conversation, batch.schema.names
        tools = read_tools(batch.column(o.tools) if o.tools in names else None, str(o.tools))
        kwargs = read_kwargs(batch.column(o.kwargs_column) if o.kwargs_column in names else None, str(o.kwargs_column))
        prompts = {int(i): values[i][0][0] for i in kept}
        conversations = [i for i, p in prompts.items() if isinstance(p, list)]
        alike = [i for i in conversations if (not tools or tools[i] is None) and (not kwargs or not kwargs[i])]
        groups = [alike] + [[i] for i in conversations if i not in set(alike)]
        encoded: dict[int, np.ndarray] = {}
        for group in filter(None, groups):
            one = group[0]
            try:
                texts, _ = self.template.render(
                    [prompts[i] for i in group],
                    tools=tools[one] if tools else None,
                    kwargs={**o.template_kwargs, **(kwargs[one] if kwargs else {})},
                    generation_prompt=True,
                )
            except Exception:  # a template is user code: a prompt it refuses alone is no prefix
                continue
            tokens = self.chat.encoder.encode(texts)
            encoded.update(zip(group, np.split(tokens.ids, tokens.offsets[1:-1])))
        plain = [i for i, p in prompts.items() if isinstance(p, str)]
        if plain:
            tokens = self.plain.encoder.encode_plain([prompts[i] for i in plain])
            encoded.update(zip(plain, np.split(tokens.ids, tokens.offsets[1:-1])))
        found = 0
        for i, prompt_ids in encoded.items():
            members = [ids[start[k, i] : start[k, i] + size[k, i]] for k in range(len(start))]
            found += any(
                len(prompt_ids) > len(m) or not np.array_equal(m[: len(prompt_ids)], prompt_ids) for m in members
            )
        return found + len(prompts) - len(encoded)

    def _pass_through(self, batch: pa.RecordBatch, kept: np.ndarray) -> dict[str, pa.Array]:
        consumed = self.options.consumed()
        taken = pa.array(kept, pa.int64())
        out = {name: batch.column(name).take(taken) for name in batch.schema.names if name not in consumed}
        if self.options.unpaired:
            out[LABEL] = out[LABEL].cast(pa.int64())
        return out


class _Counts:
    """What a batch's rows add to the counters: a pair is skipped once (its first reason), counters are summed."""

    def __init__(self) -> None:
        self.skipped: dict[int, str] = {}
        self.added: dict[str, int] = {}

    def skip(self, row: int, reason: str) -> None:
        self.skipped.setdefault(row, reason)

    def add(self, name: str, n: int) -> None:
        if n:
            self.added[name] = self.added.get(name, 0) + n

    def chat(self, row: int, name: str, n: int) -> None:
        """A ``.chat()`` count for one member: a skip (``skip.chat.<reason>``) or a counter, as ``preference.*``."""
        if name.startswith(SKIP):
            self.skip(row, name[len(SKIP) :].removeprefix("chat."))
        else:
            self.add("preference." + name.removeprefix("chat."), n)

    def report(self, stats: PipelineStats) -> None:
        for reason in self.skipped.values():
            stats.record_skip(f"preference.{reason}", 1)
        for name, n in self.added.items():
            stats.add(name, n)


def preference_options(
    tokenizer: Any,
    *,
    chat_template: str | None = None,
    num_threads: int = 2,
    max_length: int | None = None,
    unpaired: bool = False,
    chat_options: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Check the stage's settings, load the tokenizer and its template, and return the stage's options.

    ``chat_options`` are the ``.chat()`` settings that mean the same here (checked as ``.chat()`` checks them):
    ``tools``, ``kwargs_column``, ``template_kwargs``, ``on_error``, ``special_text``.

    Example:
        >>> preference_options(pp.examples.chat_tokenizer(), chat_options={"train_on": "all"})
        Traceback (most recent call last):
        ...
        ValueError: `chat_options` may set ['kwargs_column', 'on_error', 'special_text', 'template_kwargs', 'tools'], but sets ['train_on'].
    """  # noqa: E501
    shared = dict(chat_options or {})
    if set(shared) - SHARED:
        raise ValueError(f"`chat_options` may set {sorted(SHARED)}, but sets {sorted(set(shared) - SHARED)}.")
    if max_length is not None and (isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 2):
        raise ValueError(
            f"`max_length` must be an int of at least 2 (a prompt token and a completion token), but is {max_length!r} "
            "instead."
        )
    if not isinstance(unpaired, bool):
        raise TypeError(f"`unpaired` must be a bool, but is {unpaired!r} instead.")
    positive("num_threads", num_threads)
    plain = ChatOptions(prompt=PROMPT, completion=COMPLETION, **shared)
    template = plain.template(tokenizer, chat_template)
    conversation = ChatOptions(train_on="last", training_field=None, reasoning="as_rendered", **shared)
    options = PreferenceOptions(conversation, plain, max_length, unpaired)
    return {"template": template, "options": options, "num_threads": num_threads}


def _members(outcomes: list[Outcome], n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per member (first axis) and batch row: whether it was encoded, where its ids start in the outcomes' ids put
    end to end, its length, and its prompt's tokens (before its first trained one). A conversation's last row is
    its whole rendering."""
    found, start, size, prompt = (np.zeros((len(outcomes), n), np.int64) for _ in range(4))
    base = 0
    for k, o in enumerate(outcomes):
        trained = np.flatnonzero(o.trained)  # every row has one
        first = trained[np.searchsorted(trained, o.offsets[:-1])] if len(trained) else o.offsets[:-1]
        found[k, o.source], start[k, o.source], size[k, o.source] = 1, o.offsets[:-1] + base, o.lengths
        prompt[k, o.source] = first - o.offsets[:-1]
        base += len(o.ids)
    return found.astype(bool), start, size, prompt
