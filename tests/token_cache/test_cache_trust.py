"""Trust boundaries of the token cache and of states: files rewritten in place, crafted cache files, crafted states.

Each test is the attack that fooled padpipe before: a source rewritten with other text of the
same size and mtime (``cp -p``, ``rsync -t``), segment files that pass their size and CRC check
but hold impossible ids, states whose folders point outside the cache, and temporary files left
by a writer killed mid-write.
"""

from __future__ import annotations

import json
import os
import re
import time

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest

import padpipe as pp
from padpipe.state import CHECKSUM_KEY, checksum
from padpipe.token_cache import rows as cr
from padpipe.token_cache import store as _cache_store
from padpipe.token_cache.store import FORMAT, Segment, Store, ipc_bytes

pytestmark = pytest.mark.timeout(120)

ROWS = 300
TOK = pp.examples.tokenizer()


def texts(word: str) -> list[str]:
    """Texts of one length whatever ``word`` (5 letters): a rewrite keeps the file's size."""
    return [f"{word} {i:04d} {word}" for i in range(ROWS)]


def write(path, word: str) -> None:
    rows = [{"idx": i, "text": t} for i, t in enumerate(texts(word))]
    if str(path).endswith(".parquet"):  # plain encoding, no statistics: the size is the text's length
        pq.write_table(
            pa.Table.from_pylist(rows),
            path,
            row_group_size=70,
            compression="none",
            use_dictionary=False,
            write_statistics=False,
        )
    else:
        path.write_bytes(b"".join(json.dumps(r).encode() + b"\n" for r in rows))


def rewrite_keeping_size_and_mtime(path, word: str) -> None:
    before = os.stat(path)
    write(path, word)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = os.stat(path)
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)


def reader(path):
    return (
        pp.read_parquet(str(path), chunk_rows=16)
        if str(path).endswith(".parquet")
        else pp.read_jsonl(str(path), chunk_rows=16)
    )


def pipeline(path, cache=None, **tokenize):
    return reader(path).tokenize(TOK, fields="text", cache=cache, **tokenize).batch(16).pad()


def ids_by_row(loader) -> dict[int, list[int]]:
    out = {}
    for batch in loader:
        for idx, ids, mask in zip(batch["idx"].tolist(), batch["input_ids"], batch["attention_mask"]):
            out[idx] = ids[: int(mask.sum())].tolist()
    return out


def counter(loader, name):
    return loader.stats().counters.get(name, 0)


# -- 1. content identity ------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["data.parquet", "data.jsonl"])
def test_token_cache_misses_when_a_file_is_rewritten_with_the_same_size_and_mtime(tmp_path, name):
    path, cache = tmp_path / name, str(tmp_path / "cache")
    write(path, "alpha")
    old = pipeline(path, cache).loader()
    assert len(ids_by_row(old)) == ROWS and counter(old, "cache.miss_rows") == ROWS
    rewrite_keeping_size_and_mtime(path, "gamma")
    loader = pipeline(path, cache).loader()
    got = ids_by_row(loader)
    assert counter(loader, "cache.hit_rows") == 0 and counter(loader, "cache.miss_rows") == ROWS
    assert got == {i: TOK.encode(t).ids for i, t in enumerate(texts("gamma"))}
    again = pipeline(path, cache).loader()
    assert ids_by_row(again) == got and counter(again, "cache.hit_rows") == ROWS


@pytest.mark.parametrize("name", ["data.parquet", "data.jsonl"])
def test_token_cache_raises_error_when_a_listed_file_is_rewritten_under_a_pipeline(tmp_path, name):
    path, cache = tmp_path / name, str(tmp_path / "cache")
    write(path, "alpha")
    pipe = pipeline(path, cache)
    ids_by_row(pipe.loader())
    rewrite_keeping_size_and_mtime(path, "gamma")  # this pipeline keeps its listing: the old digest
    pattern = (
        rf"^{re.escape(str(path))}: its content is not what it was when it was listed \(digest [0-9a-f]{{16}} "
        r"-> [0-9a-f]{16}, although size and version are the same\); it was rewritten since; pass on_missing"
    )
    with pytest.raises(pp.DataError, match=pattern):
        ids_by_row(pipe.loader())


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("name", ["data.jsonl", "data.parquet"])
def test_token_cache_raises_error_when_a_file_is_rewritten_between_epochs_of_one_loader(tmp_path, name, num_workers):
    path, cache = tmp_path / name, str(tmp_path / "cache")
    write(path, "alpha")
    loader = pipeline(path, cache).loader(num_workers=num_workers)
    assert ids_by_row(loader) == {i: TOK.encode(t).ids for i, t in enumerate(texts("alpha"))}
    rewrite_keeping_size_and_mtime(path, "gamma")  # a row in the first 64 KiB, the same size and mtime
    pattern = (
        rf"(?m)^(padpipe\.errors\.DataError: )?{re.escape(str(path))}: its content is not what it was when it was "
        r"listed \(digest [0-9a-f]{16} -> [0-9a-f]{16}, although size and version are the same\); it was rewritten "
        r"since; pass on_missing='skip' to skip such files\.$"
    )  # with workers, the DataLoader's "Caught DataError in DataLoader worker process 0" comes first
    with pytest.raises(pp.DataError, match=pattern):
        ids_by_row(loader)  # epoch 2 of the same loader: never the old ids


