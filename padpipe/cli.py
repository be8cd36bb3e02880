"""The ``padpipe`` command line (also ``python -m padpipe``): ``inspect`` (:func:`padpipe.inspect`), ``cache
info|clear`` (:mod:`padpipe.cache`) and ``check-packing`` (:func:`padpipe.check_packing`; exit status 1 when a
model reads packed rows wrong). A user error prints one line and exits with status 2.

Example:
    $ padpipe inspect sample --tokenizer sample --max-length 128
    $ padpipe inspect chats --tokenizer chat --max-length 512
    $ padpipe cache info ~/.cache/padpipe-tokens
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from padpipe import _command, _shipped


def _at_least(text: str, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"expected a number of at least {minimum}, got {value}")
    return value


_positive = functools.partial(_at_least, minimum=1)
_non_negative = functools.partial(_at_least, minimum=0)


def _fields(text: str) -> tuple[str, ...]:
    fields = tuple(f.strip() for f in text.split(","))
    if len(fields) not in (1, 2) or not all(fields):
        raise argparse.ArgumentTypeError(f"expected one field or two separated by a comma, got {text!r}")
    return fields


def _storage_options(text: str) -> dict:
    try:
        options = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r} ({exc.msg})") from None
    if not isinstance(options, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return options


def build_parser() -> argparse.ArgumentParser:
    """The ``padpipe`` parser with its subcommands.

    Example:
        >>> build_parser().parse_args(["inspect", "data.parquet", "--tokenizer", "tok.json", "--all"]).sample is None
        True
    """
    parser = _command.Parser(
        prog="padpipe", description="padpipe tools. Run 'padpipe COMMAND --help' for a command's options."
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_command.Parser)
    _add_inspect(commands)
    _add_cache(commands)
    _add_check_packing(commands)
    return parser


def _add_cache(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "cache",
        help="size or delete a token cache (tokenize(..., cache=PATH))",
        formatter_class=_command.HelpFormatter,
        description="info: the files, bytes and tokenizer settings a token cache holds; clear: delete it.",
    )
    p.set_defaults(run=_cache)
    p.add_argument("action", choices=("info", "clear"), help="info: print the size; clear: delete the cache")
    p.add_argument("path", metavar="PATH", help="the folder or fsspec URL given to tokenize(cache=...)")
    _add_storage_options(p)


def _add_storage_options(p: argparse.ArgumentParser) -> None:
    text = "fsspec options for URLs, e.g. '{\"anon\": true}' (default: none)"
    p.add_argument("--storage-options", type=_storage_options, metavar="JSON", help=text)


def _add_inspect(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "inspect",
        help="token lengths of a corpus and the waste of every batching strategy",
        formatter_class=_command.HelpFormatter,
        description=(
            "Tokenize a sample of DATA (or all of it) and compare static padding, dynamic padding of random\n"
            "batches, bucket(batch_size), bucket(max_tokens) and pack(seq_len) on it: padding efficiency,\n"
            "steps per epoch, real and padded tokens per step and attention work, computed by padpipe's\n"
            "own stages on the token lengths. Prints the table and recommendations. Conversations (a\n"
            "'messages' column, or --messages) are read and rendered as .chat() does: the report adds their\n"
            "rows, trained-token share, reasoning rows and what --max-length (sft's --seq-len) cuts."
        ),
    )
    p.set_defaults(run=_inspect)
    p.add_argument(
        "data",
        nargs="+",
        metavar="DATA",
        help="Parquet, Arrow IPC or JSONL (.gz/.zst) file(s), folder(s) (save_to_disk too), globs or "
        f"fsspec URLs; quote globs. {_shipped.data_help()}",
    )
    p.add_argument(
        "--tokenizer",
        required=True,
        metavar="TOK",
        help="a tokenizer.json file, or a folder or name for transformers.AutoTokenizer (required); "
        f"{_shipped.tokenizer_help()}",
    )
    p.add_argument(
        "--fields",
        type=_fields,
        metavar="A[,B]",
        help="the text field, or two for pairs (default: 'text', else the one or two string columns)",
    )
    p.add_argument("--messages", metavar="NAME", help="the conversations' column (default: 'messages' if there)")
    p.add_argument("--tools", metavar="NAME", help="with conversations, the tool schemas' column (default: 'tools')")
    p.add_argument("--chat-template", metavar="FILE", help="with conversations, a Jinja template to render them with")
    p.add_argument(
        "--max-length",
        type=_positive,
        metavar="N",
        help="truncation length (default: the tokenizer's model_max_length if any, else none; with "
        "conversations: --seq-len, else 2048)",
    )
    size = p.add_mutually_exclusive_group()
    sample = "rows to sample, spread over the input's files and row groups"
    size.add_argument("--sample", type=_positive, default=20_000, metavar="N", help=sample)
    size.add_argument(
        "--all",
        dest="sample",
        action="store_const",
        const=None,
        help="read every row: exact figures (default: --sample)",
    )
    numbers = (  # (flag, type, default, help) of the strategies' sizes
        ("--batch-size", _positive, 32, "rows per batch of static, dynamic and bucket(batch_size)"),
        ("--max-tokens", _positive, None, "padded-token budget of bucket(max_tokens); the target for recommendations "
         "(default: batch size x max length)"),
        ("--seq-len", _positive, None, "packed row length of pack(seq_len); the target for recommendations "
         "(default: max length, else 2048)"),
        ("--buffer-size", _positive, 10_000, "bucket buffer (rows)"),
        ("--pack-buffer-size", _positive, 256, "packing buffer (documents)"),
        ("--pad-to-multiple-of", _non_negative, 8, "padding multiple of the dynamic and bucket strategies (0: none)"),
        ("--shuffle-buffer", _non_negative, 10_000, "with --all, the shuffle(buffer_size) modelled before tokenizing "
         "(0: file order)"),
        ("--seed", _non_negative, 0, "seed of the sample, shuffle and batches"),
    )  # fmt: skip
    for flag, kind, default, text in numbers:
        p.add_argument(flag, type=kind, default=default, metavar="N", help=text)
    p.add_argument("--threads", dest="num_threads", type=_positive, default=2, metavar="N", help="tokenizer threads")
    _add_storage_options(p)
    p.add_argument(
        "--chart", metavar="PNG", help="also write the chart to this PNG file; needs matplotlib (default: no chart)"
    )
    p.add_argument("--json", metavar="FILE", help="also write the figures as JSON to this file (default: no JSON)")
    p.add_argument(
        "--model",
        metavar="PATH",
        help="a model's config.json or folder: say whether packing keeps documents apart in it (default: none)",
    )
    p.add_argument(
        "--no-progress",
        dest="progress",
        action="store_const",
        const=False,
        default=None,
        help="no progress bar (default: a bar on a terminal, log lines elsewhere; "
        "PADPIPE_PROGRESS=0 also turns it off)",
    )


def _add_check_packing(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "check-packing",
        help="check that a model gives each packed document the logits it has alone",
        formatter_class=_command.HelpFormatter,
        description=(
            "Pack documents of DATA as pack() does, run MODEL (as configured, or as the options say) on a few\n"
            "packed batches and on each of a handful of their documents alone, and compare the logits.\n"
            "Exit status 1 names the cause (use_cache, missing flash-attention kwargs, a mask of the wrong kind)."
        ),
    )
    p.set_defaults(run=_check_packing)
    p.add_argument("model", metavar="MODEL", help="a model folder (with or without weights) or a config.json")
    p.add_argument(
        "--data", required=True, metavar="DATA", help=f"a Parquet, Arrow or JSONL file; {_shipped.data_help()}"
    )
    p.add_argument("--tokenizer", metavar="TOK", help="tokenizer (default: the MODEL folder's)")
    p.add_argument("--field", default="text", help="the text column")
    p.add_argument("--seq-len", type=_positive, default=256, metavar="N", help="packed row length")
    p.add_argument(
        "--max-length", type=_positive, metavar="N", help="documents cut to this length (default: seq-len // 4)"
    )
    p.add_argument("--batch-size", type=_positive, default=2, metavar="N", help="rows per packed batch")
    p.add_argument("--block-mask", action="store_true", help="pack with block_mask=True (a 4-D mask)")
    p.add_argument(
        "--mask-dtype",
        choices=("float32", "bfloat16", "float16", "bool"),
        help="the block mask's dtype (default: float32)",
    )
    p.add_argument(
        "--attn-implementation", metavar="NAME", help="eager, sdpa, flash_attention_2 ... (default: MODEL's)"
    )
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), help="model dtype (default: MODEL's)")
    p.add_argument("--device", default="cpu", help="torch device")
    p.add_argument("--use-cache", choices=("true", "false"), help="set config.use_cache (default: MODEL's)")
    p.add_argument("--max-documents", type=_positive, default=8, metavar="N", help="documents run alone")


def _check_packing(args: argparse.Namespace) -> int:
    from padpipe.inspection.packing_command import run

    return run(args)


INSPECT_AS_PARSED = (
    *("fields", "messages", "max_length", "sample", "batch_size", "max_tokens", "seq_len", "buffer_size"),
    *("pack_buffer_size", "shuffle_buffer", "seed", "num_threads", "storage_options", "progress", "model"),
)
"""The options of ``padpipe inspect`` that :func:`padpipe.inspect` takes as parsed, under the same names."""


def _inspect(args: argparse.Namespace) -> int:
    from padpipe.inspection import inspect

    _command.show_log_lines()
    data = [_shipped.data(path) for path in args.data]
    template = None if args.chat_template is None else Path(args.chat_template).read_text(encoding="utf-8")
    result = inspect(
        data if len(data) > 1 else data[0],
        _shipped.tokenizer(args.tokenizer),
        chat_template=template,
        chat_options=None if args.tools is None else {"tools": args.tools},
        pad_to_multiple_of=args.pad_to_multiple_of or None,
        **{name: getattr(args, name) for name in INSPECT_AS_PARSED},
    )
    result = dataclasses.replace(result, source=", ".join(args.data), tokenizer=args.tokenizer)  # as typed
    print(result)
    if args.chart:
        print(f"\nchart: {result.chart(args.chart)}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(result.as_dict(), handle, indent=2)
        print(f"json: {args.json}")
    return 0


def _cache(args: argparse.Namespace) -> int:
    from padpipe import cache

    if args.action == "info":
        print(cache.info(args.path, storage_options=args.storage_options))
    else:
        freed = cache.clear(args.path, storage_options=args.storage_options)
        print(f"{args.path}: deleted {cache.size_text(freed)}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status (0, or 2 on a user error).

    Example:
        >>> main(["inspect", "missing.parquet", "--tokenizer", pp.examples.TOKENIZER_JSON])
        2
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    run: Callable[[argparse.Namespace], int] = args.run
    return _command.run(lambda _: run(args), prog=f"padpipe {args.command}")
