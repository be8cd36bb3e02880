"""Where the test suite's CPU goes: each test's CPU seconds, its own and its child processes' (torchrun ranks,
DataLoader workers, example scripts), by test and by file.

    make test PYTEST="-m pytest -q -n 2 --dist loadfile -p no:cacheprovider -p benchmarks.suite_cpu"
    python benchmarks/suite_cpu.py [--top 30]        # the table, from the records the run left

As a pytest plugin (``-p benchmarks.suite_cpu``) each test process appends one JSON line per test to
``benchmarks/out/suite_cpu/<pid>.jsonl`` (``$SUITE_CPU_DIR`` if set; emptied when a run starts): wall seconds and
CPU seconds from ``getrusage``, a child's counted once it is waited for, as ``subprocess.run`` and torchrun do.
Wall beyond CPU is time a test waited (sleeps, timeouts, a slow exit). Figures: benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import resource
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

RECORDS = Path(os.environ.get("SUITE_CPU_DIR") or Path(__file__).resolve().parent / "out" / "suite_cpu")


def pytest_configure(config: pytest.Config) -> None:
    """Empty the records of an earlier run, once, in the process that starts the test processes."""
    if not hasattr(config, "workerinput"):  # not a pytest-xdist worker
        for old in RECORDS.glob("*.jsonl"):
            old.unlink()


def _cpu() -> tuple[float, float]:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Record one test's wall and CPU seconds (set-up and tear-down included)."""
    own, children = _cpu()
    started = time.perf_counter()
    yield
    own_after, children_after = _cpu()
    record = {
        "test": item.nodeid,
        "own": round(own_after - own, 2),
        "children": round(children_after - children, 2),
        "wall": round(time.perf_counter() - started, 2),
    }
    RECORDS.mkdir(parents=True, exist_ok=True)
    with open(RECORDS / f"{os.getpid()}.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")


def table(records: list[dict[str, Any]], top: int) -> str:
    """The files and the tests of most CPU seconds, and the totals.

    Example:
        >>> print(table([{"test": "t.py::a", "own": 1.0, "children": 2.0, "wall": 4.0}], 5))
        1 tests: 3 CPU-s (own 1, child processes 2), 4 s of wall summed over the test processes
        <BLANKLINE>
         CPU-s  wall-s  file
           3.0     4.0  t.py
        <BLANKLINE>
         CPU-s  wall-s  test
           3.0     4.0  t.py::a
    """
    cpu = {r["test"]: r["own"] + r["children"] for r in records}
    by_file: collections.Counter[str] = collections.Counter()
    wall_by_file: collections.Counter[str] = collections.Counter()
    for r in records:
        by_file[r["test"].split("::")[0]] += cpu[r["test"]]
        wall_by_file[r["test"].split("::")[0]] += r["wall"]
    wall = {r["test"]: r["wall"] for r in records}
    own, children = sum(r["own"] for r in records), sum(r["children"] for r in records)
    lines = [
        f"{len(records)} tests: {own + children:,.0f} CPU-s (own {own:,.0f}, child processes {children:,.0f}), "
        f"{sum(wall.values()):,.0f} s of wall summed over the test processes",
        "",
        " CPU-s  wall-s  file",
        *(f"{c:6.1f}  {wall_by_file[f]:6.1f}  {f}" for f, c in by_file.most_common(top)),
        "",
        " CPU-s  wall-s  test",
        *(f"{c:6.1f}  {wall[t]:6.1f}  {t}" for t, c in sorted(cpu.items(), key=lambda x: -x[1])[:top]),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--top", type=int, default=30, help="files and tests to list (default: 30)")
    args = parser.parse_args(argv)
    records = [json.loads(line) for path in sorted(RECORDS.glob("*.jsonl")) for line in path.open(encoding="utf-8")]
    if not records:
        raise SystemExit(f"no records in {RECORDS}: run the suite with -p benchmarks.suite_cpu first")
    print(table(records, args.top))


if __name__ == "__main__":
    main()
