import os
import re

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import padpipe as pp
from padpipe.readers.paths import check_paths, expand_paths


@pytest.fixture
def tree(tmp_path):
    for name in [
        "b.parquet",
        "a.parquet",
        "sub/c.parquet",
        "sub/deeper/d.parquet",
        "notes.txt",
        "_SUCCESS",
        ".hidden/e.parquet",
        "_tmp/f.parquet",
    ]:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x")
    return tmp_path


def names(files):
    return [f.name for f in files]


def test_expand_paths_works_on_a_folder_recursively_sorted(tree):
    files = expand_paths([str(tree)], suffixes=(".parquet",))
    assert names(files) == [str(tree / n) for n in ["a.parquet", "b.parquet", "sub/c.parquet", "sub/deeper/d.parquet"]]
    assert all(f.is_local for f in files)


def test_expand_paths_works_on_files_globs_and_lists_in_the_order_given(tree):
    files = expand_paths(
        [str(tree / "sub/*.parquet"), str(tree / "notes.txt"), str(tree / "*.parquet")], suffixes=(".parquet",)
    )
    assert names(files) == [str(tree / n) for n in ["sub/c.parquet", "notes.txt", "a.parquet", "b.parquet"]]
    recursive = expand_paths([str(tree / "**/*.parquet")], suffixes=(".parquet",))
    assert str(tree / "sub/deeper/d.parquet") in names(recursive)


def test_expand_paths_works_on_fsspec_urls():
    fs = fsspec.filesystem("memory")
    for name in ["/paths_test/x.jsonl", "/paths_test/y.jsonl.gz", "/paths_test/z.txt"]:
        fs.pipe(name, b"{}\n")
    files = expand_paths(["memory://paths_test"], suffixes=(".jsonl", ".jsonl.gz"))
    assert names(files) == ["memory:///paths_test/x.jsonl", "memory:///paths_test/y.jsonl.gz"]
    assert not files[0].is_local and files[0].open().read() == b"{}\n" and files[0].size() == 3


def test_expand_paths_works_on_file_urls(tree):
    assert names(expand_paths([f"file://{tree}/a.parquet"], suffixes=(".parquet",))) == [str(tree / "a.parquet")]


def test_expand_paths_uses_a_folder_hook_when_it_answers(tree):
    files = expand_paths([str(tree / "sub")], suffixes=(".parquet",), folder_files=lambda fs, folder: [folder + "/x"])
    assert names(files) == [str(tree / "sub") + "/x"]


def test_expand_paths_raises_error_when_nothing_matches(tree):
    with pytest.raises(FileNotFoundError, match=r"^No such file or folder: '.*/missing\.parquet'\.$"):
        expand_paths([str(tree / "missing.parquet")], suffixes=(".parquet",))
    pattern = str(tree / "*.arrow")
    with pytest.raises(
        FileNotFoundError,
        match=rf"^{re.escape(repr(pattern))} matches no files; expected at least one \.arrow file there\.$",
    ):
        expand_paths([pattern], suffixes=(".arrow",))
    with pytest.raises(FileNotFoundError, match=r"matches no files; expected at least one \.jsonl/\.jsonl\.gz file"):
        expand_paths([str(tree / "sub")], suffixes=(".jsonl", ".jsonl.gz"))


def test_check_paths_raises_error_when_paths_is_not_paths():
    assert check_paths(["a", "b"]) == ("a", "b")
    with pytest.raises(TypeError, match=r"^`paths` must be a path, a glob or a list of them, but is 3 instead\.$"):
        check_paths(3)
    with pytest.raises(
        ValueError, match=r"^`paths` must name at least one file, folder or glob, but is \(\) instead\.$"
    ):
        check_paths(())


@pytest.mark.parametrize("given", ["folder", "glob"])
def test_a_folder_or_glob_of_links_is_read_with_the_targets_versions(tmp_path, given) -> None:
    source = tmp_path / "source.parquet"
    pq.write_table(pa.table({"id": [0, 1, 2]}), source)
    os.utime(source, (1_000_000, 1_000_000))  # older than the link: the link's own mtime differs
    (tmp_path / "links").mkdir()
    (tmp_path / "links" / "a.parquet").symlink_to(source)
    paths = str(tmp_path / "links") if given == "folder" else str(tmp_path / "links" / "*.parquet")
    rows = [r["id"] for batch in pp.read_parquet(paths).loader() for r in batch.to_pylist()]
    assert rows == [0, 1, 2]  # before: "has version 1000000.0 ..., but had <the link's mtime> when it was listed"
