"""Elastic resume under real ``torchrun`` (gloo, CPU): a run saved on R x W continues on R' x W' exactly.

Each phase runs tests/dist_scripts/elastic_run.py under ``torch.distributed.run`` and serves
six pipelines at once (bucketed, fixed batches, packed, a mix; masked rows under
``accumulation_steps=3``, whose windows do not divide the epoch, saved inside its short last
window; ``equal_steps="repeat"`` over shares of very different length, saved while rank 0
replays): every rank takes a few steps with a barrier per step and saves its state; a later launch on another layout loads every saved rank's
state and runs the rest of that epoch and the next. Checked per pipeline and layout change: the rows
before the save plus those after it are the epoch exactly once (buffered rows included), every rank
takes the same number of steps, equal steps drops nothing, and the next epoch is whole. One launch
also saves again in the middle of its elastic epoch, and a third layout finishes that epoch.
Phases of one world size share a launch (10 phases, 6 launches: imports and process start paid once)
where none of them loads a state saved in that launch: every state is loaded by fresh processes.
"""

from __future__ import annotations

import collections
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch.distributed as dist

import padpipe as pp
from tests.runtime.launchers import run_launchers, torchrun_command

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(1800),
]  # the module fixture runs every launch (each bounded by its own timeout)

SCRIPT = Path(__file__).parent.parent / "dist_scripts" / "elastic_run.py"
ROWS, EXTRA = 900, 300
WORDS = "the cat sat on a mat and then ran far away from the big dog".split()
KINDS = ("bucket", "batch", "pack", "mix")
WINDOWED = ("accum", "repeat")  # run on the 2 x 1 save and the layouts it changes to (the cases that lost rows)
MASKED = 81  # pre-tokenized rows of "accum": 5 batches a rank on 2 ranks, windows of 3 and 2
# the old layouts, and the steps each takes before saving (2 x 1: inside accum's short last window, and
# after repeat's rank 0 ran out at step 7); in this order the 10 phases share 6 launches (see launches())
SAVED = {(1, 2): "5", (2, 1): "3,accum=4,repeat=10", (4, 2): "2", (3, 1): "2"}
CHANGES = [((2, 1), (3, 0)), ((2, 1), (3, 2)), ((1, 2), (4, 1)), ((3, 1), (2, 2)), ((4, 2), (3, 0))]
TIMEOUT = 300


def phase(ranks: int, workers: int, tag: str, *extra: str, kinds: tuple = KINDS) -> tuple[int, list[str]]:
    """One phase of elastic_run.py: its world size and its arguments (``tag`` first)."""
    return ranks, [tag, "--workers", str(workers), "--kinds", ",".join(kinds), *extra]


