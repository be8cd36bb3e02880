"""Builders that turn a recipe's stages into nodes; the only place the facade meets the stages."""

from __future__ import annotations

import functools
from collections.abc import Callable
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


def _with_stats(node: Callable[..., BaseNode], upstream: BaseNode, ctx: BuildContext, **options: Any) -> BaseNode:
    """Build a stage whose node takes the upstream node, the recipe's stats and its options (bound to ``node`` by
    ``functools.partial``, not a closure: recipes travel to spawned workers by pickle)."""
    return node(upstream, stats=ctx.stats, **options)


batch = functools.partial(_with_stats, FixedBatcher)
pad = functools.partial(_with_stats, Padder)
pack = functools.partial(_with_stats, Packer)
pair_pad = functools.partial(_with_stats, PairPadder)  # TRL's DPO layout
prefetch = functools.partial(_with_stats, DevicePrefetcher)  # a background thread, copying to ``device`` when set


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

    Its state is the upstream position (exact across thread counts) with the settings that change the tokens;
    ``on_error`` is not one, so a run stopped by a bad row can resume with ``on_error="skip"``. With the recipe's
    token cache, the threads tokenize only the rows it does not hold, and a node after them fills it.
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


def source(upstream: None, ctx: BuildContext, *, reader: type, **options: Any) -> BaseNode:
    """Build a reader node; the shuffle seed and consumer slot come from the recipe (and the token cache, if any)."""
    node = reader(seed=ctx.seed, consumer=ctx.consumer, stats=ctx.stats, **options)
    if ctx.cache is not None:
        node.use_token_cache(ctx.cache)
    return node


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

    Its state is as :func:`tokenize`'s, with the options but ``on_error``, the template and the tokenizer checked
    on resume; with the recipe's token cache, the threads render only the conversations it does not hold.
    """
    chat_fn = ChatTokenizer(template, options, stats=ctx.stats)
    fn: Any = chat_fn if ctx.cache is None else ctx.cache.chat(chat_fn)
    settings = {**options.settings(), "template": template.fingerprint(), "tokenizer": chat_fn.encoder.fingerprint()}
    upstream = FirstChunks(upstream, references=ctx.cache)  # the first rows of an epoch in small chunks: fast
    node = OrderedMapper(upstream, fn, num_threads=num_threads, stage="chat", settings=settings)
    return node if ctx.cache is None else ctx.cache.filler(node)
