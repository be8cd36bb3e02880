"""What the recipe command lines share: their common arguments; run a pipeline, print batch shapes and efficiency."""

from __future__ import annotations

import argparse
import sys
from typing import Any, TextIO

import padpipe as pp
from padpipe import _shipped

SHOWN_BATCHES = 3
SEED = "seed of the file order, shuffle and batch order"
IGNORE = -100
"""The label of a token the loss does not train on."""


def data_arguments(parser: argparse.ArgumentParser, data: str, tokenizer: str, *, metavar: str = "DIR") -> None:
    """``--data`` (``data``: what the files hold) and ``--tokenizer`` (``tokenizer``: what it may be)."""
    help_data = f"files, folders or globs of {data}, all one format; {_shipped.data_help()}"
    parser.add_argument("--data", required=True, nargs="+", metavar="PATH", help=help_data)
    tokenizer_argument(parser, tokenizer, metavar=metavar)


def tokenizer_argument(parser: argparse.ArgumentParser, tokenizer: str, *, metavar: str = "DIR") -> None:
    """``--tokenizer`` (``tokenizer``: what it may be), the shipped tokenizers' names too."""
    parser.add_argument("--tokenizer", required=True, metavar=metavar, help=f"{tokenizer}; {_shipped.tokenizer_help()}")


def size_arguments(
    parser: argparse.ArgumentParser, *, seq_len: str, modes: tuple[str, str], mode: str, batch: str = "(pack)"
) -> None:
    """``--seq-len``, ``--mode`` (``modes``, the first the default), ``--batch-size`` and ``--max-tokens`` (bucket)."""
    parser.add_argument("--seq-len", type=int, default=2048, metavar="N", help=seq_len)
    parser.add_argument("--mode", choices=modes, default=modes[0], help=mode)
    parser.add_argument("--batch-size", type=int, default=8, metavar="N", help=f"packed rows per batch {batch}")
    if "bucket" in modes:
        bucket = "padded tokens per batch (bucket; default: seq-len x batch-size)"
        parser.add_argument("--max-tokens", type=int, metavar="N", help=bucket)


def run_arguments(parser: argparse.ArgumentParser, seed: str = SEED) -> None:
    """``--seed`` and ``--max-batches``."""
    parser.add_argument("--seed", type=int, default=0, help=seed)
    parser.add_argument("--max-batches", type=int, metavar="N", help="stop after N batches (default: one epoch)")


def size_options(args: argparse.Namespace) -> dict[str, Any]:
    """The recipe's arguments that :func:`size_arguments` and :func:`run_arguments` read, by name."""
    return {k: v for k, v in vars(args).items() if k in ("seq_len", "mode", "batch_size", "max_tokens", "seed")}


def describe(batch: dict[str, Any]) -> str:
    """One line naming each key of a batch and its shape (tensors) or length (lists) or value.

    Example:
        >>> describe({"input_ids": np.zeros((2, 8), dtype=np.int64), "max_length_q": 5})
        'input_ids [2, 8] int64, max_length_q 5'
    """
    parts = []
    for name, value in batch.items():
        if hasattr(value, "shape") and hasattr(value, "dtype"):
            parts.append(f"{name} {list(value.shape)} {str(value.dtype).removeprefix('torch.')}")
        elif isinstance(value, list):
            parts.append(f"{name} list[{len(value)}]")
        else:
            parts.append(f"{name} {value!r}")
    return ", ".join(parts)


def run(
    pipe: pp.Pipeline,
    *,
    max_batches: int | None,
    eos_id: int | None = None,
    unit: str = "rows",
    trained: bool = False,
    out: TextIO | None = None,
) -> pp.StatsSnapshot:
    """Read up to ``max_batches`` batches (all of one epoch when ``None``) and print a summary.

    Prints the shapes of the first few batches, then the totals and the packing (or padding)
    efficiency from ``loader.stats()``; packed batches (``eos_id`` given) count documents by the EOS
    tokens that end them, beside the pieces (a long document is split across rows).

    Args:
        pipe: The pipeline to run.
        max_batches: Most batches to read; ``None`` reads one epoch.
        eos_id: The EOS id that ends every document of packed batches; ``None`` for padded ones.
        unit: What a row of the output is, in the summary line (``"conversations"``).
        trained: Also print the share of the real tokens the loss trains (``labels`` other than -100).
        out: Where to print; default: standard output.

    Returns:
        The loader's stats after the last batch read.
    """
    out = out or sys.stdout
    loader = pipe.loader()
    documents = labelled = 0
    for number, batch in enumerate(loader):
        if eos_id is not None:
            documents += int((batch["input_ids"] == eos_id).sum())
        if trained:
            labelled += int((batch["labels"] != IGNORE).sum())
        if number < SHOWN_BATCHES:
            print(f"batch {number}: {describe(batch)}", file=out)
        if max_batches is not None and number + 1 >= max_batches:
            break
    stats = loader.stats()
    efficiency = "packing" if pipe.stages[-1].name == "pack" else "padding"
    rows = f"{stats.rows} {unit}" if eos_id is None else f"{documents} documents ({stats.rows} pieces)"
    print(
        f"{stats.batches} batches, {rows}, {stats.real_tokens} tokens in {stats.padded_tokens} slots: "
        f"{efficiency} efficiency {stats.padding_efficiency:.1%}",
        file=out,
    )
    if trained:
        share = labelled / stats.real_tokens if stats.real_tokens else 0.0
        print(f"trained tokens (labels other than -100): {labelled} of {stats.real_tokens} ({share:.1%})", file=out)
    return stats