def test_reader_reads_a_file_found_unchanged_again_only_when_its_stat_changes(tmp_path, monkeypatch):
    from padpipe.readers import paths

    path, cache = tmp_path / "data.jsonl", str(tmp_path / "cache")
    write(path, "alpha")
    reads = []
    check = paths.FileRef.check_unchanged
    monkeypatch.setattr(paths.FileRef, "check_unchanged", lambda ref: reads.append(ref.name) or check(ref))
    monkeypatch.setattr(paths, "SETTLED_NS", 10**30)
    loader = pipeline(path, cache).loader()
    ids_by_row(loader)
    ids_by_row(loader)
    assert reads == [str(path)] * 2  # changed lately: its ctime may not tell a second write in the same tick
    monkeypatch.setattr(paths, "SETTLED_NS", 0)
    for _ in range(3):
        ids_by_row(loader)
    assert reads == [str(path)] * 3  # settled: read once more, then only stat-ed
    rewrite_keeping_size_and_mtime(path, "gamma")  # restoring the mtime sets the ctime
    with pytest.raises(pp.DataError, match=rf"^{re.escape(str(path))}: its content is not what it was when"):
        ids_by_row(loader)
    assert reads == [str(path)] * 4


def test_reader_raises_error_when_a_file_is_rewritten_between_epochs_without_a_cache(tmp_path):
    path = tmp_path / "data.parquet"
    write(path, "alpha")
    loader = pipeline(path).loader()
    ids_by_row(loader)
    rewrite_keeping_size_and_mtime(path, "gamma")  # read against the old listing, row groups could be others
    with pytest.raises(pp.DataError, match=rf"^{re.escape(str(path))}: its content is not what it was when"):
        ids_by_row(loader)


def test_reader_skips_a_file_rewritten_between_epochs_when_asked(tmp_path):
    kept, changed = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    write(kept, "alpha")
    write(changed, "alpha")
    loader = pp.read_jsonl(str(tmp_path), chunk_rows=16, on_missing="skip").tokenize(TOK, fields="text")
    loader = loader.batch(16).pad().loader()
    assert len(ids_by_row(loader)) == ROWS  # idx repeats across the two files
    rewrite_keeping_size_and_mtime(changed, "gamma")
    rows = sum(len(batch["idx"]) for batch in loader)
    assert rows == ROWS and loader.stats().skipped == {"read.missing_file": 1}


def mid_epoch_state(pipe):
    loader = pipe.loader()
    it = iter(loader)
    for _ in range(3):
        next(it)
    return loader.state_dict()


@pytest.mark.parametrize("name", ["data.parquet", "data.jsonl"])
def test_resume_raises_error_naming_a_file_rewritten_with_the_same_size_and_mtime(tmp_path, name):
    path = tmp_path / name
    write(path, "alpha")
    stage = "ParquetReader" if name.endswith(".parquet") else "JsonlReader"
    state = mid_epoch_state(pipeline(path))
    rewrite_keeping_size_and_mtime(path, "gamma")
    fresh = pipeline(path).loader()  # a new run lists again
    pattern = (
        rf"{stage} state doesn't match this pipeline: its files changed since the state was saved \(the same file "
        r"name, but a size, version or content changed; the file being read changed: "
        rf"{re.escape(str(path))} \(content [0-9a-f]{{16}} -> [0-9a-f]{{16}}, same size and version\)\)"
    )
    with pytest.raises(pp.StateMismatchError, match=pattern):
        fresh.load_state_dict(state)
        next(iter(fresh))


