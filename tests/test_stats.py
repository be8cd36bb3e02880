"""``loader.stats()``: the report people read, the flat dict loggers take, merging snapshots."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

import padpipe as pp
from padpipe.stats import PipelineStats, StatsSnapshot

SNAP = StatsSnapshot(
    rows=20_000,
    batches=378,
    real_tokens=1_483_210,
    padded_tokens=1_541_120,
    skipped={"tokenize.bad_text": 12, "bucket.oversize": 3},
    seconds={"read": 0.41, "tokenize": 9.8, "bucket": 0.2},
    counters={"read.rows": 20_015, "tokenize.rows": 20_003},
    wall_seconds=8.0,
)


def test_stats_str_is_pinned() -> None:
    assert str(SNAP) == (
        "padpipe stats after 8.00 s\n"
        "  rows     20,000 in 378 batches (52.9 rows per batch)\n"
        "  tokens   1,483,210 real in 1,541,120 slots: padding efficiency 96.2%\n"
        "  skipped  15 (bucket.oversize 3, tokenize.bad_text 12)\n"
        "  time per stage (share of the 8.00 s wall time; stages overlap in threads, so shares may sum past 100%):\n"
        "    tokenize  9.800 s  122.5%\n"
        "    read      0.410 s   5.1%\n"
        "    bucket    0.200 s   2.5%"
    )


def test_stats_str_before_any_batch() -> None:
    empty = PipelineStats().snapshot()
    assert str(empty) == (
        "padpipe stats after 0.00 s\n"
        "  rows     0 in 0 batches\n"
        "  tokens   0 real in 0 slots: padding efficiency 0.0%\n"
        "  skipped  0"
    )


def test_stats_as_dict_has_stable_flat_keys() -> None:
    assert SNAP.as_dict() == {
        "rows": 20_000,
        "batches": 378,
        "real_tokens": 1_483_210,
        "padded_tokens": 1_541_120,
        "padding_efficiency": 1_483_210 / 1_541_120,
        "skipped": 15,
        "wall_seconds": 8.0,
        "skipped/bucket.oversize": 3,
        "skipped/tokenize.bad_text": 12,
        "seconds/bucket": 0.2,
        "seconds/read": 0.41,
        "seconds/tokenize": 9.8,
        "share/bucket": 0.2 / 8.0,
        "share/read": 0.41 / 8.0,
        "share/tokenize": 9.8 / 8.0,
        "counters/read.rows": 20_015,
        "counters/tokenize.rows": 20_003,
    }


def test_stats_snapshots_merge() -> None:
    other = StatsSnapshot(
        rows=10,
        batches=1,
        real_tokens=90,
        padded_tokens=100,
        skipped={"bucket.oversize": 1},
        seconds={"read": 0.09, "pad": 0.5},
        counters={"read.rows": 10},
        wall_seconds=9.5,
    )
    merged = SNAP + other
    assert (
        merged
        == SNAP.merge(other)
        == StatsSnapshot(
            rows=20_010,
            batches=379,
            real_tokens=1_483_300,
            padded_tokens=1_541_220,
            skipped={"tokenize.bad_text": 12, "bucket.oversize": 4},
            seconds={"read": pytest.approx(0.5), "tokenize": 9.8, "bucket": 0.2, "pad": 0.5},
            counters={"read.rows": 20_025, "tokenize.rows": 20_003},
            wall_seconds=9.5,
        )
    )
    assert SNAP.merge() == SNAP
    with pytest.raises(TypeError):
        SNAP + 1  # noqa: B018


def test_loader_stats_time_every_stage_against_wall_time(tmp_path) -> None:
    path = tmp_path / "rows.parquet"
    pq.write_table(pq.read_table(pp.examples.SAMPLE_PARQUET).slice(0, 3000), path, row_group_size=1000)
    pipe = (
        pp.read_parquet(str(path))
        .shuffle(1000, seed=0)
        .tokenize(pp.examples.tokenizer(), fields=("sentence1", "sentence2"), max_length=64)
        .bucket(max_tokens=2048)
        .pad(pad_to_multiple_of=8)
    )
    loader = pipe.loader()
    assert loader.stats().wall_seconds == 0.0  # the clock starts with the first work, not when built
    for _ in loader:
        pass
    snap = loader.stats()
    assert set(snap.seconds) == {"read", "shuffle", "tokenize", "bucket", "pad"}
    assert snap.wall_seconds > 0 and all(share > 0 for share in snap.time_share.values())
    assert snap.seconds["bucket"] < snap.wall_seconds and snap.rows == 3000
    text = str(snap)
    assert (
        f"time per stage (share of the {snap.wall_seconds:.2f} s wall time; stages overlap in threads" in text
        and all(f"    {stage}" in text for stage in snap.seconds)
    )
