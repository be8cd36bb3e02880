"""Builders that turn a recipe's stages into nodes; the only place the facade meets the stages."""

from __future__ import annotations

from typing import Any

import torch
from torchdata.nodes import BaseNode

from padpipe.chat.options import ChatOptions
from padpipe.chat.template import ChatTemplate
from padpipe.pipes.batch import FixedBatcher
from padpipe.pipes.bucket import Bucketizer
from padpipe.pipes.chat import ChatTokenizer
from padpipe.pipes.device import DevicePrefetcher
from padpipe.pipes.first_chunks import FirstChunks
from padpipe.pipes.pack import Packer
from padpipe.pipes.pad import Padder
from padpipe.pipes.pairs import CHOSEN, PairLayout, PairPadder
from padpipe.pipes.preference import PreferenceOptions, PreferenceTokenizer
from padpipe.pipes.shuffle import ShuffleBuffer
from padpipe.pipes.threads import OrderedMapper
from padpipe.pipes.tokens import TokenColumns
from padpipe.stage import BuildContext
from padpipe.tokenizer.rows import ChunkTokenizer


def shuffle(upstream: BaseNode, ctx: BuildContext, *, buffer_size: int, seed: int) -> BaseNode:
    """Build the row shuffle buffer (saving rows the token cache holds as references)."""
    return ShuffleBuffer(upstream, buffer_size=buffer_size, seed=seed, stats=ctx.stats, references=ctx.cache)


def tokenize(
    upstream: BaseNode,
    ctx: BuildContext,
    *,
    encoder: Any,
    fields: tuple[str, ...],
    num_threads: int,
    on_error: str,
    append_eos: bool,
) -> BaseNode:
    """Build the tokenizer stage: the batch encoder run by ``num_threads`` threads, chunks in order.

    Its state is the upstream position after the last chunk it returned, whatever ``num_threads``
    (so resume is exact across thread counts), with the settings that change the tokens checked on
    resume: ``fields``, ``max_length`` (as resolved), ``add_special_tokens``, ``append_eos``, the
    truncation side and the tokenizer itself. ``on_error`` is not checked, so a run stopped by a bad
    row can resume with ``on_error="skip"``. Errors from the threads reach the consumer unchanged.
    With the recipe's token cache (its session is ``ctx.cache``), the threads tokenize only the rows
    the cache does not hold, and a node after them collects the new rows for the cache.
    """

    upstream = FirstChunks(upstream, references=ctx.cache)  # the first rows of an epoch in small chunks: fast
    fn: Any = ChunkTokenizer(encoder, fields=fields, on_error=on_error, append_eos=append_eos, stats=ctx.stats)
    if ctx.cache is not None:
        fn = ctx.cache.tokenizer(fn)
    settings = {
        "fields": list(fields),
        "max_length": encoder.max_length,
        "truncation_side": encoder.truncation_side,
        "add_special_tokens": encoder.add_special_tokens,
        "append_eos": append_eos,
        "tokenizer": encoder.fingerprint(),
    }
    node = OrderedMapper(upstream, fn, num_threads=num_threads, stage="tokenize", settings=settings)
    return node if ctx.cache is None else ctx.cache.filler(node)


def batch(upstream: BaseNode, ctx: BuildContext, *, batch_size: int, drop_last: bool) -> BaseNode:
    """Build the in-order fixed-size batcher."""
    return FixedBatcher(upstream, batch_size=batch_size, drop_last=drop_last, stats=ctx.stats)


def bucket(upstream: BaseNode, ctx: BuildContext, *, seed: int | None, **options: Any) -> BaseNode:
    """Build the length bucketizer; the padding rules come from the recipe's ``pad`` stage."""
    seed = seed if seed is not None else (ctx.seed if ctx.seed is not None else 0)
    references = None if ctx.cache is None else ctx.cache.references_after(upstream)
    return Bucketizer(
        upstream,
        seed=seed,
        references=references,
        pad_to_multiple_of=ctx.pad_to_multiple_of,
        pad_to_length=ctx.pad_to_length,
        stats=ctx.stats,
        **options,
    )


def pad(upstream: BaseNode, ctx: BuildContext, **options: Any) -> BaseNode:
    """Build the pad-collate stage."""
    return Padder(upstream, stats=ctx.stats, **options)


