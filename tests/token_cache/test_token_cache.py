"""The token cache: same batches as without it on every source kind, filled as a side effect, read later.

Every test compares against the same pipeline without a cache (tensor-equal batches, epoch by
epoch), counts what was read from the cache, and covers moving cut points (two consumers), worker
processes, resume with a half-filled cache, small states, bad files, key changes, unwritable
locations, fsspec URLs and the size report.
"""

from __future__ import annotations

import dataclasses
import errno
import gzip
import json
import os
import pickle
import re
import threading

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest

import padpipe as pp
from padpipe import Consumer
from padpipe.cache import CacheError, TokenCache
from padpipe.token_cache import walk
from padpipe.token_cache.store import FORMAT, Segment
from tests.contract import normalize

pytestmark = pytest.mark.timeout(120)

ROWS = 300


def documents(n=ROWS, seed=0):
    """Long-tail texts (a few long, most short) with a label and an id."""
    rng = np.random.default_rng(seed)
    words = ["alpha", "beta", "gamma", "delta", "token", "cache", "epoch", "batch", "row", "unit"]
    lengths = np.minimum(rng.pareto(1.2, n) * 6 + 1, 200).astype(int)
    return [{"idx": i, "text": " ".join(rng.choice(words, size=k)), "label": i % 3} for i, k in enumerate(lengths)]


@pytest.fixture(autouse=True)
def small_segments(monkeypatch):
    monkeypatch.setattr(walk, "SEGMENT_ROWS", 24)  # many segments per unit, cut anywhere


def write(tmp_path, kind, rows=None):
    rows = documents() if rows is None else rows
    table = pa.Table.from_pylist(rows)
    if kind == "parquet":
        path = tmp_path / "data.parquet"
        pq.write_table(table, path, row_group_size=70)
        return pp.read_parquet(str(path), chunk_rows=16)
    if kind == "arrow":
        path = tmp_path / "data.arrow"
        with ipc.new_file(str(path), table.schema) as writer:
            for batch in table.to_batches(max_chunksize=55):
                writer.write_batch(batch)
        return pp.read_arrow(str(path), chunk_rows=16)
    if kind in ("jsonl", "jsonl.gz"):
        data = b"".join(json.dumps(r).encode() + b"\n" for r in rows)
        path = tmp_path / f"data.{kind}"
        path.write_bytes(gzip.compress(data) if kind == "jsonl.gz" else data)
        pipe = pp.read_jsonl(str(path), chunk_rows=16)  # several byte-range units, several blocks each
        options = {**pipe.source.options, "unit_bytes": 3000, "block_bytes": 700}
        return dataclasses.replace(pipe, source=dataclasses.replace(pipe.source, options=options))
    if kind == "dataset":
        return pp.from_hf(datasets.Dataset.from_list(rows), chunk_rows=16)
    raise AssertionError(kind)


KINDS = ["parquet", "arrow", "jsonl", "jsonl.gz", "dataset"]


def stages(source, cache=None, **tokenize):
    return (
        source.shuffle(buffer_size=40, seed=3)
        .tokenize(pp.examples.tokenizer(), fields="text", max_length=64, cache=cache, **tokenize)
        .bucket(max_tokens=512, buffer_size=60)
        .pad(pad_to_multiple_of=8)
    )


def epochs(loader, n):
    return [[normalize(b) for b in loader] for _ in range(n)]


def counter(loader, name):
    return loader.stats().counters.get(name, 0)


@pytest.mark.parametrize("kind", KINDS)
def test_token_cache_gives_the_same_batches_on_every_source_kind(tmp_path, kind):
    source = write(tmp_path, kind)
    reference = epochs(stages(source).loader(), 3)
    loader = stages(source, cache=str(tmp_path / "cache")).loader()
    first = epochs(loader, 1)
    assert counter(loader, "cache.miss_rows") == ROWS and counter(loader, "cache.hit_rows") == 0
    later = epochs(loader, 2)
    assert first + later == reference
    assert counter(loader, "cache.hit_rows") == 2 * ROWS and counter(loader, "cache.miss_rows") == ROWS
    again = stages(source, cache=str(tmp_path / "cache")).loader()  # a later run reads everything
    assert epochs(again, 1) == reference[:1]
    assert counter(again, "cache.hit_rows") == ROWS and counter(again, "tokenize.rows") == ROWS