def option(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


def launches(plan: dict) -> list[tuple[int, list]]:
    """The keys of ``plan``'s phases grouped into launches of one world size each, in the order they run.

    A phase joins the first launch of its world size after the launch that saved the state it loads
    (so a state is always loaded by fresh processes, never by those that saved it), else starts a new one.
    """
    out: list[tuple[int, list]] = []
    saved_in: dict[str, int] = {}
    for key, (ranks, args) in plan.items():
        after = saved_in.get(option(args, "--load") or "", -1)
        at = next((i for i, (n, _) in enumerate(out) if i > after and n == ranks), len(out))
        if at == len(out):
            out.append((ranks, []))
        out[at][1].append(key)
        if save := option(args, "--save"):
            saved_in[save] = at
    return out


def torchrun(data: Path, ranks: int, phases: list[list[str]]) -> list[list[dict]]:
    """One launch running ``phases`` one after another; every rank's record of each. Killed whole on timeout."""
    args = [arg for i, p in enumerate(phases) for arg in (["--then"] if i else []) + p]
    command = torchrun_command(SCRIPT, str(data), str(data), *args, nproc=ranks)
    run_launchers([command], timeout=TIMEOUT * len(phases), what=" + ".join(p[0] for p in phases))
    return [[json.loads((data / f"{p[0]}-rank{r}.json").read_text()) for r in range(ranks)] for p in phases]


def write_corpus(data: Path) -> Path:
    """``a.parquet`` (rows ``rid`` 0..899) and ``b.parquet`` (10000..10299) in ``data``, the pipelines' input."""
    for name, start, count in (("a", 0, ROWS), ("b", 10_000, EXTRA)):
        texts = [" ".join(WORDS[(i + j) % len(WORDS)] for j in range(1 + (i * 7) % 40)) for i in range(count)]
        table = pa.table({"text": texts, "rid": list(range(start, start + count))})
        pq.write_table(table, data / f"{name}.parquet", row_group_size=160)  # uneven: 5 groups of 160 and 1 of 100
    masked = []
    for i in range(MASKED):  # token ids and a prompt of each row masked from the loss
        ids = [2 + (i * 3 + j * 5) % 38 for j in range(2 + (i * 7) % 11)]
        masked.append({"input_ids": ids, "labels": [-100] * (i % 3) + ids[i % 3 :], "rid": 20_000 + i})
    pq.write_table(pa.Table.from_pylist(masked), data / "masked.parquet")
    short = pa.table({"text": [f"s {i}" for i in range(400)], "rid": list(range(30_000, 30_400))})
    long = [" ".join(WORDS[(i + j) % len(WORDS)] for j in range(40 + i % 21)) for i in range(400)]
    pq.write_table(short, data / "short.parquet")  # rank 0's share of "repeat" on 2 ranks: 7 batches
    pq.write_table(pa.table({"text": long, "rid": list(range(40_000, 40_400))}), data / "long.parquet")  # 40
    return data


def expected(kind: str, data: Path) -> collections.Counter:
    """Every row of one epoch: ``rid`` values, or a packed pipeline's documents as token tuples."""
    if kind == "accum":
        return collections.Counter(range(20_000, 20_000 + MASKED))
    if kind == "repeat":
        return collections.Counter([*range(30_000, 30_400), *range(40_000, 40_400)])
    if kind != "pack":
        return collections.Counter([*range(ROWS), *(range(10_000, 10_000 + EXTRA) if kind == "mix" else ())])
    pipe = pp.read_parquet(str(data / "a.parquet")).tokenize(pp.examples.tokenizer(), max_length=48).batch(ROWS).pad()
    batch = next(iter(pipe.loader()))
    return collections.Counter(
        tuple(ids[m.bool()].tolist()) for ids, m in zip(batch["input_ids"], batch["attention_mask"])
    )


def rows(records: list[dict], kind: str, part: str, epoch: int | None = None) -> collections.Counter:
    steps = [s for r in records for s in (r[kind][part] if epoch is None else r[kind][part][epoch])]
    return collections.Counter(tuple(row) if isinstance(row, list) else row for step in steps for row in step)


def plan(data: Path) -> dict:
    """The phases, keyed as their records are in ``runs``: the saves, the layout changes, the second resize."""
    out: dict = {}
    for (ranks, workers), take in SAVED.items():
        save = ("--take", take, "--save", str(data / f"saved-{ranks}x{workers}"), "--epochs", "-1")
        out[ranks, workers] = phase(ranks, workers, f"old-{ranks}x{workers}", *save, kinds=kinds_of((ranks, workers)))
    for old, new in CHANGES:
        extra = ["--load", str(data / f"saved-{old[0]}x{old[1]}")]
        if (old, new) == ((2, 1), (3, 0)):  # save again two steps into the elastic epoch
            extra += ["--take", "2,accum=1", "--save", str(data / "saved-again")]  # accum has 1 step left
        out[old, new] = phase(*new, f"new-{old[0]}x{old[1]}-{new[0]}x{new[1]}", *extra, kinds=kinds_of(old))
    out["again"] = phase(1, 2, "again-1x2", "--load", str(data / "saved-again"), kinds=kinds_of((2, 1)))
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    data = write_corpus(tmp_path_factory.mktemp("elastic_torchrun"))
    phases = plan(data)
    for _, args in phases.values():
        if save := option(args, "--save"):
            Path(save).mkdir()
    out: dict = {"data": data}
    for ranks, keys in launches(phases):
        out.update(zip(keys, torchrun(data, ranks, [phases[key][1] for key in keys])))
    return out


def test_the_phases_share_launches_and_each_state_is_loaded_by_a_later_launch(tmp_path):
    phases = plan(tmp_path)
    grouped = launches(phases)
    assert [(ranks, len(keys)) for ranks, keys in grouped] == [(1, 1), (2, 1), (4, 2), (3, 4), (2, 1), (1, 1)]
    launch_of = {key: i for i, (_, keys) in enumerate(grouped) for key in keys}
    saved_by = {option(args, "--save"): key for key, (_, args) in phases.items() if option(args, "--save")}
    for key, (ranks, args) in phases.items():
        assert grouped[launch_of[key]][0] == ranks
        if load := option(args, "--load"):
            assert launch_of[saved_by[load]] < launch_of[key], f"{key} loads {load} in a later launch"


def kinds_of(old: tuple[int, int]) -> tuple[str, ...]:
    """The pipelines a launch of a change from ``old`` serves."""
    return KINDS + WINDOWED if old == (2, 1) else KINDS


MATRIX = [(old, new, kind) for old, new in CHANGES for kind in kinds_of(old)]


def check_resumed(before: collections.Counter, records: list[dict], kind: str, every: collections.Counter) -> None:
    rest = rows(records, kind, "before") + rows(records, kind, "epochs", 0)
    assert before + rest == every, "the saved epoch, before and after the change, has every row exactly once"
    for epoch in range(2):
        steps = [len(r[kind]["epochs"][epoch]) + (len(r[kind]["before"]) if epoch == 0 else 0) for r in records]
        assert len(set(steps)) == 1, f"every rank takes the same number of steps (epoch {epoch}: {steps})"
    assert rows(records, kind, "epochs", 1) == every, "the next epoch is whole"
    assert [r[kind]["dropped"] for r in records] == [0] * len(records), "equal steps dropped no row"


@pytest.mark.parametrize(("old", "new", "kind"), MATRIX, ids=[f"{a}x{b}-{c}x{d}-{k}" for (a, b), (c, d), k in MATRIX])
def test_elastic_resume_under_torchrun_reads_the_rest_of_the_epoch_exactly_once(runs, old, new, kind):
    every = expected(kind, runs["data"])
    before = rows(runs[old], kind, "before")
    assert 0 < sum(before.values()) < sum(every.values())
    check_resumed(before, runs[old, new], kind, every)


def test_the_saves_catch_a_short_window_and_a_replaying_rank(runs):
    """The cases that lost rows: states saved inside the last, short window, and while a rank replays."""
    old = runs[2, 1]
    assert [r["accum"]["saved"]["window"] for r in old] == [1, 1], "one batch of the short window not given out"
    assert [r["accum"]["saved"]["stopped"] for r in old] == [True, True], "the epoch had ended below the window"
    assert [r["repeat"]["saved"]["exhausted"] for r in old] == [True, False], "rank 0 replays, rank 1 reads"
    assert [r["repeat"]["saved"]["stopped"] for r in old] == [False, False]


@pytest.mark.parametrize("kind", KINDS + WINDOWED)
def test_a_torchrun_job_resized_twice_in_one_epoch_reads_every_row_once(runs, kind):
    """2 x 1 -> 3 x 0 (saved two steps into the elastic epoch) -> 1 x 2."""
    every = expected(kind, runs["data"])
    before = rows(runs[2, 1], kind, "before") + rows(runs[(2, 1), (3, 0)], kind, "before")
    check_resumed(before, runs["again"], kind, every)
