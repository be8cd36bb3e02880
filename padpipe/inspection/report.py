"""The result of ``inspect``: the length distribution, one row per strategy, recommendations, as text or a dict."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from padpipe.inspection.advice import num as _num
from padpipe.inspection.advice import recommendations
from padpipe.inspection.chat import ChatFigures
from padpipe.inspection.packing_model import ModelKind
from padpipe.inspection.sample import Corpus
from padpipe.inspection.strategies import StrategyResult

PERCENTILES = (50, 90, 99)


@dataclass(frozen=True)
class Settings:
    """The strategy settings ``inspect`` compared (defaults filled in).

    Attributes:
        batch_size: Rows per batch of the static, dynamic and ``bucket(batch_size)`` strategies.
        max_tokens: The padded-token budget of ``bucket(max_tokens)``.
        seq_len: Tokens per packed row.
        pack_batch_size: Packed rows per batch (``max_tokens // seq_len``: the same tokens per step).
        buffer_size: Rows sorted together by the bucket strategies.
        pack_buffer_size: Documents the packer chooses fits from.
        pad_to_multiple_of: Padding multiple of the dynamic and bucket strategies.
        static_length: The length static padding pads every row to.
        shuffle_buffer: The ``shuffle(buffer_size)`` modelled when every row is read (0: none).
        seed: Seed of the sample, the shuffle and the bucket batch order.
        budget: How ``max_tokens`` was chosen when no ``max_length`` sized it (else ``""``).
    """

    batch_size: int
    max_tokens: int
    seq_len: int
    pack_batch_size: int
    buffer_size: int
    pack_buffer_size: int
    pad_to_multiple_of: int | None
    static_length: int
    shuffle_buffer: int
    seed: int
    budget: str = ""


@dataclass(frozen=True, eq=False)  # holds an array: compare the figures, not the objects
class InspectResult:
    """What :func:`padpipe.inspect` found: ``print(result)`` for the report, :meth:`as_dict` for JSON.

    Attributes:
        source: The input, as given.
        format: ``"parquet"``, ``"arrow"``, ``"jsonl"`` or ``"datasets"``.
        corpus: The whole input's size (exact or estimated) and how it is known.
        fields: The text field(s) tokenized.
        tokenizer: The tokenizer, as given (a path) or its type.
        max_length: Truncation length (``None``: none).
        model_max_length: The tokenizer's own limit (``None``: none); advice never goes past it.
        lengths: Token count of every row inspected, before truncation, special tokens included.
        sampled: ``True`` for a sample, ``False`` when every row was read.
        skipped_rows: Rows without text in a field (``None`` or not a string), left out.
        settings: The strategy settings compared.
        strategies: One result per strategy, in the table's order.
        bucket_sweep: ``(buffer_size, efficiency)`` of ``bucket(max_tokens)`` per buffer size tried.
        pack_sweep: ``(buffer_size, efficiency)`` of ``pack(seq_len)`` per buffer size tried.
        budget_truncated: Rows longer than ``max_tokens`` allows (``bucket(max_tokens)`` cut them).
        seconds: Time ``inspect`` took.
        chat: With conversations, what ``.chat()`` made of them (then a row is one of its rows); else ``None``.
        model: The :class:`~padpipe.ModelKind` of the model given (``None``: none given).
    """

    source: str
    format: str
    corpus: Corpus
    fields: tuple[str, ...]
    tokenizer: str
    max_length: int | None
    lengths: np.ndarray
    sampled: bool
    skipped_rows: int
    settings: Settings
    strategies: tuple[StrategyResult, ...]
    bucket_sweep: tuple[tuple[int, float], ...]
    pack_sweep: tuple[tuple[int, float], ...]
    budget_truncated: int
    seconds: float
    model_max_length: int | None = None
    chat: ChatFigures | None = None
    model: ModelKind | None = None

    # -- figures ----------------------------------------------------------------------------------
    @property
    def rows(self) -> int:
        """Rows inspected."""
        return len(self.lengths)

    @property
    def scale(self) -> float:
        """Corpus rows per row inspected (per conversation read, for conversations; 1.0 when every row was read)."""
        read = self.chat.read if self.chat is not None else self.rows
        return self.corpus.rows / read if self.sampled and read else 1.0

    def distribution(self) -> dict[str, float]:
        """Count, mean, min, p50/p90/p99 (``numpy.percentile``), max and the share longer than ``max_length``.

        Example:
            >>> result.distribution()["p99"]  # doctest: +SKIP
            170.0
        """
        lengths = self.lengths
        if not len(lengths):
            return {"count": 0}
        out: dict[str, float] = {"count": len(lengths), "mean": float(lengths.mean()), "min": int(lengths.min())}
        for q, value in zip(PERCENTILES, np.percentile(lengths, PERCENTILES)):
            out[f"p{q}"] = float(value)
        out["max"] = int(lengths.max())
        longer = float((lengths > self.max_length).mean()) if self.max_length is not None else 0.0
        out["truncated_share"] = longer
        return out

    def steps_per_epoch(self, strategy: StrategyResult) -> int:
        """Steps of one epoch over the whole corpus (scaled up from a sample)."""
        return round(strategy.batches * self.scale)

    def best(self) -> StrategyResult:
        """The strategy with the highest padding efficiency."""
        return max(self.strategies, key=lambda s: s.efficiency)

    def recommendations(self) -> list[str]:
        """Settings to use and what each choice costs, one sentence each.

        ``max_length`` advice never goes past the tokenizer's ``model_max_length``; a corpus of long
        documents (more than 1% of rows truncated, one text field) gets packing with
        ``long_docs="split"``, which keeps every token.
        """
        return recommendations(self)

    # -- output -----------------------------------------------------------------------------------
    def table(self) -> str:
        """One row per strategy: efficiency, steps per epoch, tokens per step, attention vs the least."""
        header = (
            f"{'strategy':<34} {'efficiency':>10} {'steps/epoch':>11} {'real tok/step':>13} "
            f"{'padded tok/step':>15} {'attention':>9}"
        )
        lines = [header, "-" * len(header)]
        for r in self._rows():
            lines.append(
                f"{r['name']:<34} {r['efficiency']:>10.1%} {r['steps_per_epoch']:>11,} "
                f"{r['real_tokens_per_step']:>13,.0f} {r['padded_tokens_per_step']:>15,.0f} "
                f"{r['attention_vs_least']:>8.2f}x"
            )
        return "\n".join(lines)

    def _rows(self) -> list[dict[str, Any]]:
        """Each strategy's figures, per step and against the least attention too."""
        least = min((st.attention for st in self.strategies), default=0.0) or 1.0
        return [
            {
                **asdict(st),
                "efficiency": st.efficiency,
                "steps_per_epoch": self.steps_per_epoch(st),
                "real_tokens_per_step": st.real_tokens / (st.batches or 1),
                "padded_tokens_per_step": st.padded_tokens / (st.batches or 1),
                "attention_vs_least": st.attention / least,
            }
            for st in self.strategies
        ]

    def __str__(self) -> str:
        s, c, dist = self.settings, self.corpus, self.distribution()
        exact = "exact" if c.exact else "estimated"
        if self.sampled:
            inspected = f"sampled {self.rows:,} rows from {c.units_read:,} of them"
        else:
            inspected = f"read every row{f' (shuffle buffer {s.shuffle_buffer:,})' if s.shuffle_buffer else ''}"
        files = f"{_count(c.files, 'file')}, " if c.files else ""
        read = f"fields {' + '.join(self.fields)}" if self.chat is None else f"conversations in {self.chat.messages}"
        lines = [
            f"padpipe inspect: {self.source}",
            f"  {self.format}, {files}{_count(c.units, 'unit')}; {c.rows:,} rows ({exact}: {c.how}); {inspected}",
            f"  tokenizer {self.tokenizer}; {read}; max_length {self.max_length}"
            + (f"; {self.skipped_rows:,} rows without text left out" if self.skipped_rows and not self.chat else ""),
            "",
            *([*self.chat.lines(), ""] if self.chat is not None else []),
            "token lengths (before truncation, special tokens included)",
        ]
        if self.rows:
            cut = f"   longer than {self.max_length}: {dist['truncated_share']:.1%} (truncated)"
            lines.append(
                f"  mean {dist['mean']:.1f}   p50 {_num(dist['p50'])}   p90 {_num(dist['p90'])}   "
                f"p99 {_num(dist['p99'])}   max {dist['max']:,}" + (cut if self.max_length is not None else "")
            )
        multiple = "none" if s.pad_to_multiple_of is None else s.pad_to_multiple_of
        least = min((st.attention for st in self.strategies), default=0.0) or 1.0
        varlen = next((st.varlen_attention / least for st in self.strategies if st.varlen_attention is not None), None)
        lines += [
            "",
            self.table(),
            f"  settings: batch_size={s.batch_size}, max_tokens={s.max_tokens}, pack {s.pack_batch_size} rows of "
            f"{s.seq_len}, buffer_size={s.buffer_size:,} (pack {s.pack_buffer_size}), pad_to_multiple_of={multiple}",
            "  attention: sum over batches of rows x padded length^2, relative to the least; pack attends over "
            "whole packed rows"
            + ("" if varlen is None else f" ({varlen:.2f}x with a varlen kernel over cu_seq_lens_q)"),
        ]
        if s.budget:
            lines.append(f"  max_tokens={s.max_tokens}: {s.budget}; pass max_length or max_tokens to choose")
        lines += [
            f"  {st.name}: the documents whole (tokenize with truncation=False), split across packed rows "
            f"(long_docs='split'), as advised below; the other rows are truncated to max_length={self.max_length}"
            for st in self.strategies
            if st.whole
        ]
        if self.sampled:
            lines.append(f"  steps/epoch: scaled from the sample to {c.rows:,} rows")
        if self.sampled and self.rows < s.buffer_size:
            lines.append(
                f"  note: the sample ({self.rows:,} rows) is smaller than buffer_size={s.buffer_size:,}, so the "
                "bucket figures are for a buffer of the whole sample (a lower bound): sample more rows"
            )
        lines += ["", "efficiency by buffer size"]
        for name, sweep in (
            (f"bucket(max_tokens={s.max_tokens})", self.bucket_sweep),
            (self.strategies[-1].name if self.strategies else f"pack(seq_len={s.seq_len})", self.pack_sweep),
        ):
            lines.append(f"  {name:<26} " + "  ".join(f"{b:,}: {e:.1%}" for b, e in sweep))
        lines += ["", "recommendations"]
        lines += [f"  - {line}" for line in self.recommendations()]
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        """Everything in the report as plain JSON-ready values.

        Example:
            >>> json.dumps(result.as_dict())  # doctest: +SKIP
        """
        return {
            "source": self.source,
            "format": self.format,
            "model": None if self.model is None else {"kind": self.model.kind, "layout": self.model.layout},
            "fields": list(self.fields),
            "tokenizer": self.tokenizer,
            "max_length": self.max_length,
            "model_max_length": self.model_max_length,
            "rows_inspected": self.rows,
            "sampled": self.sampled,
            "skipped_rows": self.skipped_rows,
            "corpus": asdict(self.corpus),
            "lengths": self.distribution(),
            "settings": asdict(self.settings),
            "strategies": self._rows(),
            "bucket_buffer_sweep": [{"buffer_size": b, "efficiency": e} for b, e in self.bucket_sweep],
            "pack_buffer_sweep": [{"buffer_size": b, "efficiency": e} for b, e in self.pack_sweep],
            "budget_truncated": self.budget_truncated,
            "recommendations": self.recommendations(),
            "seconds": self.seconds,
            "chat": None if self.chat is None else {**asdict(self.chat), "read": self.chat.read},
        }

    def chart(self, path: str) -> str:
        """Write the PNG chart (length histogram, efficiency per strategy) to ``path``; return ``path``."""
        from padpipe.inspection.chart import write_chart

        return write_chart(self, path)


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'' if n == 1 else 's'}"
