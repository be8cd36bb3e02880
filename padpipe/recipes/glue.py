"""GLUE: every task's text fields, labels and splits, as padded, length-bucketed batches.

Example:
    >>> from padpipe.recipes.glue import glue
    >>> pipe = glue("mrpc", "validation", pp.examples.tokenizer(), data="glue_mrpc/")  # doctest: +SKIP
    >>> batch = next(iter(pipe.loader()))  # doctest: +SKIP
    >>> sorted(batch)  # doctest: +SKIP
    ['attention_mask', 'idx', 'input_ids', 'labels', 'row_index', 'token_type_ids']

Command line: ``python -m padpipe.recipes.glue --help``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

import padpipe as pp
from padpipe import _command, _shipped
from padpipe._progress import progress_stage
from padpipe.errors import DataError, check_bool, check_seed, positive
from padpipe.recipes import cli
from padpipe.recipes.glue_data import SplitRows, columns_of, find_split, read_table

LABEL, IDX = "label", "idx"
ROW_INDEX = "row_index"
"""The column of eval batches holding each row's position in its split (0-based)."""
DEFAULT_BATCH_SIZE = 32

_PAIR = ("sentence1", "sentence2")
_NLI = ("premise", "hypothesis")
_SPLITS = ("train", "validation", "test")


@dataclass(frozen=True)
class GlueTask:
    """One GLUE task: its text fields, its splits and the dtype of its ``label`` column.

    Attributes:
        fields: The text column, or the two columns of a pair.
        splits: The splits the Hub dataset ``nyu-mll/glue`` has for it.
        label: ``"int"`` (class ids; -1 on test splits) or ``"float"`` (stsb's similarity score).
    """

    fields: tuple[str, ...]
    splits: tuple[str, ...] = _SPLITS
    label: str = "int"


TASKS: dict[str, GlueTask] = {
    "cola": GlueTask(("sentence",)),
    "sst2": GlueTask(("sentence",)),
    "mrpc": GlueTask(_PAIR),
    "qqp": GlueTask(("question1", "question2")),
    "stsb": GlueTask(_PAIR, label="float"),
    "mnli": GlueTask(_NLI, ("train", "validation_matched", "validation_mismatched", "test_matched", "test_mismatched")),
    "mnli_matched": GlueTask(_NLI, ("validation", "test")),
    "mnli_mismatched": GlueTask(_NLI, ("validation", "test")),
    "qnli": GlueTask(("question", "sentence")),
    "rte": GlueTask(_PAIR),
    "wnli": GlueTask(_PAIR),
    "ax": GlueTask(_NLI, ("test",)),
}
"""The GLUE tasks by their ``nyu-mll/glue`` config name."""


