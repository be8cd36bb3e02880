"""``padpipe inspect``: the token-length distribution of a corpus and what every batching strategy costs on it.

The package is named ``inspection`` (not ``inspect``) so that a script run from inside ``padpipe/``
never shadows the standard library's ``inspect``; the function is :func:`padpipe.inspect`.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from torchdata.nodes import IterableWrapper

from padpipe import _build
from padpipe._progress import Progress
from padpipe.errors import DataError, check_seed, positive
from padpipe.inspection import strategies
from padpipe.inspection.advice import budget_length, splits_long_documents
from padpipe.inspection.chat import MESSAGES, ChatFigures, chat_lengths, chat_stage, check_columns
from padpipe.inspection.packing_model import model_kind
from padpipe.inspection.report import InspectResult, Settings
from padpipe.inspection.sample import (
    READERS,
    Corpus,
    choose_fields,
    draw_sample,
    files_of,
    first_schema,
    make_reader,
    source_pipeline,
)
from padpipe.inspection.strategies import StrategyResult
from padpipe.pipeline import Pipeline
from padpipe.pipes.pad import padded_length
from padpipe.pipes.tokenize import tokenize_options
from padpipe.sharing.consumer import Consumer
from padpipe.stats import PipelineStats
from padpipe.token_stages import as_written
from padpipe.tokenizer import TextEncoder
from padpipe.tokenizer.encoder import MODEL_MAX_LENGTH_LIMIT

__all__ = ["ChatFigures", "InspectResult", "Settings", "StrategyResult", "inspect"]

BUCKET_BUFFERS = (256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
PACK_BUFFERS = (8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
DEFAULT_SEQ_LEN = 2048
Sweep = tuple[tuple[int, float], ...]  # (buffer_size, efficiency) per buffer size tried


def inspect(
    data: Any,
    tokenizer: Any,
    *,
    fields: str | Sequence[str] | None = None,
    messages: str | None = None,
    chat_template: str | None = None,
    chat_options: Mapping[str, Any] | None = None,
    max_length: int | None = None,
    sample: int | None = 20_000,
    batch_size: int = 32,
    max_tokens: int | None = None,
    seq_len: int | None = None,
    buffer_size: int = 10_000,
    pack_buffer_size: int = 256,
    pad_to_multiple_of: int | None = 8,
    shuffle_buffer: int = 10_000,
    seed: int = 0,
    num_threads: int = 2,
    storage_options: dict[str, Any] | None = None,
    progress: bool | None = None,
    model: Any = None,
) -> InspectResult:
    """Tokenize a sample (or all) of ``data`` and run every batching strategy on its lengths.

    Strategies, on the same rows in the same order: static padding to ``max_length``, dynamic
    padding of random batches, ``bucket(batch_size)``, ``bucket(max_tokens)`` and ``pack(seq_len)``,
    run through padpipe's own stages on the token lengths: with ``sample=None`` exactly the batches
    of ``read(data).shuffle(shuffle_buffer, seed=seed).tokenize(...)`` and the strategy's ``code``. A
    sample is spread over the input's units and shuffled; steps per epoch are scaled to the corpus
    size, counted from metadata or estimated from bytes.

    Args:
        data: A path, glob, folder (``save_to_disk`` too), fsspec URL or list of them (Parquet,
            Arrow IPC, JSONL ``.gz``/``.zst``, CSV), or a reader pipeline without stages.
        tokenizer: Anything :meth:`padpipe.Pipeline.tokenize` takes.
        fields: The text field, or two for pairs; default ``text``, else the only one or two
            string columns.
        messages: The column of conversations: inspect what :meth:`padpipe.Pipeline.chat` makes of
            them (:class:`ChatFigures`). Default: ``messages`` where the data has that column (and no
            ``fields`` are asked for) or a ``chat_template`` is given; else text.
        chat_template: With conversations, a Jinja template to render them with instead of the
            tokenizer's (then ``tokenizer`` is a ``transformers`` tokenizer or its folder).
        chat_options: With conversations, more ``.chat()`` settings (``tools``, ``template_kwargs``,
            ``train_on``, ``reasoning``, ``on_error``: ``"skip"`` here unless given, so refused
            conversations are counted, ...).
        max_length: Truncation length; ``None``: the tokenizer's ``model_max_length`` when it has
            one, else no truncation (static padding then pads to the longest row). With
            conversations, the length ``sft(seq_len=...)`` cuts rows to; ``None``: ``seq_len``, else 2048.
        sample: Rows to sample; ``None`` reads every row (exact figures).
        batch_size: Rows per batch of the static, dynamic and ``bucket(batch_size)`` strategies.
        max_tokens: Budget of ``bucket(max_tokens)``; default ``batch_size`` times ``max_length``
            padded; with no ``max_length``, ``batch_size`` times the p99 length rounded up to a power
            of two, at most 2048.
        seq_len: Packed row length; default ``max_length``, else 2048. Where over 1% of the rows of
            one text field are longer than ``max_length``, documents are packed whole, split across rows.
        buffer_size: Bucket buffer (rows sorted together).
        pack_buffer_size: Packing buffer (documents to choose fits from).
        pad_to_multiple_of: Padding multiple of the dynamic and bucket strategies (``None``: none).
        shuffle_buffer: With ``sample=None``, the ``shuffle(buffer_size)`` modelled before
            tokenizing (0: file order).
        seed: Seed of the sample, the shuffle and the bucket batch order.
        num_threads: Tokenizer threads.
        storage_options: fsspec options for a path or URL ``data``.
        progress: Show progress; ``None`` reads ``PADPIPE_PROGRESS`` (``0`` turns it off).
        model: The model to train: a transformers model or config, or a local ``config.json`` or model
            folder: the advice says whether packing keeps documents apart in it (:func:`padpipe.model_kind`).

    Returns:
        An :class:`InspectResult`: ``print`` it, or use ``as_dict()`` and ``chart(path)``.

    Example:
        >>> result = pp.inspect(pp.examples.SAMPLE_PARQUET, pp.examples.tokenizer(), max_length=128,
        ...                     sample=2000, progress=False)
        >>> result.rows, result.fields, [s.name for s in result.strategies][2:]
        (2000, ('sentence1', 'sentence2'), ['bucket(batch_size=32)', 'bucket(max_tokens=4096)', 'pack(seq_len=128)'])
        >>> chats = pp.inspect(pp.examples.CHATS_JSONL, pp.examples.chat_tokenizer(), max_length=512, progress=False)
        >>> chats.chat.conversations, chats.rows, chats.chat.truncated_rows
        (1000, 1000, 44)
    """
    started = time.perf_counter()
    kind = None if model is None else model_kind(_config_of(model) if isinstance(model, (str, os.PathLike)) else model)
    sizes = dict(batch_size=batch_size, buffer_size=buffer_size, pack_buffer_size=pack_buffer_size)
    for name, value in {**sizes, "num_threads": num_threads}.items():
        positive(name, value)
    optional = dict(max_length=max_length, max_tokens=max_tokens, seq_len=seq_len, sample=sample)
    for name, value in {**optional, "pad_to_multiple_of": pad_to_multiple_of}.items():
        positive(name, value, allow_none=True)
    if isinstance(shuffle_buffer, bool) or not isinstance(shuffle_buffer, int) or shuffle_buffer < 0:
        raise ValueError(f"`shuffle_buffer` must be a non-negative int, but is {shuffle_buffer!r} instead.")
    check_seed(seed)
    if seq_len is not None and seq_len < 2:
        raise ValueError(f"`seq_len` must be at least 2, but is {seq_len} instead.")

    pipe = source_pipeline(data, storage_options=storage_options)
    stats = PipelineStats()
    probe = make_reader(Pipeline(as_written(pipe.source, (MESSAGES, "tools"))), PipelineStats())  # as .chat() reads
    columns = [] if fields is not None else list(first_schema(probe, probe.listed_units()).names)
    chat = chat_stage(
        pipe, tokenizer, columns=columns, messages=messages, chat_template=chat_template, chat_options=chat_options
    )
    cut = max_length if max_length is not None else seq_len or DEFAULT_SEQ_LEN  # where sft(seq_len=...) cuts
    limit: int | None = cut
    if chat is not None:
        if fields is not None:
            raise ValueError("`fields` is for text; conversations are read from `messages`, but both were given.")
        most = chat.stages[-1].options["template"].tokenizer.model_max_length
        model_limit = int(most) if most is not None and most < MODEL_MAX_LENGTH_LIMIT else None
        pipe = Pipeline(chat.source)  # the conversations read as .chat() reads them (JSON as written)
    else:
        untruncated = dict(max_length=None, truncation=False, add_special_tokens=True, append_eos=False)
        options = tokenize_options(tokenizer, fields="text", num_threads=num_threads, on_error="skip", **untruncated)
        limit = TextEncoder.load(tokenizer, max_length=max_length, truncation=True, add_special_tokens=True).max_length
        own = TextEncoder.load(tokenizer, max_length=None, truncation=True, add_special_tokens=True)  # its own limit
        model_limit = limit if max_length is None else own.max_length
    reader = make_reader(pipe, stats)
    units = reader.listed_units()
    where = units[0].path if units else reader.format.describe()
    if chat is not None:
        fields = check_columns(where, first_schema(reader, units).names, chat)
    else:
        fields = choose_fields(first_schema(reader, units), fields, where)
        options["fields"] = fields
        _check_limit(options["encoder"], fields, limit)

    if sample is None:
        records = _all_records(pipe, fields, shuffle_buffer=shuffle_buffer, seed=seed, stats=stats)
        known = all(u.num_rows is not None for u in units)
        corpus_rows: int | None = sum(u.num_rows or 0 for u in units) if known else None
        corpus = None
    else:
        table, corpus = draw_sample(reader, units, fields, rows=sample, seed=seed, progress=progress)
        chunk_rows = pipe.source.options.get("chunk_rows", 1024)
        records = IterableWrapper(table.to_batches(max_chunksize=chunk_rows))
        corpus_rows = table.num_rows
    figures = None
    if chat is not None:
        raw, stream, figures = chat_lengths(
            records, chat, stats, max_length=cut, num_threads=num_threads, total=corpus_rows, enabled=progress
        )
    else:
        raw = _tokenized_lengths(records, options, stats, total=corpus_rows, progress=progress)
    lengths = np.concatenate(raw) if raw else np.zeros(0, np.int64)
    if figures is None:
        skipped = stats.snapshot().skipped.get("tokenize.bad_text", 0)
        read = len(lengths) + skipped
    else:
        skipped, read = figures.read - figures.conversations, figures.read
    if not len(lengths):
        found = f"all {skipped:,} rows read have no text there (None or not a string)" if skipped else "it has no rows"
        if figures is not None and skipped:
            found = f"chat() drops all {skipped:,} conversations read ({figures.skipped})"
        raise DataError(f"{_describe(data)}: nothing to inspect in field(s) {list(fields)!r}: {found}.")
    sampled = sample is not None and not (corpus is not None and corpus.exact and read >= corpus.rows)
    if corpus is None:
        files = files_of(reader)
        corpus = Corpus(read, True, "every row read", len(units), len(units), len(files), sum(files.values()))
    if chat is None:
        stream = raw if limit is None else [np.minimum(part, limit) for part in raw]

    static_length = limit if limit is not None else int(lengths.max(initial=1))
    budget = ""
    if max_tokens is None:
        row = static_length
        if limit is None:  # not the longest row: one long document would make a budget of a few steps an epoch
            row, how = budget_length(lengths)
            budget = (
                f"{batch_size} x {row:,} tokens: no max_length (the tokenizer has no model_max_length), so {how}, "
                f"not the longest row ({static_length:,})"
            )
        max_tokens = batch_size * _padded(row, pad_to_multiple_of)
    seq_len = seq_len if seq_len is not None else max(2, limit or DEFAULT_SEQ_LEN)
    settings = Settings(
        batch_size=batch_size,
        max_tokens=max_tokens,
        seq_len=seq_len,
        pack_batch_size=max(1, max_tokens // seq_len),
        buffer_size=buffer_size,
        pack_buffer_size=pack_buffer_size,
        pad_to_multiple_of=pad_to_multiple_of,
        static_length=static_length,
        shuffle_buffer=shuffle_buffer if sample is None else 0,
        seed=seed,
        budget=budget,
    )
    shuffled = sample is not None or shuffle_buffer > 0
    split = chat is None and splits_long_documents(lengths, limit, len(fields))  # as advised: whole, split
    results, bucket_sweep, pack_sweep, budget_truncated = _compare(
        stream, settings, shuffled=shuffled, packed=raw if split else None
    )
    return InspectResult(
        source=_describe(data),
        format=READERS[pipe.source.name],
        corpus=corpus,
        fields=fields,
        tokenizer=_describe(tokenizer),
        max_length=limit,
        lengths=lengths,
        sampled=sampled,
        skipped_rows=skipped,
        settings=settings,
        strategies=results,
        bucket_sweep=bucket_sweep,
        pack_sweep=pack_sweep,
        budget_truncated=budget_truncated,
        seconds=time.perf_counter() - started,
        model_max_length=model_limit,
        chat=figures,
        model=kind,
    )


def _config_of(path: str | os.PathLike) -> Any:
    """The transformers config of a local ``config.json`` or model folder."""
    import transformers

    return transformers.AutoConfig.from_pretrained(os.fspath(path), local_files_only=True)


def _padded(length: int, multiple: int | None) -> int:
    return int(padded_length(np.array([length]), pad_to_multiple_of=multiple, pad_to_length=None)[0])


def _compare(
    stream: list[np.ndarray], s: Settings, *, shuffled: bool, packed: list[np.ndarray] | None = None
) -> tuple[tuple[StrategyResult, ...], Sweep, Sweep, int]:
    """Every strategy on ``stream`` (in a random order when ``shuffled``), and the buffer sweeps.

    ``packed``: the untruncated lengths, for a pack row of whole documents split across rows.
    """
    if not stream:
        return (), (), (), 0
    rows = sum(len(part) for part in stream)
    multiple = s.pad_to_multiple_of
    whole = packed is not None
    bucket = functools.partial(strategies.bucket, stream, seed=s.seed, pad_to_multiple_of=multiple)
    pack = functools.partial(
        strategies.pack, packed if whole else stream, seq_len=s.seq_len, batch_size=s.pack_batch_size, whole=whole
    )
    by_budget, truncated = bucket(max_tokens=s.max_tokens, buffer_size=s.buffer_size)
    packs = pack(buffer_size=s.pack_buffer_size)
    results = (
        strategies.static(stream, batch_size=s.batch_size, length=s.static_length),
        strategies.dynamic(stream, batch_size=s.batch_size, pad_to_multiple_of=multiple, shuffled=shuffled),
        bucket(batch_size=s.batch_size, buffer_size=s.buffer_size)[0],
        by_budget,
        packs,
    )

    def sweep(sizes: tuple[int, ...], chosen: int, result: StrategyResult, run: Any) -> Sweep:
        tried = sorted({b for b in sizes if b <= rows} | {min(chosen, rows)})
        return tuple((b, (result if b == chosen else run(b)).efficiency) for b in tried)

    bucket_sweep = sweep(
        BUCKET_BUFFERS, s.buffer_size, by_budget, lambda b: bucket(max_tokens=s.max_tokens, buffer_size=b)[0]
    )
    pack_sweep = sweep(PACK_BUFFERS, s.pack_buffer_size, packs, lambda b: pack(buffer_size=b))
    return results, bucket_sweep, pack_sweep, truncated


def _all_records(
    pipe: Pipeline, fields: tuple[str, ...], *, shuffle_buffer: int, seed: int, stats: PipelineStats
) -> Any:
    """The record node of ``read(data)[.shuffle(shuffle_buffer, seed)]`` reading only ``fields``, every row."""
    source = dataclasses.replace(pipe.source, options={**pipe.source.options, "columns": list(fields)})
    records = Pipeline(source)
    if shuffle_buffer:
        records = records.shuffle(shuffle_buffer, seed=seed)
    return records.build(consumer=Consumer(), stats=stats)


def _tokenized_lengths(
    records: Any, options: dict[str, Any], stats: PipelineStats, *, total: int | None, progress: bool | None
) -> list[np.ndarray]:
    """Token lengths of every chunk padpipe's tokenize stage makes of ``records``, in order."""
    unpadded = dict(seed=None, pad_to_multiple_of=None, pad_to_length=None)
    node = _build.tokenize(records, _build.BuildContext(stats=stats, consumer=Consumer(), **unpadded), **options)
    raw = []
    with Progress("inspect: tokenizing", total=total, enabled=progress) as bar:
        for chunk in node:
            raw.append(chunk.lengths)
            bar.update(chunk.num_rows)
    return raw


def _check_limit(encoder: TextEncoder, fields: tuple[str, ...], limit: int | None) -> None:
    """``max_length`` must hold the tokenizer's special tokens (else the tokenizer does not truncate)."""
    if limit is None:
        return
    pair = [""] if len(fields) == 2 else None
    added = int(encoder.encode([""], pair).num_tokens)
    if limit < added:
        raise ValueError(
            f"`max_length` must be at least {added} (the tokenizer's special tokens), but is {limit} instead."
        )


def _describe(thing: Any) -> str:
    if isinstance(thing, (str, os.PathLike)):
        return os.fspath(thing)
    if isinstance(thing, (list, tuple)) and all(isinstance(t, (str, os.PathLike)) for t in thing):
        return ", ".join(os.fspath(t) for t in thing)
    if isinstance(thing, Pipeline):
        options = thing.source.options
        return str(options.get("paths", thing.source.name))
    return type(thing).__name__
