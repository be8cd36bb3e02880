"""Listings shared by DataLoader workers: plain JSON in a private folder, never unpickled (13.2).

Before, listings were pickled to the predictable ``$TMPDIR/padpipe-<uid>/`` (accepted whatever its
owner or mode) and unpickled by the main process: a replaced file ran code. Now the folder's name
holds a random token, it is used only when it is a real folder of this user closed to others,
files hold JSON, and a bad file is ignored (the worker lists by itself).
"""

from __future__ import annotations

import gc
import json
import os
import pathlib
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import padpipe as pp
from padpipe.readers import listing as _listing
from padpipe.readers.listing import SharedListing


def worker_copy(listing: SharedListing) -> SharedListing:
    """The listing as a DataLoader worker (another process) sees it: same token, another owner pid."""
    copy = SharedListing.__new__(SharedListing)
    copy.__setstate__({**listing.__getstate__(), "owner": listing._owner + 10**6})
    return copy


def folder_of(listing: SharedListing, owner: int) -> str:
    return listing.folder.replace(f"-{listing._owner}-", f"-{owner}-")


@pytest.fixture
def shared(monkeypatch, tmp_path):
    monkeypatch.setattr(_listing.tempfile, "gettempdir", lambda: str(tmp_path))
    return SharedListing()


def test_workers_share_a_listing_as_json_in_a_private_folder(shared, tmp_path) -> None:
    worker = worker_copy(shared)
    assert worker.get("key", lambda: [1, 2]) == [1, 2]
    folder = worker.folder
    assert os.path.basename(folder).startswith(f"padpipe-{os.getuid()}-{worker._owner}-")
    assert os.stat(folder).st_mode & 0o777 == 0o700
    [name] = [n for n in os.listdir(folder) if n.endswith(".json")]
    assert json.loads(pathlib.Path(folder, name).read_text()) == {"key": "key", "listing": [1, 2]}
    assert worker_copy(shared).get("key", lambda: 1 / 0) == [1, 2]  # a second worker reads it


def test_a_folder_others_can_use_is_not_used(shared, tmp_path) -> None:
    worker = worker_copy(shared)
    os.mkdir(worker.folder, 0o777)
    os.chmod(worker.folder, 0o777)  # as another user could make it
    with pytest.warns(
        RuntimeWarning,
        match=r"^padpipe: not sharing file listings through \S+: others have access \(mode 777\); each worker lists its files itself\.$",
    ):
        assert worker.get("key", lambda: [3]) == [3]
    assert os.listdir(worker.folder) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give the folder to another user")
def test_a_folder_of_another_user_is_not_used(shared) -> None:
    worker = worker_copy(shared)
    os.mkdir(worker.folder, 0o700)
    os.chown(worker.folder, 12345, 12345)
    with pytest.warns(RuntimeWarning, match=r"it belongs to uid 12345"):
        assert worker.get("key", lambda: [4]) == [4]


def test_a_replaced_listing_file_is_never_executed(shared, tmp_path) -> None:
    worker = worker_copy(shared)
    worker.get("key", lambda: [1])
    [name] = [n for n in os.listdir(worker.folder) if n.endswith(".json")]
    marker = tmp_path / "ran"
    payload = f"cos\nsystem\n(S'touch {marker}'\ntR."  # a pickle that runs a command when unpickled
    pathlib.Path(worker.folder, name).write_text(payload)
    assert worker_copy(shared).get("key", lambda: [5]) == [5]  # not JSON: listed again
    assert not marker.exists()


