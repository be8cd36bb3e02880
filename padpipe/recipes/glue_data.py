"""Find one GLUE split's rows in what the user passed: a ``datasets`` object, a local path or nothing.

:func:`find_split` returns a ``datasets.Dataset`` or a list of Parquet files (which need no
``datasets``); :func:`columns_of` names its columns without reading rows; :func:`read_table` loads
Parquet files whole (GLUE evaluation splits are small) so their rows can be numbered.
"""

from __future__ import annotations

import glob
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from padpipe._optional import require
from padpipe.errors import DataError
from padpipe.readers import parquet

GLUE_REPO = "nyu-mll/glue"
"""The Hugging Face Hub dataset ``glue(data=None)`` downloads from."""
LAYOUT = (
    "expected a Parquet file or glob (the split's rows), a folder of Parquet files named by split "
    "({split}-*.parquet or {split}/*.parquet, there or in its {task}/ subfolder), "
    "or a save_to_disk folder (dataset_dict.json or state.json)"
)
"""What ``data`` may name on disk, for messages."""

SplitRows = Any | list  # a datasets.Dataset, or a list of Parquet file paths


def find_split(data: Any, task: str, split: str) -> SplitRows:
    """The rows of ``split``: a ``datasets.Dataset`` or a sorted list of Parquet files.

    Args:
        data: ``None`` (download ``nyu-mll/glue``), a ``datasets.DatasetDict`` or ``Dataset``, or a
            path (:data:`LAYOUT`: a Parquet file or glob, a folder of Parquet files named by split as
            Hugging Face exports them, there or in its ``<task>/`` subfolder, or a ``save_to_disk`` folder).
        task: The GLUE task (the Hub config name).
        split: The split wanted.

    Raises:
        DataError: ``data`` has no such split.
        FileNotFoundError: ``data`` is a path that names nothing.
        MissingDependencyError: ``data`` needs ``datasets``, which is not installed.
        TypeError: ``data`` is of another type.

    Example:
        >>> find_split(pp.examples.SAMPLE_PARQUET, "mrpc", "validation")  # doctest: +ELLIPSIS
        ['.../padpipe/data/sample.parquet']
    """
    if isinstance(data, (str, os.PathLike)):
        return _from_path(os.fspath(data), task, split)
    if data is None:
        datasets = require("datasets", f"glue(data=None), which downloads {GLUE_REPO},")
        return datasets.load_dataset(GLUE_REPO, task, split=split)
    datasets = sys.modules.get("datasets")  # a datasets object means the library is imported already
    if datasets is not None and isinstance(data, datasets.DatasetDict):
        if split not in data:
            raise DataError(f"glue {task}: the DatasetDict has no split {split!r}; found splits {list(data)!r}.")
        return data[split]
    if datasets is not None and isinstance(data, datasets.Dataset):
        return data
    raise TypeError(
        "`data` must be None, a datasets.DatasetDict or Dataset, or a local path, "
        f"but is a {type(data).__name__} instead."
    )


def columns_of(rows: SplitRows) -> list[str]:
    """The column names of a split (Parquet: those in every file's footer, in the first file's order).

    Example:
        >>> columns_of([pp.examples.SAMPLE_PARQUET])
        ['sentence1', 'sentence2', 'label', 'idx']
    """
    if not isinstance(rows, list):
        return list(rows.column_names)
    import pyarrow.parquet as pq

    schemas = [set(pq.read_schema(path).names) for path in rows]
    return [name for name in pq.read_schema(rows[0]).names if all(name in s for s in schemas)]


def read_table(files: Sequence[str], columns: Sequence[str]) -> pa.Table:
    """The ``columns`` of Parquet ``files`` as one in-memory table, in file order.

    Example:
        >>> read_table([pp.examples.SAMPLE_PARQUET], ["idx"]).num_rows
        20000
    """
    import pyarrow.parquet as pq

    return pa.concat_tables([pq.read_table(path, columns=list(columns)) for path in files])


def _from_path(data: str, task: str, split: str) -> SplitRows:
    layout = LAYOUT.format(split=split, task=task)
    if any(c in data for c in "*?["):
        files = sorted(glob.glob(data, recursive=True))
        if not files:
            raise FileNotFoundError(f"glue: `data` {data!r} matches no files; {layout}.")
        return files
    root = Path(data)
    if root.is_file():
        if not data.endswith(parquet.SUFFIXES):
            raise DataError(f"glue: `data` {data!r} is not a Parquet file; {layout}.")
        return [data]
    if not root.is_dir():
        raise FileNotFoundError(f"glue: no such file or folder: {data!r}; {layout}.")
    for base in (root, root / task):
        if (base / "dataset_dict.json").is_file():
            return _saved_split(base, task, split)
        if (base / "state.json").is_file():  # one saved Dataset: it is the split
            datasets = require("datasets", f"reading the save_to_disk folder {str(base)!r}")
            return datasets.load_from_disk(str(base))
        files = sorted(base.glob(f"{split}-*.parquet")) or sorted((base / split).glob("*.parquet"))
        if files:
            return [str(path) for path in files]
    raise DataError(f"glue {task}: no {split!r} split in {data!r}; {layout}.")


def _saved_split(base: Path, task: str, split: str) -> Any:
    splits = json.loads((base / "dataset_dict.json").read_text()).get("splits", [])
    if split not in splits:
        raise DataError(
            f"glue {task}: the saved DatasetDict {str(base)!r} has no split {split!r}; found splits {splits!r}."
        )
    datasets = require("datasets", f"reading the save_to_disk folder {str(base)!r}")
    return datasets.load_from_disk(str(base / split))
