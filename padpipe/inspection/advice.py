"""The recommendations of ``inspect``: settings that fit the data and the tokenizer, one sentence each."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from padpipe.inspection.sample import Corpus
from padpipe.inspection.strategies import StrategyResult

PLATEAU = 0.005
"""A buffer size is "enough" once its efficiency is within this of the best one measured."""
LONG_SHARE = 0.01
"""A corpus is one of long documents when more than this share of rows is longer than ``max_length``."""
BUDGET_CAP = 2048
"""Without ``max_length``, the row length budgets are sized by is at most this (p99 rounded up to a power of two)."""


class Findings(Protocol):
    """What the advice and the chart read of an inspection (a :class:`padpipe.inspection.report.InspectResult`,
    whose module imports them): the lengths measured, the strategies compared and the buffer sweeps."""

    source: str
    corpus: Corpus
    fields: tuple[str, ...]
    max_length: int | None
    model_max_length: int | None
    lengths: np.ndarray
    sampled: bool
    settings: Any  # the strategy settings compared (max_tokens, ...)
    strategies: Sequence[StrategyResult]
    bucket_sweep: Sequence[tuple[int, float]]
    pack_sweep: Sequence[tuple[int, float]]
    budget_truncated: int
    chat: Any  # with conversations, what .chat() made of them (a ChatFigures, with its own advice); else None
    model: Any  # the ModelKind of the model given, or None

    @property
    def rows(self) -> int: ...

    def distribution(self) -> dict[str, float]: ...

    def steps_per_epoch(self, strategy: StrategyResult) -> int: ...

    def best(self) -> StrategyResult: ...


def splits_long_documents(lengths: np.ndarray, max_length: int | None, fields: int) -> bool:
    """Whether packing should keep every token: one text field, over :data:`LONG_SHARE` of rows past ``max_length``.

    Then the advice is ``pack(seq_len=max_length, long_docs="split")`` on untruncated documents,
    and ``inspect``'s pack row models that.

    Example:
        >>> splits_long_documents(np.array([10, 900, 20]), 512, 1), splits_long_documents(np.array([10]), 512, 1)
        (True, False)
    """
    if max_length is None or fields != 1 or not len(lengths):
        return False
    return float(np.mean(lengths > max_length)) > LONG_SHARE


def budget_length(lengths: np.ndarray) -> tuple[int, str]:
    """The row length to size a token budget by when nothing truncates, and how it was chosen (for the report).

    The longest row would give a budget only it needs (a corpus with one 87,286-token document
    would take a few steps an epoch): p99 rounded up to a power of two, at most :data:`BUDGET_CAP`.

    Example:
        >>> budget_length(np.array([30, 100, 120, 3000]))
        (2048, 'p99 2,914 rounded up to a power of two, at most 2,048')
        >>> budget_length(np.array([30, 100, 120]))[0]
        128
    """
    p99 = float(np.percentile(lengths, 99)) if len(lengths) else 1.0
    length = min(BUDGET_CAP, 1 << max(0, math.ceil(p99) - 1).bit_length())
    return length, f"p99 {num(p99)} rounded up to a power of two, at most {BUDGET_CAP:,}"


def recommendations(result: Findings) -> list[str]:
    """Settings to use and what each choice costs, one sentence each (see :meth:`InspectResult.recommendations`).

    Example:
        >>> recommendations(pp.inspect(pp.examples.SAMPLE_PARQUET, pp.examples.tokenizer(), max_length=128,
        ...                            sample=2000, progress=False))[0]  # doctest: +ELLIPSIS
        'max_length=128 truncates ...% of rows; max_length=... would keep 99% of them whole (p99 is ... tokens).'
    """
    s, dist = result.settings, result.distribution()
    if not result.rows or not result.strategies:
        return []
    lengths = _length_advice(result, dist) if result.chat is None else result.chat.advice(result.lengths)
    out = _model_advice(result) + lengths
    least = min(st.attention for st in result.strategies)
    fullest = result.best()
    lightest = min(result.strategies, key=lambda st: (st.attention, -st.efficiency))
    out.append(
        f"least padding: {fullest.name} ({fullest.efficiency:.1%} of token slots are real tokens); "
        f"least attention work: {lightest.name}."
    )
    rows = "a larger buffer only holds more rows and delays the first batch"
    out.append(_plateau(f"bucket(max_tokens={s.max_tokens})", result.bucket_sweep, rows))
    pack = result.strategies[-1].name  # the pack row is the last
    out.append(_plateau(pack, result.pack_sweep, "a larger buffer only costs packing time"))
    waste = ", ".join(
        f"{st.name} {1 - st.efficiency:.1%} ({st.attention / least:.2f}x attention)" for st in result.strategies
    )
    out.append(f"compute spent on padding: {waste}.")
    if result.budget_truncated:
        out.append(
            f"{result.budget_truncated:,} rows are longer than max_tokens={s.max_tokens} allows: "
            "bucket(max_tokens) raises on them unless on_oversize='truncate' or 'drop'."
        )
    return [line for line in out if line]


def _model_advice(result: Findings) -> list[str]:
    """How the model given batches: as :func:`padpipe.model_kind` says, with the efficiency of what it says."""
    kind = result.model
    if kind is None:
        return []
    if kind.layout != "bucket":
        return [f"model: {kind}"]
    bucket, pack = result.strategies[3], result.strategies[-1]  # bucket(max_tokens), pack(seq_len)
    return [
        f"model: {kind.why}; do not pack: {bucket.name} fills {bucket.efficiency:.1%} of token slots here (one "
        f"document a row, padding on the right: .pad(side='right')), where {pack.name} would fill "
        f"{pack.efficiency:.1%} and let documents see each other."
    ]


def _length_advice(result: Findings, dist: dict[str, float]) -> list[str]:
    """``max_length``: what it truncates and what would keep 99% of rows whole, never past the model's limit."""
    keep, limit, p99 = round_up(dist["p99"], 8), result.model_max_length, num(dist["p99"])
    if result.max_length is None:
        return [
            f"no truncation: the longest row has {dist['max']:,} tokens; "
            f"max_length={keep} would keep 99% of rows whole."
        ]
    out = [f"max_length={result.max_length} truncates {dist['truncated_share']:.1%} of rows; "]
    if limit is None or keep <= limit:
        out[0] += f"max_length={keep} would keep 99% of them whole (p99 is {p99} tokens)."
    elif result.max_length < limit:
        whole = float(np.mean(result.lengths <= limit))
        out[0] += (
            f"max_length={limit}, the tokenizer's limit (model_max_length), would keep {whole:.1%} of them "
            f"whole (p99 is {p99} tokens)."
        )
    else:
        out[0] += f"p99 is {p99} tokens, past the tokenizer's limit of {limit} (model_max_length)."
    if splits_long_documents(result.lengths, result.max_length, len(result.fields)):
        out.append(
            f"long documents: {dist['truncated_share']:.1%} of rows are longer than max_length="
            f'{result.max_length}; pack(seq_len={result.max_length}, long_docs="split") splits them '
            "across rows and keeps every token, where truncation drops "
            f"{_dropped(result.lengths, result.max_length):.1%} of the tokens."
        )
    return out


