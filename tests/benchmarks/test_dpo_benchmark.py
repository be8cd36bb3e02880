"""A small run of benchmarks/dpo.py: TRL's data path and padpipe's recipe on the same pairs, every pair equal."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_dpo_benchmark_runs_and_finds_every_pair_equal_to_trls():
    pytest.importorskip("trl")
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "dpo.py"), "--pairs", "120", "--repeat", "1", "--seq-len", "1024"],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    rows = {line.split("|")[1].strip(): line for line in lines if line.startswith("| ") and "---" not in line}
    assert set(rows) == {"data path", "TRL (pre-pass, padded)", "padpipe packed", "padpipe padded (bucketed)"}
    share = {name: float(re.search(r"([\d.]+)% \|$", line).group(1)) for name, line in rows.items() if "%" in line}
    assert share["padpipe packed"] > 95 > share["TRL (pre-pass, padded)"]
    assert lines[-1] == "pairs whose ids and completion masks are TRL's: 120 of 120"
