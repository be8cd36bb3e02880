"""The main job: padding strategies compared on the shipped sample (``python -m padpipe.demo``; :data:`DESCRIPTION`).

Example:
    $ python -m padpipe.demo --max-length 128 --batch-size 32
    $ python -m padpipe.demo --data corpus
"""

from __future__ import annotations

import dataclasses
import os
import sys
import tempfile
import time
from collections.abc import Sequence

import padpipe as pp
from padpipe import _command, _shipped
from padpipe.inspection.formats import read_corpus
from padpipe.inspection.sample import detect_fields


@dataclasses.dataclass(frozen=True)
class StrategyResult:
    """One row of the demo table."""

    name: str
    batches: int
    rows: int
    efficiency: float
    rows_per_s: float
    tokens_per_s: float
    first_batch_s: float


def strategies(base: pp.Pipeline, *, max_length: int, batch_size: int, max_tokens: int) -> dict[str, pp.Pipeline]:
    """The four batching strategies the demo compares, each ending in padded tensors.

    Example:
        >>> sorted(strategies(base, max_length=128, batch_size=32, max_tokens=4096))  # doctest: +SKIP
        ['bucketed', 'dynamic', 'static', 'token budget']
    """
    return {
        f"static (pad to {max_length})": base.batch(batch_size).pad(pad_to_length=max_length),
        "dynamic (pad to batch max)": base.batch(batch_size).pad(),
        f"bucketed (batch_size={batch_size})": base.bucket(batch_size).pad(pad_to_multiple_of=8),
        f"token budget (max_tokens={max_tokens})": base.bucket(max_tokens=max_tokens).pad(pad_to_multiple_of=8),
    }


def warm_up(base: pp.Pipeline, *, batch_size: int) -> None:
    """Take one batch of ``base``, untimed: loads the tokenizer and starts the reader and torch once.

    Example:
        >>> warm_up(base, batch_size=32)  # doctest: +SKIP
    """
    loader = base.batch(batch_size).pad().loader()
    next(iter(loader), None)


def measure(name: str, pipe: pp.Pipeline) -> StrategyResult:
    """Run one epoch of ``pipe`` and time it.

    Example:
        >>> measure("dynamic", pipe).efficiency  # doctest: +SKIP
        0.41
    """
    loader = pipe.loader()
    start = time.perf_counter()
    first = None
    for _ in loader:
        if first is None:
            first = time.perf_counter() - start
    elapsed = time.perf_counter() - start
    stats = loader.stats()
    return StrategyResult(
        name=name,
        batches=stats.batches,
        rows=stats.rows,
        efficiency=stats.padding_efficiency,
        rows_per_s=stats.rows / elapsed,
        tokens_per_s=stats.real_tokens / elapsed,
        first_batch_s=first or 0.0,
    )


HEADER = f"{'strategy':<34} {'batches':>7} {'rows':>7} {'pad eff.':>8} {'rows/s':>9} {'tokens/s':>11} {'1st batch':>9}"


def format_row(r: StrategyResult) -> str:
    """One result as a line of the table under :data:`HEADER` (printed as soon as its strategy finishes).

    Example:
        >>> format_row(StrategyResult("dynamic (pad to batch max)", 625, 20000, 0.579, 13081, 970140, 0.021))
        'dynamic (pad to batch max)             625   20000    57.9%    13,081     970,140      21ms'
    """
    return (
        f"{r.name:<34} {r.batches:>7} {r.rows:>7} {r.efficiency:>8.1%} {r.rows_per_s:>9,.0f} "
        f"{r.tokens_per_s:>11,.0f} {r.first_batch_s * 1000:>7.0f}ms"
    )


PROG = "python -m padpipe.demo"
DESCRIPTION = """\
Compare four batching strategies on one shuffled, tokenized stream: static padding to
--max-length, dynamic padding per batch, length-bucketed batches of --batch-size rows, and
batches under a --max-tokens budget of padded tokens. Prints padding efficiency, rows/s,
tokens/s and time to first batch for each (one epoch each), then padpipe inspect's report for the
same data (every strategy, packing too) and its chart, in a new file in the temp folder or --chart
(needs padpipe[chart])."""


def _new_chart_file() -> str:
    """A new, empty file of this user's in the temp folder (``mkstemp``: no fixed name another user could plant)."""
    handle, path = tempfile.mkstemp(prefix="padpipe-demo-inspect-", suffix=".png")
    os.close(handle)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments, run every strategy on the data and print the table (see the module docs)."""
    parser = _command.parser(PROG, DESCRIPTION)
    parser.add_argument(
        "--data",
        nargs="+",
        default=["sample"],
        metavar="PATH",
        help="Parquet, Arrow (a save_to_disk folder too) or JSON Lines (.gz, .zst) files, folders or globs; "
        f"the format comes from the names. {_shipped.data_help()}",
    )
    parser.add_argument(
        "--tokenizer",
        default="sample",
        metavar="PATH",
        help="a tokenizer.json file, a pretrained folder or a hub name (folders and names need padpipe[hf]); "
        f"{_shipped.tokenizer_help()}",
    )
    parser.add_argument(
        "--fields",
        nargs="+",
        metavar="FIELD",
        help="one text column, or two for pairs (default: 'text', else the data's only one or two string columns)",
    )
    parser.add_argument("--max-length", type=int, default=128, metavar="N", help="truncate every row to N tokens")
    parser.add_argument(
        "--batch-size", type=int, default=32, metavar="N", help="rows per batch (static, dynamic, bucketed)"
    )
    parser.add_argument(
        "--max-tokens", type=int, default=4096, metavar="N", help="padded tokens per batch (token budget)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the shuffle")
    parser.add_argument(
        "--chart",
        metavar="PNG",
        help="write the chart to this file (default: a new file in the temp "
        "folder, padpipe-demo-inspect-*.png); a symbolic link there is refused",
    )
    args = parser.parse_args(argv)
    _command.show_log_lines()

    paths, tokenizer = [_shipped.data(path) for path in args.data], _shipped.tokenizer(args.tokenizer)
    fields = detect_fields(paths, args.fields, option="the text field(s) with --fields A [B]")
    base = (
        read_corpus(paths, columns=list(fields))
        .shuffle(buffer_size=10_000, seed=args.seed)
        .tokenize(tokenizer, fields=fields, max_length=args.max_length)
    )
    data = " ".join(args.data)
    print(f"data: {data}\ntokenizer: {args.tokenizer}\nfields: {list(fields)}, max_length={args.max_length}\n")
    sizes = {"max_length": args.max_length, "batch_size": args.batch_size, "max_tokens": args.max_tokens}
    plans = strategies(base, **sizes)
    warm_up(base, batch_size=args.batch_size)
    print(f"{HEADER}\n{'-' * len(HEADER)}", flush=True)
    for name, pipe in plans.items():
        print(format_row(measure(name, pipe)), flush=True)
    report = pp.inspect(paths, tokenizer, fields=fields, sample=None, seed=args.seed, **sizes)
    report = dataclasses.replace(report, source=", ".join(args.data), tokenizer=args.tokenizer)  # as typed
    print(f"\nThe same data through `padpipe inspect` (every strategy, no model):\n{report}")
    try:
        print(f"\nchart: {report.chart(args.chart or _new_chart_file())}")
    except (ImportError, OSError) as exc:
        print(f"\nno chart: {exc}")
    return 0


if __name__ == "__main__":
    sys.exit(_command.run(main, prog=PROG))