def prefetch(upstream: BaseNode, ctx: BuildContext, *, prefetch: int, device: Any, block_mask: Any = None) -> BaseNode:
    """Build the background prefetcher (and CUDA copier when ``device`` is set)."""
    return DevicePrefetcher(upstream, prefetch=prefetch, device=device, block_mask=block_mask, stats=ctx.stats)


def source(upstream: None, ctx: BuildContext, *, reader: type, **options: Any) -> BaseNode:
    """Build a reader node; the shuffle seed and consumer slot come from the recipe (and the token cache, if any)."""
    node = reader(seed=ctx.seed, consumer=ctx.consumer, stats=ctx.stats, **options)
    if ctx.cache is not None:
        node.use_token_cache(ctx.cache)
    return node


def pack(upstream: BaseNode, ctx: BuildContext, **options: Any) -> BaseNode:
    """Build the sequence packer."""
    return Packer(upstream, stats=ctx.stats, **options)


def pair_pad(upstream: BaseNode, ctx: BuildContext, **options: Any) -> BaseNode:
    """Build the pad-collate stage of preference pairs: TRL's DPO layout."""
    return PairPadder(upstream, stats=ctx.stats, **options)


def pair_pack(upstream: BaseNode, ctx: BuildContext, *, keep: tuple[str, ...], **options: Any) -> BaseNode:
    """Build the packer of preference pairs: whole pairs packed, each member laid out as its own sequence."""
    mask = (options.pop("mask_dtype") or torch.float32) if options.pop("block_mask") else None  # the members' mask
    packer = Packer(upstream, stats=ctx.stats, keep=(*keep, CHOSEN), **options)
    return PairLayout(packer, position_offset=options["position_offset"], mask_dtype=mask)


def preference(
    upstream: BaseNode, ctx: BuildContext, *, template: ChatTemplate, options: PreferenceOptions, num_threads: int
) -> BaseNode:
    """Build the preference stage: pairs rendered and tokenized by ``num_threads`` threads, chunks in order (its
    state is the upstream position after the last chunk, with the options, the template and the tokenizer checked
    on resume, as the chat stage's)."""
    fn = PreferenceTokenizer(template, options, stats=ctx.stats)
    settings = {**options.settings(), "template": template.fingerprint(), "tokenizer": fn.chat.encoder.fingerprint()}
    return OrderedMapper(FirstChunks(upstream), fn, num_threads=num_threads, stage="preference", settings=settings)


def tokens(
    upstream: BaseNode,
    ctx: BuildContext,
    *,
    column: str,
    type_ids: str | None,
    max_length: int | None,
    pad_id: int | None,
) -> BaseNode:
    """Build the tokens stage (rows that already hold token ids), run inline; ``pad_id`` is for pad/pack."""

    fn = TokenColumns(column=column, type_ids=type_ids, max_length=max_length, stats=ctx.stats)
    settings = {"column": column, "type_ids": type_ids, "max_length": max_length}
    upstream = FirstChunks(upstream)  # chunked as tokenize's input, so both give the same batches downstream
    return OrderedMapper(upstream, fn, num_threads=1, stage="tokens", settings=settings)


def chat(
    upstream: BaseNode,
    ctx: BuildContext,
    *,
    template: ChatTemplate,
    options: ChatOptions,
    num_threads: int,
) -> BaseNode:
    """Build the chat stage: templates rendered and tokenized by ``num_threads`` threads, chunks in order.

    Its state is the upstream position after the last chunk it returned (exact across thread
    counts, as tokenize's), with what changes the tokens and labels checked on resume: the options
    but ``on_error``, the template and the tokenizer. With the recipe's token cache (its session
    is ``ctx.cache``), the threads render only the conversations the cache does not hold, and a
    node after them collects the new ones for the cache.
    """

    chat_fn = ChatTokenizer(template, options, stats=ctx.stats)
    fn: Any = chat_fn if ctx.cache is None else ctx.cache.chat(chat_fn)
    settings = {**options.settings(), "template": template.fingerprint(), "tokenizer": chat_fn.encoder.fingerprint()}
    upstream = FirstChunks(upstream, references=ctx.cache)  # the first rows of an epoch in small chunks: fast
    node = OrderedMapper(upstream, fn, num_threads=num_threads, stage="chat", settings=settings)
    return node if ctx.cache is None else ctx.cache.filler(node)
