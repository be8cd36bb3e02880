"""The chat stage's work: one Arrow record batch of conversations in, one :class:`TokenChunk` with labels out.

:class:`ChatTokenizer` keeps no state between calls (``padpipe._build.chat`` runs it in threads, as ``tokenize``).
A call is two steps, :meth:`ChatTokenizer.outcome` then :meth:`ChatTokenizer.chunk`, so a token cache can store
each conversation's outcome and give it back (:mod:`padpipe.token_cache.chat_fill`).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from padpipe.chat.encode import SpanEncoder, Tokens
from padpipe.chat.labels import IGNORE, cut, row_sums
from padpipe.chat.options import ChatOptions
from padpipe.chat.outcome import SKIP, Outcome
from padpipe.chat.plan import DROPPED, Plan, Planner
from padpipe.chat.problems import check_columns, row_message, warn_dropped
from padpipe.chat.rows import SPECIAL, RowProblem
from padpipe.chat.template import ChatTemplate
from padpipe.chunks import TokenChunk, exclusive_cumsum
from padpipe.errors import DataError
from padpipe.stats import PipelineStats
from padpipe.tokenizer.rows import LABELS

NO_TRAINED = "no_trained_tokens"


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
        self.planner = Planner(template, options)
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
        check_columns(batch, self.options)

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
        values = self.planner.rows(batch)
        if todo is not None:
            values = [value if wanted else None for value, wanted in zip(values, todo)]
        plans, counts = self.planner.plans(values)
        for i, plan in enumerate(plans):
            if isinstance(plan, RowProblem):
                policy = self.options.special_text if plan.reason == SPECIAL else self.options.on_error
                if policy == "raise":
                    raise DataError(row_message(batch, i, plan))
                counts.append((i, f"{SKIP}chat.{plan.reason}", 1))
        counts += [(i, f"{SKIP}chat.{NO_TRAINED}", 1) for i, plan in enumerate(plans) if plan == []]
        good = np.array([i for i, plan in enumerate(plans) if isinstance(plan, list) for _ in plan], dtype=np.int64)
        kinds = [row.kind for plan in plans if isinstance(plan, list) for row in plan]
        tokens, trained = self._encode([row for plan in plans if isinstance(plan, list) for row in plan])
        lengths, kept = cut(tokens.offsets, trained, self.options.max_length, self.options.truncation)
        offsets = exclusive_cumsum(lengths)
        ids, trained = tokens.ids[kept], trained[kept]
        sums = row_sums(offsets, trained)
        counts += [(int(i), "chat.truncated", 1) for i in good[(lengths < np.diff(tokens.offsets)) & (sums > 0)]]
        counts += [(int(i), f"{SKIP}chat.{NO_TRAINED}", 1) for i in good[sums == 0]]
        counts += [(int(i), f"chat.{kind}", 1) for i, kind, n in zip(good, kinds, sums) if kind and n]  # rows given
        if (sums == 0).any():
            keep = np.repeat(sums > 0, lengths)
            ids, trained, lengths = ids[keep], trained[keep], lengths[sums > 0]
            offsets = exclusive_cumsum(lengths)
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
                continue
            self.stats.add(name, n)
            if name.startswith(DROPPED):
                warn_dropped(name[len(DROPPED) :], name, self._said)
        self.stats.add("chat.conversations", len(np.unique(outcome.source)))  # those giving rows: 1, or more
        self.stats.add("chat.rows", chunk.num_rows)
        self.stats.add("chat.tokens", chunk.num_tokens)
        self.stats.add("chat.trained_tokens", int(trained.sum()))
        return chunk

    def _encode(self, plans: list[Plan]) -> tuple[Tokens, np.ndarray]:
        texts = [plan.text for plan in plans]
        tokens = self.encoder.encode_plain(texts) if plans and plans[0].plain else self.encoder.encode(texts)
        spans = [(i, lo, hi) for i, plan in enumerate(plans) for lo, hi in plan.spans]
        rows, lo, hi = (np.array(v, dtype=np.int64) for v in zip(*spans)) if spans else (np.zeros(0, np.int64),) * 3
        inside = SpanEncoder.mask(tokens, rows, lo, hi)
        invert = np.repeat(np.array([plan.invert for plan in plans], dtype=bool), np.diff(tokens.offsets))
        return tokens, inside != invert

    def _pass_through(self, batch: pa.RecordBatch, rows: np.ndarray, *, dropped: bool) -> dict[str, pa.Array]:
        """The other columns of the rows kept; where rows were dropped, without a column only they had values in
        (a field of a skipped row that is no conversation: pad() would refuse its nulls)."""
        consumed = self.options.consumed()
        taken = pa.array(rows, type=pa.int64())
        names = batch.schema.names
        columns = {name: batch.column(i).take(taken) for i, name in enumerate(names) if name not in consumed}
        if dropped:
            columns = {name: c for name, c in columns.items() if not len(c) or c.null_count < len(c)}
        return columns

    def __repr__(self) -> str:
        return f"ChatTokenizer({self.template!r}, {self.options!r})"
