"""A reader's state records which files it read; a changed listing is never resumed silently (13.1, 13.10, 13.12).

Resuming a state where a file was added, removed, renamed, reordered or changed since it was saved
raises a ``StateMismatchError`` saying which of these it was and what became of the file being read
(the state keeps a digest of the listing, not the file list; before, the saved ``(unit, row)`` pointed at other
data: rows read twice and rows never read). Naming the same files as a folder, a glob or a list is
the same input. A file replaced mid-epoch by another of the same size is caught by its
modification time.
"""

from __future__ import annotations

import os
import re
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import padpipe as pp
from padpipe import DataError, StateMismatchError
from tests.contract import normalize

TOK = pp.examples.TOKENIZER_JSON


def write(path, start: int, rows: int = 100) -> None:
    texts = [f"row {i} " + "word " * (i % 7) for i in range(start, start + rows)]
    pq.write_table(
        pa.table({"text": texts, "rid": range(start, start + rows)}), path, row_group_size=25, compression="none"
    )


@pytest.fixture
def shards(tmp_path):
    folder = tmp_path / "shards"
    folder.mkdir()
    for i in range(4):
        write(folder / f"s{i}.parquet", 100 * i)
    return folder


def pipe(paths, seed: int = 1) -> pp.Pipeline:
    return (
        pp.read_parquet(paths, chunk_rows=20)
        .shuffle(buffer_size=60, seed=seed)
        .tokenize(TOK, max_length=32)
        .batch(16)
        .pad()
    )


def saved_state(paths) -> tuple[dict, list]:
    loader = pipe(paths).loader()
    it = iter(loader)
    for _ in range(6):
        next(it)
    return loader.state_dict(), [normalize(b) for b in it]


def resume(paths, state) -> list:
    loader = pipe(paths).loader()
    loader.load_state_dict(state)
    return [normalize(b) for b in loader]


PREFIX = r"^ParquetReader state doesn't match this pipeline: its files changed since the state was saved \("
SUFFIX = r"\); resuming would read other rows\. Resume with the files as they were, or start a new run\.$"


def test_resume_raises_error_when_a_file_was_added(shards) -> None:
    state, _ = saved_state(str(shards))
    write(shards / "s9.parquet", 900)
    reading = re.escape(str(shards / "s3.parquet"))  # the shuffled unit order was in s3 after 6 batches
    with pytest.raises(
        StateMismatchError,
        match=PREFIX + rf"4 files when saved, 5 now: files were added or removed; the file being read, {reading}, "
        "is unchanged" + SUFFIX,
    ):
        resume(str(shards), state)


def test_resume_raises_error_naming_the_file_being_read_when_it_was_removed(shards) -> None:
    state, _ = saved_state(str(shards / "*.parquet"))
    (shards / "s3.parquet").unlink()
    gone = re.escape(str(shards / "s3.parquet"))
    with pytest.raises(
        StateMismatchError,
        match=PREFIX + rf"4 files when saved, 3 now: files were added or removed; the file being read, {gone}, "
        "is no longer listed" + SUFFIX,
    ):
        resume(str(shards / "*.parquet"), state)


def test_resume_raises_error_when_a_file_was_renamed(shards) -> None:
    state, _ = saved_state(str(shards))
    (shards / "s1.parquet").rename(shards / "s1b.parquet")
    with pytest.raises(
        StateMismatchError,
        match=PREFIX + "4 files as when saved, but other names: files were renamed, or added and removed; ",
    ):
        resume(str(shards), state)


def test_resume_raises_error_naming_a_changed_file(shards) -> None:
    state, _ = saved_state(str(shards))
    size = (shards / "s3.parquet").stat().st_size
    write(shards / "s3.parquet", 300, rows=120)
    new = (shards / "s3.parquet").stat().st_size
    changed = re.escape(f"the file being read changed: {shards / 's3.parquet'} ({size} -> {new} bytes)")
    same_names = "the same file names, but a size, version or content changed; "
    with pytest.raises(StateMismatchError, match=PREFIX + same_names + changed + SUFFIX):
        resume(str(shards), state)
    write(shards / "s3.parquet", 300)  # the same bytes again, but written later
    stat = (shards / "s3.parquet").stat()
    os.utime(shards / "s3.parquet", (stat.st_atime, stat.st_mtime + 5))
    with pytest.raises(
        StateMismatchError,
        match=PREFIX
        + same_names
        + r"the file being read changed: \S+/s3\.parquet \(version [\d.]+ -> [\d.]+\)"
        + SUFFIX,
    ):
        resume(str(shards), state)


def test_resume_raises_error_when_a_file_other_than_the_one_being_read_changed(shards) -> None:
    state, _ = saved_state(str(shards))
    write(shards / "s0.parquet", 0, rows=99)
    reading = re.escape(str(shards / "s3.parquet"))
    with pytest.raises(
        StateMismatchError,
        match=PREFIX + rf"the same file names, but a size, version or content changed; the file being read, {reading}, "
        "is unchanged" + SUFFIX,
    ):
        resume(str(shards), state)


def test_resume_accepts_the_same_files_named_as_a_folder_a_glob_or_a_list(shards) -> None:
    state, rest = saved_state(str(shards))
    files = [str(shards / f"s{i}.parquet") for i in range(4)]
    assert resume(str(shards / "s*.parquet"), state) == rest
    assert resume(files, state) == rest
    with pytest.raises(StateMismatchError, match=PREFIX + "the same 4 files in another order" + SUFFIX):
        resume(files[::-1], state)


def replace_with_same_size(path) -> None:
    """Other rows of exactly the same byte size (uncompressed pages: one letter changed), written later."""
    data = path.read_bytes().replace(b"word", b"WORD")
    stat = path.stat()
    path.write_bytes(data)
    os.utime(path, (stat.st_atime, stat.st_mtime + 5))
    assert path.stat().st_size == stat.st_size


@pytest.mark.parametrize("on_missing", ["raise", "skip"])
def test_a_file_replaced_mid_epoch_by_one_of_the_same_size_is_detected(shards, on_missing) -> None:
    paths = [str(shards / f"s{i}.parquet") for i in range(4)]
    pipe_ = pp.read_parquet(paths, chunk_rows=20, on_missing=on_missing).tokenize(TOK, num_threads=1).batch(10).pad()
    loader = pipe_.loader()
    it = iter(loader)
    rids = next(it)["rid"].tolist()  # reads s0 only
    replace_with_same_size(shards / "s2.parquet")
    if on_missing == "raise":
        pattern = (
            rf"^{re.escape(paths[2])}: has version [\d.]+ \(modification time or ETag\), but had [\d.]+ when it "
            r"was listed; it was replaced since; pass on_missing='skip' to skip such files\.$"
        )
        with pytest.raises(DataError, match=pattern):
            for batch in it:
                rids += batch["rid"].tolist()
        assert rids == list(range(200))  # s0 and s1, nothing of the new s2
        return
    rids += [r for batch in it for r in batch["rid"].tolist()]
    assert rids == list(range(200)) + list(range(300, 400))
    assert loader.stats().skipped == {"read.missing_file": 1}


def test_a_moved_folder_is_another_input(shards, tmp_path) -> None:
    state, _ = saved_state(str(shards))
    moved = tmp_path / "moved"
    shutil.copytree(shards, moved)
    with pytest.raises(
        StateMismatchError,
        match=PREFIX + "4 files as when saved, but other names: " + r".*is no longer listed" + SUFFIX,
    ):
        resume(str(moved), state)