def _dropped(lengths: np.ndarray, limit: int) -> float:
    """The share of tokens that truncation to ``limit`` cuts off."""
    total = int(lengths.sum())
    return float(np.maximum(lengths - limit, 0).sum() / total) if total else 0.0


def _plateau(name: str, sweep: tuple[tuple[int, float], ...], cost: str) -> str:
    """Where efficiency stops improving with the buffer size, in one sentence."""
    if not sweep:
        return ""
    best_size, best = max(sweep, key=lambda item: (item[1], -item[0]))
    enough_size, enough = next((b, e) for b, e in sweep if e >= best - PLATEAU)
    if enough_size == sweep[-1][0] and len(sweep) > 1:
        before_size, before = sweep[-2]
        return (
            f"{name}: efficiency still grows at the largest buffer_size tried ({enough_size:,}: {enough:.1%}; "
            f"{before_size:,}: {before:.1%}); try larger ones."
        )
    return (
        f"{name}: efficiency stops improving at buffer_size={enough_size:,} ({enough:.1%}; the best measured is "
        f"{best:.1%} at {best_size:,}); {cost}."
    )


def round_up(value: float, multiple: int) -> int:
    """``value`` rounded up to a multiple of ``multiple`` (at least ``multiple``).

    Example:
        >>> round_up(721.0, 8), round_up(3.0, 8)
        (728, 8)
    """
    return max(multiple, math.ceil(value / multiple) * multiple)


def num(value: float) -> str:
    """A token count for people, as the chart writes it: ``61``, ``5,265`` (rounded to a whole token).

    Example:
        >>> num(61.0), num(5265.2), num(2344.5)
        ('61', '5,265', '2,344')
    """
    return f"{value:,.0f}"
