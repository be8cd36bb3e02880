"""What the recipe command lines share: run a pipeline, print a few batch shapes and the efficiency."""

from __future__ import annotations

import sys
from typing import Any, TextIO

import padpipe as pp

SHOWN_BATCHES = 3
IGNORE = -100
"""The label of a token the loss does not train on."""


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
    efficiency: str,
    eos_id: int | None = None,
    unit: str = "rows",
    trained: bool = False,
    out: TextIO | None = None,
) -> pp.StatsSnapshot:
    """Read up to ``max_batches`` batches (all of one epoch when ``None``) and print a summary.

    Prints the shapes of the first few batches, then the totals and ``efficiency`` (the word for
    real tokens over token slots: ``"padding"`` or ``"packing"``) from ``loader.stats()``. Packed
    batches (``eos_id`` given) count documents by the EOS tokens that end them, and the pieces
    placed beside (a long document is split into pieces across rows).

    Args:
        pipe: The pipeline to run.
        max_batches: Most batches to read; ``None`` reads one epoch.
        efficiency: How to name the efficiency in the summary line.
        eos_id: The EOS id that ends every document of packed batches; ``None`` for padded ones.
        unit: What a row of the output is, in the summary line (``"conversations"``).
        trained: Also count the tokens the loss trains (``labels`` other than -100) and print their
            share of the real tokens.
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
