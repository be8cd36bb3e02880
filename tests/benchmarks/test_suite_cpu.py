"""benchmarks/suite_cpu.py as a pytest plugin: a test's own and its child processes' CPU seconds, by test and file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

BURNS = """
import subprocess, sys

def test_burns_in_a_child():
    subprocess.run([sys.executable, "-c", "sum(i * i for i in range(3_000_000))"], check=True)

def test_burns_itself():
    sum(i * i for i in range(3_000_000))

def test_waits():
    import time
    time.sleep(0.5)
"""


def test_the_plugin_records_each_tests_own_and_childrens_cpu_and_the_table_sums_them(tmp_path: Path) -> None:
    (tmp_path / "test_burns.py").write_text(BURNS)
    records = tmp_path / "records"
    records.mkdir()
    (records / "stale.jsonl").write_text('{"test": "old", "own": 9, "children": 9, "wall": 9}\n')
    env = {**os.environ, "SUITE_CPU_DIR": str(records), "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "benchmarks.suite_cpu", "-p", "no:cacheprovider"]
    done = subprocess.run(
        [*command, "--rootdir", str(tmp_path), "-c", os.devnull, str(tmp_path / "test_burns.py")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {r["test"].split("::")[1]: r for p in records.glob("*.jsonl") for r in map(json.loads, p.open())}
    assert sorted(rows) == ["test_burns_in_a_child", "test_burns_itself", "test_waits"]  # the stale file emptied
    child, own, waits = rows["test_burns_in_a_child"], rows["test_burns_itself"], rows["test_waits"]
    assert child["children"] > 0.1 and child["own"] < child["children"]
    assert own["own"] > 0.1 and own["children"] == 0
    assert waits["wall"] >= 0.5 and waits["own"] + waits["children"] < 0.3
    shown = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "suite_cpu.py"), "--top", "2"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    lines = shown.splitlines()
    assert lines[0].startswith("3 tests: ") and "CPU-s (own " in lines[0]
    assert lines[2] == " CPU-s  wall-s  file" and lines[3].endswith("test_burns.py")
    tests = lines[lines.index(" CPU-s  wall-s  test") + 1 :]
    assert len(tests) == 2 and not any("test_waits" in line for line in tests)  # --top 2: the two that burn