def test_the_folder_is_removed_when_the_pipeline_goes_and_stale_ones_on_next_start(shared, monkeypatch) -> None:
    os.mkdir(shared.folder, 0o700)  # as the first worker makes it
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = folder_of(shared, int(dead.stdout))
    os.mkdir(stale, 0o700)
    open(os.path.join(stale, "listing-x.json"), "w").close()
    monkeypatch.setattr(_listing, "_swept", False)
    worker_copy(SharedListing()).get("other", lambda: [2])  # the next process that shares a listing
    assert not os.path.exists(stale)  # its owner is gone
    assert os.path.isdir(shared.folder)  # this one's owner (this process) is alive
    mine = SharedListing()  # a pipeline's listing, dropped with the pipeline
    os.mkdir(mine.folder, 0o700)
    folder = mine.folder
    del mine
    gc.collect()
    assert not os.path.exists(folder)


def test_dataloader_workers_list_once_and_the_folder_goes_at_exit(tmp_path) -> None:
    for i in range(3):
        pq.write_table(pa.table({"text": [f"t{i} {j}" for j in range(40)]}), tmp_path / f"f{i}.parquet")
    script = (
        "import os, sys, torch, padpipe as pp\n"
        f"pipe = pp.read_parquet({str(tmp_path)!r}, chunk_rows=10)\n"
        "loader = torch.utils.data.DataLoader(pipe, batch_size=None, num_workers=2, multiprocessing_context='fork')\n"
        "print(sum(b.num_rows for b in loader))\n"
        "listing = pipe.source.options['listing']\n"
        "print(os.path.isdir(listing.folder), listing.folder)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.getcwd(), "TMPDIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    rows, used, folder = done.stdout.split()
    assert (rows, used) == ("120", "True")  # the workers shared the listing through the folder
    assert not os.path.exists(folder)
    assert not [n for n in os.listdir(tmp_path) if n.startswith("padpipe-")]


def test_a_glob_that_matches_nothing_raises_one_clean_error(tmp_path) -> None:
    with pytest.raises(
        FileNotFoundError,
        match=r"^'\S+/\*\.parquet' matches no files; expected at least one \.parquet/\.parq/\.pq file there\.$",
    ) as info:
        next(iter(pp.read_parquet(str(tmp_path / "*.parquet")).loader()))
    assert info.value.__context__ is None and info.value.__cause__ is None


def test_listings_and_paths_never_unpickle() -> None:
    from padpipe.readers import paths as _paths

    for module in (_listing, _paths):
        source = pathlib.Path(module.__file__).read_text()
        assert "import pickle" not in source and "pickle.load" not in source


@pytest.mark.parametrize("fmt", ["parquet", "arrow", "jsonl"])
def test_every_reader_reads_the_same_rows_from_a_listing_shared_as_json(shared, tmp_path, monkeypatch, fmt) -> None:
    from padpipe import Consumer
    from padpipe.readers.arrow import ArrowReader
    from padpipe.readers.jsonl import JsonlReader
    from padpipe.readers.parquet import ParquetReader

    table = pa.table({"text": [f"t {i}" for i in range(30)], "id": list(range(30))})
    for i in range(2):
        part = table.slice(15 * i, 15)
        if fmt == "parquet":
            pq.write_table(part, tmp_path / f"p{i}.parquet", row_group_size=4)
        elif fmt == "arrow":
            with pa.ipc.new_stream(str(tmp_path / f"p{i}.arrow"), part.schema) as writer:
                for batch in part.to_batches(max_chunksize=4):
                    writer.write_batch(batch)
        else:
            (tmp_path / f"p{i}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part.to_pylist()))
    reader = {"parquet": ParquetReader, "arrow": ArrowReader, "jsonl": JsonlReader}[fmt]

    def read(listing: SharedListing) -> list:
        node = reader(paths=str(tmp_path / f"p*.{fmt}"), chunk_rows=5, consumer=Consumer(), listing=listing)
        node.reset()
        return [r for b in node for r in b.to_pylist()] + [node.state_dict()["files"]]

    first = read(worker_copy(shared))  # lists and writes the JSON file
    monkeypatch.setattr("padpipe.readers.files.expand_paths", lambda *a, **k: 1 / 0)
    again = read(worker_copy(shared))  # reads it: lists nothing
    assert again == first and [r["id"] for r in first[:-1]] == list(range(30))