@pytest.mark.parametrize("kind", ["parquet", "jsonl", "dataset"])
def test_token_cache_assembles_pieces_when_cut_points_move(tmp_path, kind):
    source = write(tmp_path, kind)
    cache = str(tmp_path / "cache")
    for index in (0, 1):  # two consumers: their shares' cut points move every epoch
        ref = epochs(stages(source).loader(consumer=Consumer(index, 2), equal_steps="off"), 3)
        loader = stages(source, cache=cache).loader(consumer=Consumer(index, 2), equal_steps="off")
        assert epochs(loader, 3) == ref
    hits = 0
    for index in (0, 1):
        loader = stages(source, cache=cache).loader(consumer=Consumer(index, 2), equal_steps="off")
        epochs(loader, 1)
        hits += counter(loader, "cache.hit_rows")
        assert counter(loader, "cache.miss_rows") == 0
    assert hits == ROWS


def test_token_cache_gives_the_same_batches_through_worker_processes(tmp_path):
    source = write(tmp_path, "parquet")
    reference = epochs(stages(source).loader(num_workers=2), 2)
    cached = stages(source, cache=str(tmp_path / "cache"))
    assert epochs(cached.loader(num_workers=2), 2) == reference
    assert pp.cache.info(str(tmp_path / "cache")).files > 2
    loader = cached.loader(num_workers=2)
    assert epochs(loader, 1) == reference[:1]


def test_token_cache_resumes_exactly_while_half_full(tmp_path):
    source = write(tmp_path, "parquet")
    cache = str(tmp_path / "cache")
    reference = epochs(stages(source).loader(), 2)
    loader = stages(source, cache=cache).loader()
    taken = []
    for batch in loader:
        taken.append(normalize(batch))
        if len(taken) == len(reference[0]) // 2:
            break
    state = pickle.loads(pickle.dumps(loader.state_dict()))
    assert 0 < pp.cache.info(cache).files  # some segments are out, not all
    fresh = stages(source, cache=cache).loader()
    fresh.load_state_dict(state)
    assert taken + epochs(fresh, 1)[0] == reference[0]
    assert epochs(fresh, 1) == reference[1:]
    assert counter(fresh, "cache.hit_rows") > 0


@pytest.mark.slow  # seconds alone: make test runs it, test-fast leaves it out
@pytest.mark.parametrize("kind", ["parquet", "jsonl", "jsonl.gz"])
def test_token_cache_resumes_exactly_anywhere_while_cut_points_move(tmp_path, kind):
    source = write(tmp_path, kind)
    cache = str(tmp_path / "cache")
    slot = dict(consumer=Consumer(1, 2), equal_steps="off")
    reference = epochs(stages(source).loader(**slot), 3)
    loader = stages(source, cache=cache).loader(**slot)
    states = []  # (epoch, batches taken in it, state), the cache filling as it goes
    for epoch in range(2):
        for taken, _ in enumerate(loader, 1):
            states.append((epoch, taken, pickle.dumps(loader.state_dict())))
    for epoch, taken, state in states[1::3]:
        fresh = stages(source, cache=cache).loader(**slot)
        fresh.load_state_dict(pickle.loads(state))
        assert epochs(fresh, 3 - epoch) == [reference[epoch][taken:]] + reference[epoch + 1 :], (epoch, taken)