def test_resume_raises_error_when_a_file_is_rewritten_under_a_pipeline_that_listed_it(tmp_path):
    path = tmp_path / "data.parquet"
    write(path, "alpha")
    pipe = pipeline(path)
    state = mid_epoch_state(pipe)
    rewrite_keeping_size_and_mtime(path, "gamma")
    loader = pipe.loader()  # the listing in memory still has the old digest
    pattern = (
        rf"^ParquetReader state doesn't match this pipeline: {re.escape(str(path))}: its content is not what it "
        r"was when it was listed .*; resuming would read other rows"
    )
    with pytest.raises(pp.StateMismatchError, match=pattern):
        loader.load_state_dict(state)
        next(iter(loader))


def test_content_digest_covers_small_files_whole_and_large_ones_by_their_ends(tmp_path):
    from padpipe.readers.content import EDGE_BYTES, FULL_BYTES
    from padpipe.readers.paths import expand_paths

    def digest(path):
        return expand_paths([str(path)], suffixes=(".jsonl",))[0].measured().listed_content

    path = tmp_path / "big.jsonl"
    line = b'{"text": "' + b"x" * 1000 + b'"}\n'
    data = bytearray(line * (3 * FULL_BYTES // len(line)))
    path.write_bytes(bytes(data))
    before = digest(path)
    for where, seen in (
        (100, True),
        (len(data) - 100, True),
        (len(data) // 2, False),
    ):  # the middle: the documented limit
        changed = bytearray(data)
        changed[where] = ord("y")
        path.write_bytes(bytes(changed))
        assert (digest(path) != before) is seen, where
    small = tmp_path / "small.jsonl"
    small.write_bytes(bytes(data[:FULL_BYTES]))
    first = digest(small)
    small.write_bytes(bytes(data[: FULL_BYTES // 2]) + b"y" + bytes(data[FULL_BYTES // 2 + 1 : FULL_BYTES]))
    assert digest(small) != first and EDGE_BYTES < FULL_BYTES // 2


def test_content_digest_covers_a_parquet_footer_longer_than_the_tail_read(tmp_path):
    from padpipe.readers.content import EDGE_BYTES, content_digest

    footer = b"f" * (EDGE_BYTES * 2)
    data = b"PAR1" + b"d" * (2 << 20) + footer + len(footer).to_bytes(4, "little") + b"PAR1"
    edited = data[: 4 + (2 << 20) + 10] + b"g" + data[4 + (2 << 20) + 11 :]  # in the footer, before the last 64 KiB
    assert content_digest(lambda a, b: data[a:b], len(data)) != content_digest(lambda a, b: edited[a:b], len(edited))


def test_no_content_digest_is_taken_where_the_store_gives_an_etag():
    import fsspec

    from padpipe.readers.paths import _ref

    fs = fsspec.filesystem("memory")
    assert _ref(fs, "/a.parquet", {"size": 3, "ETag": '"9b2c"'}).measured().listed_content is None
    assert _ref(fs, "/a.parquet", {"size": 3, "ETag": '"9b2c"'}).identity == 'memory:///a.parquet\t3\t"9b2c"'


# -- 2. segments that pass their CRC but not their checks ---------------------------------------------
def segment_files(cache):
    return sorted(p for p in (cache / FORMAT).rglob("*.arrow"))


def replace_segment(path, table) -> None:
    """Publish ``table`` in place of the segment at ``path``, under a valid name (size and CRC of the new bytes)."""
    old = Segment.parse(path.name)
    store = Store(str(path.parents[3]))
    folder = f"{path.parent.parent.name}/{path.parent.name}"
    store.write(folder, Segment(old.lo, old.hi, old.end, 0, 0), ipc_bytes(table))
    path.unlink()


def with_ids(table, ids: pa.Array, type_ids: pa.Array | None = None) -> pa.Table:
    table = table.set_column(table.schema.get_field_index(cr.IDS), cr.IDS, ids)
    if type_ids is not None:
        table = table.set_column(table.schema.get_field_index(cr.TYPE_IDS), cr.TYPE_IDS, type_ids)
    return table


def crafted(table, how: str) -> pa.Table:
    ids = table.column(cr.IDS).combine_chunks()
    rows = ids.to_pylist()
    if how == "id past the vocabulary":
        rows[0] = rows[0][:-1] + [65535]
        return with_ids(table, pa.array(rows, ids.type))
    if how == "row longer than max_length":
        rows[0] = rows[0] * 20
        types = table.column(cr.TYPE_IDS).to_pylist()
        types[0] = types[0] * 20
        return with_ids(table, pa.array(rows, ids.type), pa.array(types, pa.list_(pa.int8())))
    if how == "ids longer than their type ids":
        types = table.column(cr.TYPE_IDS).to_pylist()
        types[0] = types[0][:-1]
        return with_ids(table, ids, pa.array(types, pa.list_(pa.int8())))
    if how == "offsets not monotone":
        offsets = np.asarray(ids.offsets).copy()
        offsets[1], offsets[2] = offsets[2], offsets[1]
        broken = pa.Array.from_buffers(
            ids.type, len(ids), [None, pa.py_buffer(offsets.astype(np.int32))], children=[ids.values]
        )
        return with_ids(table, broken)
    raise AssertionError(how)


HOWS = [
    "id past the vocabulary",
    "row longer than max_length",
    "ids longer than their type ids",
    "offsets not monotone",
]


@pytest.mark.parametrize("how", HOWS)
def test_token_cache_rejects_a_crafted_segment_with_a_valid_checksum_and_tokenizes_again(tmp_path, how):
    path, cache = tmp_path / "data.parquet", tmp_path / "cache"
    write(path, "alpha")
    reference = ids_by_row(pipeline(path, max_length=8).loader())
    ids_by_row(pipeline(path, str(cache), max_length=8).loader())
    target = segment_files(cache)[0]
    table = ipc.open_file(str(target)).read_all()
    replace_segment(target, crafted(table, how))
    assert len(segment_files(cache)) == 5 and not target.exists()
    loader = pipeline(path, str(cache), max_length=8).loader()
    assert ids_by_row(loader) == reference
    assert counter(loader, "cache.bad_files") == 1 and counter(loader, "cache.miss_rows") == table.num_rows
    assert target.exists() and len(segment_files(cache)) == 5  # the crafted file is gone, the true one back


# -- 3. states that point outside the cache -----------------------------------------------------------
def cache_refs(state):
    """Every token-cache reference dict in a state, and the path of dicts down to it."""
    found = []

    def walk(value, trail):
        if isinstance(value, dict):
            if "token_cache" in value and "folders" in value:
                found.append((value, trail))
            for child in value.values():
                walk(child, trail + [value])
        elif isinstance(value, list):
            for child in value:
                walk(child, trail)

    walk(state, [])
    return found


def set_folders(state, folders) -> None:
    """Put ``folders`` into every reference of ``state`` and re-seal it, innermost first (a forger can)."""
    for refs, trail in cache_refs(state):
        refs["folders"] = [folders[0]] * len(refs["folders"])
        for node in [refs, *reversed(trail)]:
            if CHECKSUM_KEY in node:
                node[CHECKSUM_KEY] = checksum(node)


def referencing_state(tmp_path):
    path, cache = tmp_path / "data.parquet", str(tmp_path / "cache")
    write(path, "alpha")
    pipe = (
        reader(path)
        .shuffle(buffer_size=40, seed=3)
        .tokenize(TOK, fields="text", cache=cache)
        .bucket(max_tokens=512, buffer_size=60)
        .pad()
    )
    ids_by_row(pipe.loader())  # fill
    loader = pipe.loader()
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    assert cache_refs(state)
    return pipe, state


@pytest.mark.parametrize("attack", ["parent", "absolute", "dot-dot inside", "linked unit folder"])
def test_resume_refuses_a_state_whose_cache_folders_lead_outside_the_cache(tmp_path, monkeypatch, attack):
    pipe, state = referencing_state(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    real = segment_files(tmp_path / "cache")[0]
    decoy = outside / real.name
    decoy.write_bytes(real.read_bytes())
    bad = outside / "0-70-12-00000000.arrow"  # named as a segment, fails its checks: the old code deleted it
    bad.write_bytes(b"not a segment")
    fingerprint = real.parent.parent.name
    folder = {
        "parent": "../../outside",
        "absolute": str(outside),
        "dot-dot inside": f"{fingerprint}/../../outside",
        "linked unit folder": f"{fingerprint}/{'f' * 20}",
    }[attack]
    if attack == "linked unit folder":
        os.symlink(outside, real.parent.parent / ("f" * 20))
    set_folders(state, [folder])
    touched = []
    listdir, memory_map = os.listdir, pa.memory_map
    monkeypatch.setattr(_cache_store.os, "listdir", lambda p=".": touched.append(str(p)) or listdir(p))
    monkeypatch.setattr(_cache_store.pa, "memory_map", lambda p, *a: touched.append(str(p)) or memory_map(p, *a))
    loader = pipe.loader()
    with pytest.raises(
        pp.StateMismatchError,
        match=rf"token cache references name the folder {re.escape(repr(folder))}, "
        r"which is not a unit folder of the token cache at '.*'",
    ):
        loader.load_state_dict(state)
        next(iter(loader))
    assert not [p for p in touched if "outside" in p]
    assert decoy.exists() and bad.exists()


def test_token_cache_never_follows_a_unit_folder_linked_outside_the_cache(tmp_path):
    path, cache = tmp_path / "data.parquet", tmp_path / "cache"
    write(path, "alpha")
    ids_by_row(pipeline(path, str(cache)).loader())
    unit = segment_files(cache)[0].parent
    outside = tmp_path / "outside"
    unit.rename(outside)
    (outside / "0-70-12-00000000.arrow").write_bytes(b"not a segment")
    os.symlink(outside, unit)
    with pytest.raises(
        pp.cache.CacheError,
        match=rf"^token cache: '[0-9a-f]{{20}}/{unit.name}' is not a folder of the "
        r"cache at '.*'; refusing to use it\.$",
    ):
        ids_by_row(pipeline(path, str(cache)).loader())
    assert (outside / "0-70-12-00000000.arrow").exists()


def test_token_cache_never_reads_a_segment_file_that_is_a_link(tmp_path):
    path, cache = tmp_path / "data.parquet", tmp_path / "cache"
    write(path, "alpha")
    reference = ids_by_row(pipeline(path).loader())
    ids_by_row(pipeline(path, str(cache)).loader())
    segment = segment_files(cache)[0]
    outside = tmp_path / "outside.arrow"
    segment.rename(outside)
    os.symlink(outside, segment)
    loader = pipeline(path, str(cache)).loader()
    assert ids_by_row(loader) == reference and counter(loader, "cache.bad_files") == 1
    assert outside.exists() and not segment.is_symlink() and segment.is_file()  # the link replaced by a file


def test_resume_refuses_a_reader_state_that_names_other_files(tmp_path):
    path = tmp_path / "data.parquet"
    write(path, "alpha")
    state = mid_epoch_state(pipeline(path))
    for refs, trail in [(node, t) for node, t in _dicts_with(state, "file")]:
        refs["file"] = "../../outside/secret.parquet\t10\t1.0"
        for node in [refs, *reversed(trail)]:
            if CHECKSUM_KEY in node:
                node[CHECKSUM_KEY] = checksum(node)
    loader = pipeline(path).loader()
    with pytest.raises(
        pp.StateMismatchError,
        match=r"^ParquetReader state is invalid: 'file' must be the file at unit 0, '\S+data\.parquet\\t\d+\\t[\d.]+"
        r"\\t[0-9a-f]{16}', but is '\.\./\.\./outside/secret\.parquet\\t10\\t1\.0' instead\.$",
    ):
        loader.load_state_dict(state)
        next(iter(loader))


def _dicts_with(value, key, trail=()):
    if isinstance(value, dict):
        if key in value:
            yield value, list(trail)
        for child in value.values():
            yield from _dicts_with(child, key, (*trail, value))
    elif isinstance(value, list):
        for child in value:
            yield from _dicts_with(child, key, trail)


# -- 8. temporary files of writers that died ------------------------------------------------------------
def test_token_cache_sweeps_stale_temporary_files_and_keeps_fresh_ones(tmp_path):
    path, cache = tmp_path / "data.parquet", tmp_path / "cache"
    write(path, "alpha")
    ids_by_row(pipeline(path, str(cache)).loader())
    unit = segment_files(cache)[0].parent
    stale, fresh, about = unit / ".tmp-0123abcd", unit / ".tmp-4567ef01", unit.parent / ".tmp-89abcdef"
    for temp in (stale, fresh, about):
        temp.write_bytes(b"half a segment")
    old = time.time() - _cache_store.STALE_SECONDS - 60
    os.utime(stale, (old, old))
    os.utime(about, (old, old))
    loader = pipeline(path, str(cache)).loader()
    ids_by_row(loader)
    assert not stale.exists() and not about.exists() and fresh.exists()
    assert counter(loader, "cache.swept_temp_files") == 2
