"""A file reader's state does not grow with the file count: a digest of the listing and the file being read.

Before, a reader state held every file's name, size and version (about 100 bytes a file: 1 MB for a
10,000-shard corpus, in every worker's state of every rank of every checkpoint). Now it holds a
constant-size digest and the line of the file being read; a changed listing is still refused.
"""

from __future__ import annotations

import io
import json
import re

import pytest
import torch

import padpipe as pp
from padpipe import StateMismatchError
from padpipe.readers.listing_state import DigestSpec, ListingDigest, listing_difference
from padpipe.state import CHECKSUM_KEY, Invalid, checksum

FILES = 10_000


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """10,000 one-row JSONL shards, named like a real corpus's."""
    folder = tmp_path_factory.mktemp("corpus") / "train" / "language=en" / "split=train"
    folder.mkdir(parents=True)
    for i in range(FILES):
        (folder / f"part-{i:05d}-of-{FILES:05d}.jsonl").write_text(json.dumps({"id": i, "text": f"doc {i}"}) + "\n")
    return folder


def reader_states(state):
    """Every reader state in a loader state (dicts holding a listing digest under ``"files"``)."""
    if isinstance(state, dict):
        if isinstance(state.get("files"), dict):
            yield state
        for value in state.values():
            yield from reader_states(value)
    elif isinstance(state, list):
        for value in state:
            yield from reader_states(value)


def reseal(state) -> None:
    """Recompute every checksum in ``state``, innermost first (as if padpipe 2 had saved the edited values)."""
    for value in state.values() if isinstance(state, dict) else state if isinstance(state, list) else ():
        reseal(value)
    if isinstance(state, dict) and CHECKSUM_KEY in state:
        state[CHECKSUM_KEY] = checksum(state)


@pytest.mark.slow  # reads all 10,000 files (~8 s alone)
def test_a_state_of_a_10000_file_corpus_stays_under_100_kb_and_resumes_every_row_once(corpus) -> None:
    pipe = pp.read_jsonl(str(corpus), chunk_rows=64)  # one row a file: a chunk a file
    loader = pipe.loader()
    it = iter(loader)
    seen = [r["id"] for _ in range(40) for r in next(it).to_pylist()]
    state = loader.state_dict()
    buffer = io.BytesIO()
    torch.save(state, buffer)
    assert len(buffer.getvalue()) < 100_000 and len(json.dumps(state)) < 10_000
    (reader,) = reader_states(state)
    assert reader["files"]["count"] == FILES
    assert reader["file"].startswith(f"{corpus}/part-{len(seen) - 1:05d}-of-10000.jsonl\t")  # read to its end
    resumed = pipe.loader()
    resumed.load_state_dict(state)
    rest = [r["id"] for batch in resumed for r in batch.to_pylist()]
    assert seen + rest == list(range(FILES))


@pytest.mark.slow  # seconds alone: make test runs it, test-fast leaves it out
def test_the_state_is_as_small_for_10000_files_as_for_one(corpus) -> None:
    def size(paths) -> int:
        loader = pp.read_jsonl(paths, chunk_rows=1).loader()
        next(iter(loader))
        return len(json.dumps(loader.state_dict()))

    one = size(str(corpus / "part-00000-of-10000.jsonl"))
    assert size(str(corpus)) - one < 100  # digests have a fixed length; only the count's digits differ


def test_resume_refuses_a_version_2_state_in_one_line(corpus) -> None:
    loader = pp.read_jsonl(str(corpus / "part-0000*.jsonl")).loader()
    next(iter(loader))
    state = loader.state_dict()
    for reader in reader_states(state):
        reader.update(version=2, files="a.jsonl\t10\t1.0")
        del reader["file"]
    reseal(state)
    resumed = pp.read_jsonl(str(corpus / "part-0000*.jsonl")).loader()
    with pytest.raises(
        StateMismatchError,
        match=r"^JsonlReader state doesn't match this pipeline: version found 2 instead of 3\.$",
    ):
        resumed.load_state_dict(state)
        next(iter(resumed))


@pytest.mark.parametrize("version", [torch.tensor([0, 0, 0], dtype=torch.int32), [2], 2.0, "2"])
def test_resume_refuses_a_reader_state_whose_version_is_not_a_number_in_one_line(corpus, version) -> None:
    loader = pp.read_jsonl(str(corpus / "part-0000*.jsonl")).loader()
    next(iter(loader))
    state = loader.state_dict()
    for reader in reader_states(state):
        reader.update(version=version, files="a.jsonl\t10\t1.0")  # with checksums recomputed (reseal)
    reseal(state)
    resumed = pp.read_jsonl(str(corpus / "part-0000*.jsonl")).loader()
    with pytest.raises(StateMismatchError, match=r"^JsonlReader state doesn't match this pipeline: [^\n]*version"):
        resumed.load_state_dict(state)
        next(iter(resumed))


def test_listing_difference_tells_each_kind_of_change() -> None:
    saved = ListingDigest.of("a\t1\tv1\nb\t2\tv1\nc\t3\tv1")
    reading = "b\t2\tv1"
    cases = {
        "a\t1\tv1\nb\t2\tv1\nc\t3\tv1": None,
        "a\t1\tv1\nc\t3\tv1\nb\t2\tv1": "the same 3 files in another order",
        "a\t1\tv1\nb\t2\tv1\nc\t3\tv1\nd\t4\tv1": "3 files when saved, 4 now: files were added or removed; "
        "the file being read, b, is unchanged",
        "a\t1\tv1\nc\t3\tv1": "3 files when saved, 2 now: files were added or removed; "
        "the file being read, b, is no longer listed",
        "a\t1\tv1\nB\t2\tv1\nc\t3\tv1": "3 files as when saved, but other names: files were renamed, or added and "
        "removed; the file being read, b, is no longer listed",
        "a\t1\tv1\nb\t2\tv2\nc\t3\tv1": "the same file names, but a size, version or content changed; "
        "the file being read changed: b (version v1 -> v2)",
        "a\t1\tv1\nb\t2\tv1\tbeef\nc\t3\tv1": "the same file names, but a size, version or content changed; "
        "the file being read changed: b (content ? -> beef, same size and version)",
    }
    for now, words in cases.items():
        assert listing_difference(saved, reading, now) == words, now
    assert (
        listing_difference(saved, "", "a\t1\tv1\nb\t2\tv1") == "3 files when saved, 2 now: files were added or removed"
    )


@pytest.mark.parametrize(
    "value",
    [
        "a\t1\tv1",
        {"count": 1, "lines": "0" * 32, "names": "0" * 32},
        {"count": -1, "lines": "0" * 32, "names": "0" * 32, "unordered": "0" * 32},
        {"count": True, "lines": "0" * 32, "names": "0" * 32, "unordered": "0" * 32},
        {"count": 1, "lines": "../x", "names": "0" * 32, "unordered": "0" * 32},
    ],
)
def test_digest_spec_raises_error_on_anything_but_a_listing_digest(value) -> None:
    with pytest.raises(Invalid, match=re.escape("a dict of 'count' (an int >= 0) and 'lines', 'names', 'unordered'")):
        DigestSpec().load(value)
