"""Find one GLUE split's rows in what the user passed: a ``datasets`` object, a local folder or nothing.

:func:`find_split` returns either a ``datasets.Dataset`` (in memory or memory-mapped) or a list of
Parquet files; :func:`columns_of` names its columns without reading rows; :func:`as_dataset` loads
Parquet files whole (GLUE evaluation splits are small) so their rows can be numbered.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Sequence, Union

from padpipe.errors import DataError

GLUE_REPO = "nyu-mll/glue"
"""The Hugging Face Hub dataset ``glue(data=None)`` downloads from."""

SplitRows = Union[Any, list]  # a datasets.Dataset, or a list of Parquet file paths


def find_split(data: Any, task: str, split: str) -> SplitRows:
    """The rows of ``split``: a ``datasets.Dataset`` or a sorted list of Parquet files.

    Args:
        data: ``None`` (download ``nyu-mll/glue``), a ``datasets.DatasetDict`` or ``Dataset``, or a
            local folder: a ``save_to_disk`` folder of a ``DatasetDict`` or of a ``Dataset``, or
            Parquet files named ``<split>-*.parquet`` or ``<split>/*.parquet`` (Hugging Face's
            Parquet export), in the folder itself or in its ``<task>/`` subfolder.
        task: The GLUE task (the Hub config name).
        split: The split wanted.

    Raises:
        DataError: ``data`` has no such split.
        FileNotFoundError: ``data`` names no folder.
        TypeError: ``data`` is of another type.

    Example:
        >>> find_split("glue_parquet/", "mrpc", "validation")  # doctest: +SKIP
        ['glue_parquet/mrpc/validation-00000-of-00001.parquet']
    """
    if isinstance(data, (str, os.PathLike)):
        return _from_folder(Path(data), task, split)
    import datasets

    if data is None:
        return datasets.load_dataset(GLUE_REPO, task, split=split)
    if isinstance(data, datasets.DatasetDict):
        if split not in data:
            raise DataError(f"glue {task}: the DatasetDict has no split {split!r}; found splits {list(data)!r}.")
        return data[split]
    if isinstance(data, datasets.Dataset):
        return data
    raise TypeError(
        "`data` must be None, a datasets.DatasetDict or Dataset, or a local folder, "
        f"but is a {type(data).__name__} instead."
    )


def columns_of(rows: SplitRows) -> list[str]:
    """The column names of a split (Parquet: those in every file's footer, in the first file's order)."""
    if not isinstance(rows, list):
        return list(rows.column_names)
    import pyarrow.parquet as pq

    schemas = [set(pq.read_schema(path).names) for path in rows]
    return [name for name in pq.read_schema(rows[0]).names if all(name in s for s in schemas)]


def as_dataset(rows: SplitRows, columns: Sequence[str]) -> Any:
    """``rows`` as a ``datasets.Dataset`` of ``columns`` (Parquet files are read into memory)."""
    import datasets

    if not isinstance(rows, list):
        return rows.select_columns(list(columns))
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.concat_tables([pq.read_table(path, columns=list(columns)) for path in rows])
    return datasets.Dataset(table)


def _from_folder(root: Path, task: str, split: str) -> SplitRows:
    if not root.is_dir():
        raise FileNotFoundError(f"glue: `data` folder {str(root)!r} does not exist.")
    for base in (root, root / task):
        if (base / "dataset_dict.json").is_file():
            return _saved_split(base, task, split)
        if (base / "state.json").is_file():  # one saved Dataset: it is the split
            import datasets

            return datasets.load_from_disk(str(base))
        files = sorted(base.glob(f"{split}-*.parquet")) or sorted((base / split).glob("*.parquet"))
        if files:
            return [str(path) for path in files]
    raise DataError(
        f"glue {task}: no {split!r} split in {str(root)!r}; expected a save_to_disk folder "
        f"(dataset_dict.json or state.json) or Parquet files {split}-*.parquet or {split}/*.parquet "
        f"there or in its {task}/ subfolder."
    )


def _saved_split(base: Path, task: str, split: str) -> Any:
    import datasets

    splits = json.loads((base / "dataset_dict.json").read_text()).get("splits", [])
    if split not in splits:
        raise DataError(
            f"glue {task}: the saved DatasetDict {str(base)!r} has no split {split!r}; found splits {splits!r}."
        )
    return datasets.load_from_disk(str(base / split))