def test_token_cache_keeps_states_small_and_resumes_from_references(tmp_path):
    source = write(tmp_path, "parquet")
    cache = str(tmp_path / "cache")
    epochs(stages(source, cache=cache).loader(), 1)  # fill
    plain, cached = stages(source).loader(), stages(source, cache=cache).loader()
    reference, states = [], []
    for batch in cached:
        reference.append(normalize(batch))
        states.append(pickle.dumps(cached.state_dict()))
    sizes = [len(pickle.dumps(plain.state_dict()))]
    for _batch in plain:
        sizes.append(len(pickle.dumps(plain.state_dict())))
    assert max(len(s) for s in states[:-1]) < max(sizes) / 2
    for k in (0, len(states) // 2, len(states) - 2):
        fresh = stages(source, cache=cache).loader()
        fresh.load_state_dict(pickle.loads(states[k]))
        assert [normalize(b) for b in fresh] == reference[k + 1 :]


def test_token_cache_resume_raises_error_when_the_cache_was_cleared(tmp_path):
    source = write(tmp_path, "parquet")
    cache = str(tmp_path / "cache")
    loader = stages(source, cache=cache).loader()
    epochs(loader, 1)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    pp.cache.clear(cache)
    fresh = stages(source, cache=cache).loader()
    with pytest.raises(
        pp.StateMismatchError, match=r"that the token cache no longer holds \(cleared or changed since\)"
    ):
        fresh.load_state_dict(state)
        next(iter(fresh))


def test_token_cache_skips_and_counts_bad_rows_as_without_it(tmp_path):
    rows = documents()
    for i in (5, 77, 201):
        rows[i]["text"] = None
    source = write(tmp_path, "parquet", rows)
    ref_loader = stages(source, on_error="skip").loader()
    reference = epochs(ref_loader, 2)
    loader = stages(source, cache=str(tmp_path / "cache"), on_error="skip").loader()
    assert epochs(loader, 2) == reference
    assert loader.stats().skipped == {"tokenize.bad_text": 6} == ref_loader.stats().skipped
    assert counter(loader, "cache.hit_rows") == ROWS


def test_token_cache_raises_the_same_error_on_bad_text(tmp_path):
    rows = documents()
    rows[9]["text"] = None
    source = write(tmp_path, "parquet", rows)
    message = r"^tokenize: field 'text' at row 9 of \S+/data\.parquet \(idx=9; row \d+ of the chunk\) is None"
    with pytest.raises(pp.DataError, match=message):
        epochs(stages(source, cache=str(tmp_path / "cache")).loader(), 1)


def test_token_cache_misses_when_the_tokenize_options_or_the_file_change(tmp_path):
    source = write(tmp_path, "parquet")
    cache = str(tmp_path / "cache")
    epochs(stages(source, cache=cache).loader(), 1)
    other = source.tokenize(pp.examples.tokenizer(), fields="text", max_length=32, cache=cache).batch(64).pad()
    loader = other.loader()
    epochs(loader, 1)
    assert counter(loader, "cache.hit_rows") == 0
    rows = documents()
    rows[0]["text"] = "a changed first row"
    changed = write(tmp_path, "parquet", rows)  # same path, new size and mtime
    os.utime(tmp_path / "data.parquet", ns=(1, 1))
    loader = stages(changed, cache=cache).loader()
    assert epochs(loader, 1) == epochs(stages(changed).loader(), 1)
    assert counter(loader, "cache.hit_rows") == 0


def test_token_cache_ignores_counts_and_rewrites_a_file_that_fails_its_checks(tmp_path):
    source = write(tmp_path, "parquet")
    cache = str(tmp_path / "cache")
    reference = epochs(stages(source).loader(), 1)
    epochs(stages(source, cache=cache).loader(), 1)
    files = sorted(p for p in (tmp_path / "cache").rglob("*.arrow"))
    flipped, cut = files[0], files[1]
    data = bytearray(flipped.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, wrong checksum
    flipped.write_bytes(bytes(data))
    cut.write_bytes(cut.read_bytes()[:-10])  # truncated
    loader = stages(source, cache=cache).loader()
    assert epochs(loader, 1) == reference
    assert counter(loader, "cache.bad_files") == 2
    assert 0 < counter(loader, "cache.miss_rows") < ROWS
    loader = stages(source, cache=cache).loader()
    assert epochs(loader, 1) == reference
    assert counter(loader, "cache.bad_files") == 0 and counter(loader, "cache.hit_rows") == ROWS


def test_token_cache_raises_error_naming_an_unwritable_location(tmp_path):
    source = write(tmp_path, "parquet")
    (tmp_path / "a-file").write_text("not a folder")
    blocked = str(tmp_path / "a-file" / "cache")  # no one can make a folder under a file, root neither
    with pytest.raises(
        CacheError,
        match=rf"^token cache: cannot write to '{re.escape(blocked)}/{FORMAT}/\w+' "
        r"\((NotADirectoryError|FileExistsError): .*\); pass cache=pp.TokenCache\(path, "
        r"on_write_error='skip'\) to go on without writing \(counted\)\.$",
    ):
        epochs(stages(source, cache=blocked).loader(), 1)
    loader = stages(source, cache=TokenCache(blocked, on_write_error="skip")).loader()
    assert epochs(loader, 1) == epochs(stages(source).loader(), 1)
    assert counter(loader, "cache.write_errors") == 1 and counter(loader, "cache.written_files") == 0


def test_token_cache_raises_error_or_goes_on_when_the_disk_is_full(tmp_path, monkeypatch):
    source = write(tmp_path, "parquet")
    cache = str(tmp_path / "cache")
    real = os.replace

    def full(src, dst):
        if dst.endswith(".arrow"):
            raise OSError(errno.ENOSPC, "No space left on device")
        real(src, dst)

    monkeypatch.setattr(os, "replace", full)
    with pytest.raises(
        CacheError,
        match=rf"^token cache: cannot write to '{re.escape(cache)}/{FORMAT}/\w+/\w+' "
        r"\(OSError: \[Errno 28\] No space left on device\); pass",
    ):
        epochs(stages(source, cache=cache).loader(), 1)
    loader = stages(source, cache=TokenCache(cache, on_write_error="skip")).loader()
    assert epochs(loader, 2) == epochs(stages(source).loader(), 2)
    assert counter(loader, "cache.write_errors") == 1 and counter(loader, "cache.hit_rows") == 0
    assert not list((tmp_path / "cache").rglob("*.arrow")) and not list((tmp_path / "cache").rglob(".tmp-*"))


def test_token_cache_works_on_fsspec_urls(tmp_path):
    source = write(tmp_path, "jsonl")
    reference = epochs(stages(source).loader(), 2)
    for url in ("memory://padpipe-test-cache", f"file://{tmp_path}/cache"):
        loader = stages(source, cache=url).loader()
        assert epochs(loader, 2) == reference
        assert counter(loader, "cache.hit_rows") == ROWS
        report = pp.cache.info(url)
        assert report.files > 1 and report.bytes > 0 and len(report.fingerprints) == 1
        assert pp.cache.clear(url) == report.bytes and pp.cache.info(url).files == 0


def test_token_cache_reports_its_size_and_clears_from_the_command_line(tmp_path, capsys):
    from padpipe.cli import main

    source = write(tmp_path, "parquet")
    cache = str(tmp_path / "cache")
    epochs(stages(source, cache=cache).loader(), 1)
    report = pp.cache.info(cache)
    assert main(["cache", "info", cache]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{cache}: {report.files} files, ") and "max_length=64, fields=['text']" in out
    assert main(["cache", "clear", cache]) == 0
    assert re.match(rf"^{re.escape(cache)}: deleted \d+\.\d KiB$", capsys.readouterr().out)
    assert pp.cache.info(cache).files == 0
    with pytest.raises(SystemExit) as exit_info:
        main(["cache", "wipe", cache])
    assert exit_info.value.code == 2
    assert re.match(r"^padpipe cache: error: argument action: invalid choice: 'wipe'", capsys.readouterr().err)


def test_token_cache_stores_ids_in_the_smallest_type(tmp_path):
    source = write(tmp_path, "parquet")
    epochs(stages(source, cache=str(tmp_path / "cache")).loader(), 1)
    path = next((tmp_path / "cache").rglob("*.arrow"))
    segment = Segment.parse(path.name)
    table = ipc.open_file(pa.memory_map(str(path))).read_all()
    assert table.schema.field("__padpipe_ids").type == pa.list_(pa.uint16())  # the sample vocabulary < 65,536
    assert table.num_rows == segment.hi - segment.lo and table.column("text").null_count == table.num_rows


def test_token_cache_raises_error_for_a_pipeline_it_cannot_key(tmp_path):
    tok = pp.examples.tokenizer()
    with pytest.raises(
        ValueError, match=r"^`cache` needs a reader with work units .* starts with from_iterable\(\) instead\.$"
    ):
        pp.from_iterable([{"text": "a"}]).tokenize(tok, cache=str(tmp_path))
    custom = write(tmp_path, "parquet").add_stage("same", lambda up, ctx: up, output="records")
    with pytest.raises(
        ValueError,
        match=r"^`cache` needs tokenize\(\) right after the reader \(and shuffle\(\)\), "
        r"but \.same\(\) comes before it\.$",
    ):
        custom.tokenize(tok, cache=str(tmp_path))
    with pytest.raises(
        ValueError, match=r"^`on_write_error` must be one of \('raise', 'skip'\), but is 'warn' instead\.$"
    ):
        TokenCache(str(tmp_path), on_write_error="warn")


def test_token_cache_is_filled_by_concurrent_loaders_without_corruption(tmp_path):
    source = write(tmp_path, "parquet")
    cache = str(tmp_path / "cache")
    reference = epochs(stages(source).loader(), 1)
    results: list = []
    threads = [
        threading.Thread(target=lambda: results.append(epochs(stages(source, cache=cache).loader(), 1)))
        for _ in range(3)
    ]  # the same segments written at once, renamed into place
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [reference] * 3
    loader = stages(source, cache=cache).loader()
    assert epochs(loader, 1) == reference and counter(loader, "cache.hit_rows") == ROWS
    assert not list((tmp_path / "cache").rglob(".tmp-*"))


@pytest.fixture(scope="module")
def s3():
    """A moto S3 server on 127.0.0.1 (no network) with an empty bucket."""
    pytest.importorskip("s3fs")
    moto_server = pytest.importorskip("moto.server")
    from tests.readers.test_object_storage import ENV

    with pytest.MonkeyPatch.context() as env:
        for name, value in ENV.items():
            env.setenv(name, value)
        server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        host, port = server.get_host_and_port()
        options = {"key": "testing", "secret": "testing", "client_kwargs": {"endpoint_url": f"http://{host}:{port}"}}
        import s3fs

        s3fs.S3FileSystem(**options).mkdir("cache-bucket")
        yield {"options": options}
        server.stop()


def test_token_cache_works_on_s3(tmp_path, s3):
    source = write(tmp_path, "parquet")
    url = "s3://cache-bucket/token-cache"
    reference = epochs(stages(source).loader(), 2)
    loader = stages(source, cache=TokenCache(url, storage_options=s3["options"])).loader()
    assert epochs(loader, 2) == reference
    assert counter(loader, "cache.hit_rows") == ROWS and counter(loader, "cache.written_files") > 5
    report = pp.cache.info(url, storage_options=s3["options"])
    assert report.files == counter(loader, "cache.written_files") + 1  # and about.json
    assert pp.cache.clear(url, storage_options=s3["options"]) == report.bytes


def test_token_cache_gives_the_same_batches_after_an_elastic_resume(tmp_path):
    source = write(tmp_path, "parquet")

    def elastic(cache):  # 2 ranks take 3 batches each and save; 3 ranks load both states
        pipe, states, before = stages(source, cache=cache), [], []
        for rank in range(2):
            old = pipe.loader(consumer=Consumer(rank=rank, world_size=2))
            it = iter(old)
            before += [normalize(next(it)) for _ in range(3)]
            states.append(pickle.loads(pickle.dumps(old.state_dict())))
        after = []
        for rank in range(3):
            new = pipe.loader(consumer=Consumer(rank=rank, world_size=3))
            new.load_state_dict(states)
            after.append(epochs(new, 2))
        return before, after

    reference = elastic(None)
    cache = str(tmp_path / "cache")
    assert elastic(cache) == reference  # filling: re-shared pieces of units cut at the saved rows
    assert elastic(cache) == reference  # from the cache
