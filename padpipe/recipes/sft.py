"""Supervised fine-tuning of a chat model: conversations to packed ``[B, seq_len]`` rows with assistant-only labels.

Example:
    >>> from padpipe.recipes.sft import sft
    >>> pipe = sft(pp.examples.CHATS_JSONL, pp.examples.chat_tokenizer(), seq_len=1024, batch_size=4)
    >>> batch = next(iter(pipe.loader()))
    >>> batch["input_ids"].shape, bool((batch["labels"] != -100).any())
    (torch.Size([4, 1024]), True)

Command line: ``python -m padpipe.recipes.sft --help``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import padpipe as pp
from padpipe import _command, _shipped
from padpipe.inspection.formats import records
from padpipe.recipes import cli
from padpipe.recipes.batching import sizes

DROPPED = {
    "chat.no_trained_tokens": "no token left to train (after truncation to seq_len, or under train_on)",
    "chat.bad_messages": "not a list of messages, or bad tools or template arguments",
    "chat.template_error": "the chat template raised",
    "chat.not_prefix": "the template renders the messages before an answer in a way no prefix shows (not "
    "well-formed for the template)",
    "chat.span_check": "a trained span failed its check (no end-of-turn token after it, or not holding its content)",
    "chat.special_text": "a message holds a special token's text (special_text='skip')",
}
"""The ``.chat()`` skips by name, and why a conversation is dropped under each (``on_error="skip"`` for all but
the first, which is always a counted drop)."""


def sft(
    data: Any,
    tokenizer: Any,
    *,
    seq_len: int = 2048,
    mode: Literal["pack", "bucket"] | None = None,
    batch_size: int = 8,
    max_tokens: int | None = None,
    messages: str = "messages",
    prompt: str | None = None,
    completion: str | None = None,
    train_on: Literal["assistant", "last", "all"] = "assistant",
    chat_template: str | None = None,
    chat_options: Mapping[str, Any] | None = None,
    shuffle_buffer: int = 10_000,
    pack_buffer: int = 256,
    keep: Sequence[str] = (),
    seed: int = 0,
    cache: str | pp.TokenCache | None = None,
    model: Any = None,
) -> pp.Pipeline:
    """Chat SFT batches from conversations, read in one streaming pass: no pre-pass over the corpus.

    Each conversation is rendered and tokenized exactly as ``tokenizer.apply_chat_template`` would
    (:meth:`padpipe.Pipeline.chat`), ``labels`` -100 but on the trained tokens (by default every
    assistant answer through its end-of-turn token), cut to its first ``seq_len`` tokens; one left
    with no trained token is dropped and counted (``chat.no_trained_tokens``). ``mode="pack"`` packs
    conversations whole into ``batch_size`` rows of ``seq_len`` (:meth:`padpipe.Pipeline.pack`);
    ``mode="bucket"`` batches similar lengths under ``max_tokens`` padded tokens. Rows are shuffled by
    ``seed`` through a ``shuffle_buffer`` buffer (and the file order per epoch).

    Args:
        data: A path, glob, folder or URL of Parquet, Arrow, JSON Lines or CSV files, a list of them, a
            ``datasets`` dataset, or a :class:`padpipe.Pipeline` of records.
        tokenizer: A ``transformers`` fast tokenizer with a chat template, or its pretrained folder.
        seq_len: Tokens per packed row, and the length a longer conversation is cut to.
        mode: ``"pack"`` or ``"bucket"``; ``None``: ``"pack"``, or ``"bucket"`` for a ``model`` that
            packing cannot keep conversations apart in.
        batch_size: Packed rows per batch (``"pack"``).
        max_tokens: Padded-token budget per batch (``"bucket"``; default ``seq_len * batch_size``).
        messages: The column of conversations (lists of ``{"role", "content"}`` messages).
        prompt: With ``completion``: the columns of prompt/completion rows instead of ``messages``
            (:meth:`padpipe.Pipeline.chat`); the completion is trained.
        completion: See ``prompt``.
        train_on: ``"assistant"`` (every answer), ``"last"`` (the last answer) or ``"all"`` (every token).
        chat_template: A Jinja template to use instead of the tokenizer's.
        chat_options: More :meth:`padpipe.Pipeline.chat` settings (``on_error``, ``tools``, ...).
        shuffle_buffer: Conversations held in the shuffle buffer (and the bucketing buffer).
        pack_buffer: Conversations held to choose fits from (``"pack"``; :meth:`padpipe.Pipeline.pack`'s
            ``buffer_size``): larger packs tighter, and every mid-epoch state holds them (docs/sft.md).
        keep: Columns to carry into packed batches as lists per row (``("id",)``); in ``"bucket"`` mode
            numeric columns pass through by themselves.
        seed: Seed of the file order, the shuffle buffer and batch order.
        cache: A folder, fsspec URL or :class:`padpipe.TokenCache` for :meth:`padpipe.Pipeline.chat`'s cache:
            later epochs and runs read the rows instead of rendering (the same batches and ``stats()``).
            Needs files or a ``datasets.Dataset``.
        model: The model to train (a transformers model or config, or its :class:`padpipe.ModelKind`):
            packs with the layout it needs, or buckets where packing cannot be right (a warning says why).

    Raises:
        ValueError: ``seq_len`` < 2, no chat template, ``prompt`` without ``completion``, or bad options.

    Example:
        >>> pipe = sft("chats/*.parquet", "path/to/model", seq_len=4096, keep=("id",))  # doctest: +SKIP
    """
    buffers = {"shuffle_buffer": shuffle_buffer, "pack_buffer": pack_buffer}
    mode, layout, max_tokens = sizes(model, mode, "sft", seq_len, batch_size, max_tokens, **buffers)
    if mode == "bucket" and keep:
        raise ValueError(f"`keep` is for mode='pack'; with mode='bucket' columns pass through, but is {keep!r}.")
    options = dict(chat_options or {})
    taken = {"messages", "prompt", "completion", "train_on", "chat_template", "max_length", "cache"} & set(options)
    if taken:
        raise ValueError(f"`chat_options` must not repeat the recipe's own arguments, but sets {sorted(taken)!r}.")

    pipe = records(data).shuffle(shuffle_buffer, seed=seed)
    pipe = pipe.chat(
        tokenizer,
        messages=messages,
        prompt=prompt,
        completion=completion,
        train_on=train_on,
        chat_template=chat_template,
        max_length=seq_len,
        cache=cache,
        **options,
    )
    if mode == "pack":
        return pipe.pack(seq_len, batch_size=batch_size, buffer_size=pack_buffer, keep=tuple(keep), layout=layout)
    return pipe.bucket(max_tokens=max_tokens, buffer_size=shuffle_buffer, seed=seed).pad()


def summary(stats: pp.StatsSnapshot, out: Any = None) -> None:
    """Print the conversations and the rows they became, what was truncated and what was dropped, by reason.

    Truncation counts rows (a conversation is one row, or more where its reasoning is trained in rows of its
    own); drops count conversations, and rows left with no token to train.

    Example:
        >>> snap = pp.StatsSnapshot(rows=9, batches=1, real_tokens=900, padded_tokens=1024, seconds={},
        ...                         skipped={"chat.no_trained_tokens": 1},
        ...                         counters={"chat.conversations": 5, "chat.rows": 9, "chat.reasoning_rows": 4,
        ...                                   "chat.truncated": 2})
        >>> summary(snap)
        rendered: 5 conversations into 9 rows (4 rows of their own for reasoning the whole conversation drops)
        truncated to seq_len: 2 rows (their first seq_len tokens kept)
        dropped: 1 rows with no token to train
          chat.no_trained_tokens 1: no token left to train (after truncation to seq_len, or under train_on)
    """
    out = out or sys.stdout
    counters, reasoning = stats.counters, stats.counters.get("chat.reasoning_rows", 0)
    rows = f"{counters.get('chat.conversations', 0)} conversations into {counters.get('chat.rows', 0)} rows"
    own = f" ({reasoning} rows of their own for reasoning the whole conversation drops)" if reasoning else ""
    print(f"rendered: {rows}{own}", file=out)
    truncated = counters.get("chat.truncated", 0)
    print(f"truncated to seq_len: {truncated} rows (their first seq_len tokens kept)", file=out)
    unrendered = {k[len("chat.dropped_") :]: v for k, v in sorted(counters.items()) if k.startswith("chat.dropped_")}
    if unrendered:
        listed = ", ".join(f"{what} of {n} messages" for what, n in unrendered.items())
        print(f"not rendered by the template (trained as rendered): {listed}", file=out)
    if counters.get("chat.special_text"):
        print(f"conversations holding special-token text (kept): {counters['chat.special_text']}", file=out)
    untrained = stats.skipped.get("chat.no_trained_tokens", 0)  # a row (a conversation's only row, or one of them)
    refused = sum(stats.skipped.values()) - untrained
    parts = [f"{refused} conversations"] * bool(refused)
    parts += [f"{untrained} rows with no token to train"] * bool(untrained)
    print(f"dropped: {' and '.join(parts) or 'none'}", file=out)
    for name, count in sorted(stats.skipped.items()):
        print(f"  {name} {count}: {DROPPED.get(name, 'skipped under an on_error policy')}", file=out)


PROG = "python -m padpipe.recipes.sft"
DESCRIPTION = """\
Chat SFT batches from conversations, read in one streaming pass: prints the first batches' shapes,
the share of tokens trained, the packing (or padding) efficiency, and what was truncated to
--seq-len or dropped, by reason. Each conversation is rendered exactly as apply_chat_template
renders it; the assistant's answers are trained (--train-on). --mode pack packs whole conversations
into --batch-size rows of --seq-len tokens; --mode bucket batches similar lengths under --max-tokens.
A --data path's format comes from its name (.parquet, .arrow, .jsonl[.gz|.zst], .csv).
Try it on the shipped conversations and chat tokenizer (needs padpipe[hf]):
  python -m padpipe.recipes.sft --data chats --tokenizer chat --seq-len 1024"""


def main(argv: Sequence[str] | None = None) -> int:
    """The command line: build :func:`sft`'s pipeline, read an epoch, print shapes, shares and drops.

    Example:
        >>> main(["--data", pp.examples.CHATS_JSONL, "--tokenizer", pp.examples.CHAT_TOKENIZER_DIR,
        ...       "--seq-len", "1024", "--max-batches", "1"])  # doctest: +ELLIPSIS
        sft pack seq_len=1024, train_on=assistant:
        batch 0: input_ids [8, 1024] int64, position_ids [8, 1024] int64, labels [8, 1024] int64, ...
        1 batches, ... rows, ... tokens in 8192 slots: packing efficiency ...%
        trained tokens (labels other than -100): ... of ... (...%)
        rendered: ... conversations into ... rows
        truncated to seq_len: 0 rows (their first seq_len tokens kept)
        dropped: none
        0
    """
    parser = _command.parser(PROG, DESCRIPTION)
    cli.data_arguments(parser, "conversations", "a pretrained folder or a hub name, with a chat template")
    seq_len, mode = "tokens per packed row; cut length", "pack conversations into rows, or bucket and pad"
    cli.size_arguments(parser, seq_len=seq_len, modes=("pack", "bucket"), mode=mode)
    parser.add_argument("--messages", default="messages", metavar="NAME", help="the column of conversations")
    parser.add_argument("--prompt", metavar="NAME", help="with --completion: prompt/completion columns instead")
    parser.add_argument("--completion", metavar="NAME", help="the column of completions (trained)")
    for flag, values, what in (
        ("--train-on", ("assistant", "last", "all"), "which tokens are trained"),
        ("--on-error", ("raise", "skip"), "a conversation that cannot be rendered"),
        ("--reasoning", ("every_turn", "as_rendered"), "reasoning the conversation drops: own rows, or as rendered"),
        ("--special-text", ("keep", "skip", "raise"), "a message with a special token's text: kept, dropped, refused"),
    ):
        parser.add_argument(flag, choices=values, default=values[0], help=what)
    parser.add_argument("--chat-template", metavar="FILE", help="a Jinja chat template to use instead")
    cache = "a token cache folder or URL: later runs read the rows stored by the first instead of rendering them"
    parser.add_argument("--cache", metavar="DIR", help=cache)
    cli.run_arguments(parser)
    args = parser.parse_args(argv)
    if (args.prompt is None) != (args.completion is None):
        raise ValueError("--prompt and --completion go together: name both columns, or neither.")
    tokenizer = _shipped.tokenizer(args.tokenizer)
    if os.path.isfile(tokenizer):
        raise ValueError(
            f"--tokenizer {args.tokenizer!r} is a tokenizer.json file, which has no chat template and no special "
            "token names; pass a pretrained folder with a chat template (e.g. --tokenizer chat)."
        )
    template = None if args.chat_template is None else Path(args.chat_template).read_text(encoding="utf-8")
    pipe = sft(
        [_shipped.data(path) for path in args.data],
        tokenizer,
        messages=args.messages,
        prompt=args.prompt,
        completion=args.completion,
        train_on=args.train_on,
        chat_template=template,
        chat_options={"on_error": args.on_error, "reasoning": args.reasoning, "special_text": args.special_text},
        cache=args.cache,
        **cli.size_options(args),
    )
    print(f"sft {args.mode} seq_len={args.seq_len}, train_on={args.train_on}:")
    stats = cli.run(pipe, max_batches=args.max_batches, trained=True)
    summary(stats)
    if args.cache is not None:
        hits, misses = stats.counters.get("cache.hit_rows", 0), stats.counters.get("cache.miss_rows", 0)
        print(f"cache {args.cache}: {hits} conversations read from it, {misses} rendered and stored", file=sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(_command.run(main, prog=PROG))
