"""benchmarks/packing_table.py prints the backend x setting tables docs/packing.md shows, cell for cell."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(600)
def test_packing_table_prints_the_tables_of_the_packing_docs() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "packing_table.py")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    tables = done.stdout.strip()
    rows = [line for line in tables.splitlines() if line.startswith("| ")]
    assert len(rows) == 2 + 6 + 3 and "exact" in tables and "wrong (`use_cache`)" in tables  # 2 headers, 9 settings
    assert tables in (ROOT / "docs" / "packing.md").read_text()