def glue(
    task: str,
    split: str,
    tokenizer: Any,
    *,
    data: Any = None,
    batch_size: int | None = None,
    max_tokens: int | None = None,
    max_length: int = 128,
    seed: int = 0,
    pad_to_multiple_of: int | None = 8,
    buffer_size: int = 10_000,
    progress: bool | None = None,
) -> pp.Pipeline:
    """Padded, length-bucketed batches of one GLUE task's split.

    The train split is shuffled (by ``seed``, each pass the next epoch) and bucketed from a
    ``buffer_size`` buffer. Evaluation and test splits are sorted by length over the whole split,
    never dropped from, and carry ``row_index``, each row's position in the split
    (``preds[batch["row_index"]] = logits.argmax(-1)``). Batches hold ``input_ids``,
    ``attention_mask``, ``token_type_ids``, ``labels`` (float32 for stsb; -1 on test splits) and
    ``idx`` when the data has it.

    Args:
        task: A GLUE task: ``cola``, ``sst2``, ``mrpc``, ``qqp``, ``stsb``, ``mnli``
            (or ``mnli_matched``/``mnli_mismatched``), ``qnli``, ``rte``, ``wnli``, ``ax``.
        split: One of the task's splits; mnli has ``validation_matched``,
            ``validation_mismatched``, ``test_matched`` and ``test_mismatched``; ax only ``test``.
        tokenizer: Anything :meth:`padpipe.Pipeline.tokenize` takes (fast tokenizer or path).
        data: ``None`` downloads ``nyu-mll/glue``; else what
            :func:`~padpipe.recipes.glue_data.find_split` takes: a ``datasets`` object, a Parquet file
            or glob, or a local folder (``save_to_disk``, or Parquet files by split). Only Parquet
            needs no ``datasets`` (``pip install 'padpipe[hf]'``).
        batch_size: Rows per batch (default 32 when ``max_tokens`` is not given).
        max_tokens: Instead of ``batch_size``, a budget on padded tokens per batch.
        max_length: Truncate each example (pair: ``longest_first``) to this many tokens.
        seed: Seed of the train split's shuffle and batch order.
        pad_to_multiple_of: Round each batch's length up to a multiple (``None``: no rounding).
        buffer_size: Rows shuffled and sorted together on the train split.
        progress: Show progress while an evaluation or test split is tokenized and sorted before
            its first batch; ``None`` reads ``PADPIPE_PROGRESS`` (``0`` turns it off).

    Raises:
        ValueError: An unknown task or split (the message lists the valid ones), or bad sizes.
        DataError: The data lacks the split or one of the task's fields.
        FileNotFoundError: ``data`` is a path that names nothing.
        MissingDependencyError: ``data`` needs ``datasets``, which is not installed.

    Example:
        >>> dd = datasets.DatasetDict(validation=datasets.Dataset.from_dict(
        ...     {"sentence": ["a fine film", "bad"], "label": [1, 0], "idx": [0, 1]}))
        >>> batch = next(iter(glue("sst2", "validation", pp.examples.tokenizer(), data=dd).loader()))
        >>> batch["row_index"].tolist(), batch["input_ids"].shape
        ([1, 0], torch.Size([2, 8]))
    """
    if task not in TASKS:
        raise ValueError(f"`task` must be one of {tuple(TASKS)!r}, but is {task!r} instead.")
    spec = TASKS[task]
    if split not in spec.splits:
        raise ValueError(f"`split` must be one of {spec.splits!r} for GLUE task {task!r}, but is {split!r} instead.")
    if batch_size is not None and max_tokens is not None:
        raise ValueError("Pass at most one of `batch_size` or `max_tokens` to glue().")
    if max_tokens is None:
        batch_size = DEFAULT_BATCH_SIZE if batch_size is None else batch_size
    for name, value in dict(
        batch_size=batch_size, max_tokens=max_tokens, pad_to_multiple_of=pad_to_multiple_of
    ).items():
        positive(name, value, allow_none=True)
    positive("max_length", max_length)
    positive("buffer_size", buffer_size)
    check_seed(seed)
    if progress is not None:
        check_bool("progress", progress)
    longest = -(-max_length // (pad_to_multiple_of or 1)) * (pad_to_multiple_of or 1)
    if max_tokens is not None and max_tokens < longest:
        raise ValueError(
            f"`max_tokens` must be at least {longest} (`max_length`={max_length} padded to a multiple of "
            f"{pad_to_multiple_of}), but is {max_tokens} instead."
        )

    rows = find_split(data, task, split)
    columns = _columns(task, spec, split, columns_of(rows))
    if split == "train":
        pipe = (pp.read_parquet if isinstance(rows, list) else pp.from_hf)(rows, columns=columns)
        pipe, shuffle, buffer = pipe.shuffle(buffer_size, seed=seed), True, buffer_size
    else:
        pipe, num_rows = _numbered(rows, columns)
        shuffle, buffer = False, max(num_rows, 1)  # the whole split is sorted by length at once
    pipe = pipe.tokenize(tokenizer, fields=spec.fields, max_length=max_length)
    if split != "train" and progress is not False:  # the first batch waits for the whole split
        sorting = dict(desc=f"glue {task} {split}: sorting", total=num_rows, enabled=progress)
        pipe = pipe.add_stage("progress", progress_stage, output="tokens", **sorting)
    pipe = pipe.bucket(batch_size, max_tokens=max_tokens, buffer_size=buffer, shuffle=shuffle, seed=seed)
    return pipe.pad(pad_to_multiple_of=pad_to_multiple_of)


def _numbered(rows: SplitRows, columns: list[str]) -> tuple[pp.Pipeline, int]:
    """An evaluation split's rows with their position in ``ROW_INDEX``, and how many there are.

    Parquet files are read whole (GLUE evaluation splits are small) and need no ``datasets``.
    """
    if isinstance(rows, list):
        table = read_table(rows, columns)
        table = table.append_column(ROW_INDEX, pa.array(np.arange(table.num_rows, dtype=np.int64)))
        return pp.from_iterable(table.to_pylist()), table.num_rows
    dataset = rows.select_columns(columns)
    dataset = dataset.add_column(ROW_INDEX, np.arange(len(dataset), dtype=np.int64))
    return pp.from_hf(dataset), len(dataset)


def _columns(task: str, spec: GlueTask, split: str, found: list[str]) -> list[str]:
    """The columns to read: the text fields, ``label`` (optional on test splits) and ``idx`` if present."""
    required = spec.fields if split.startswith("test") else spec.fields + (LABEL,)
    for name in required:
        if name not in found:
            raise DataError(
                f"glue {task} {split}: the data has no field {name!r}; expected columns {list(required)!r}, "
                f"found {found!r}."
            )
    return list(spec.fields) + [name for name in (LABEL, IDX) if name in found]


PROG = "python -m padpipe.recipes.glue"
DESCRIPTION = """\
Padded, length-bucketed batches of one GLUE task's split: prints the first batches' shapes and
the padding efficiency. The train split is shuffled; other splits are sorted by length and carry
row_index. --data is where the split's rows are:
  a Parquet file (or glob): it is the split;
  a folder of Parquet files named by split, <split>-*.parquet or <split>/*.parquet, there or in
    its <task>/ subfolder (the Hub's Parquet export);
  a save_to_disk folder of a DatasetDict or of one Dataset (needs padpipe[hf]).
Without --data the split is downloaded from nyu-mll/glue (needs padpipe[hf] and a network).
Try it on the shipped sample, which has MRPC's columns:
  python -m padpipe.recipes.glue --task mrpc --tokenizer sample --data sample --split validation"""


def main(argv: Sequence[str] | None = None) -> int:
    """The command line: build :func:`glue`'s pipeline, print batch shapes and padding efficiency.

    Example:
        >>> main(["--task", "mrpc", "--tokenizer", pp.examples.TOKENIZER_JSON, "--data", pp.examples.SAMPLE_PARQUET,
        ...       "--split", "validation", "--max-batches", "1"])  # doctest: +ELLIPSIS
        glue mrpc validation:
        batch 0: input_ids [32, 24] int64, attention_mask [32, 24] int64, token_type_ids [32, 24] int64, ...
        1 batches, 32 rows, 499 tokens in 768 slots: padding efficiency 65.0%
        0
    """
    parser = _command.parser(PROG, DESCRIPTION)
    parser.add_argument(
        "--task", required=True, choices=tuple(TASKS), metavar="TASK", help=f"one of {', '.join(TASKS)}"
    )
    cli.tokenizer_argument(parser, "a tokenizer.json file, a pretrained folder or a hub name", metavar="PATH")
    where = f"where the split's rows are (see above); default: download. {_shipped.data_help()}"
    parser.add_argument("--data", metavar="PATH", help=where)
    parser.add_argument(
        "--split", default="train", help="the split: train, validation or test (mnli: validation_matched, ...)"
    )
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--batch-size", type=int, metavar="N", help=f"rows per batch (default: {DEFAULT_BATCH_SIZE})")
    size.add_argument("--max-tokens", type=int, metavar="N", help="instead of --batch-size, padded tokens per batch")
    parser.add_argument("--max-length", type=int, default=128, metavar="N", help="truncate each example to N tokens")
    cli.run_arguments(parser, "seed of the train split's shuffle and batch order")
    args = parser.parse_args(argv)
    data = None if args.data is None else _shipped.data(args.data)
    sizes = dict(batch_size=args.batch_size, max_tokens=args.max_tokens, max_length=args.max_length, seed=args.seed)
    pipe = glue(args.task, args.split, _shipped.tokenizer(args.tokenizer), data=data, **sizes)
    print(f"glue {args.task} {args.split}:")
    cli.run(pipe, max_batches=args.max_batches)
    return 0


if __name__ == "__main__":
    sys.exit(_command.run(main, prog=PROG))
