"""Tiny runs of benchmarks/epochs.py, first_batch.py, train_cpu.py and sft_cache.py: they run end to end and report what
they claim."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "PADPIPE_PROGRESS": "0"}


def run(script: str, *args: str) -> str:
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *args],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


@pytest.mark.timeout(300)
def test_epochs_benchmark_runs_and_reads_the_cache_after_epoch_one(tmp_path: Path) -> None:
    out = run("epochs.py", "--docs", "40", "--words", "120", "--epochs", "2", "--workdir", str(tmp_path))
    rows = {line.split("|")[1].strip(): line for line in out.splitlines() if line.startswith("| ") and " s |" in line}
    assert set(rows) == {
        "padpipe",
        "padpipe + token cache",
        "HF map(num_proc=2) + DataCollatorWithPadding + DataLoader(2)",
    }
    assert re.search(r"with the cache: epoch 2 is [\d.]+x faster than epoch 1", out)
    assert re.search(r"2 epochs, padpipe \+ cache / HF stack: [\d.]+x the time", out)
    assert re.search(r"token-cache: \d+ files, ", out)
    assert (tmp_path / "wordpiece-30522.json").exists()


@pytest.mark.timeout(300)
def test_first_batch_benchmark_reports_first_batch_and_state_sizes(tmp_path: Path) -> None:
    out = run("first_batch.py", "--docs", "60", "--words", "80", "--buffers", "64:64", "--workdir", str(tmp_path))
    rows = [line for line in out.splitlines() if line.startswith("| 64 |")]
    assert [r.split("|")[3].strip() for r in rows] == ["no", "yes"]
    for row in rows:
        cells = [c.strip() for c in row.split("|")[1:-1]]
        assert re.fullmatch(r"[\d.]+ s", cells[3]) and re.fullmatch(r"0\.\d{3}|1\.000", cells[4])
        plain, cached = float(cells[5].split()[0]), float(cells[6].split()[0])
        assert cached < plain  # buffered rows saved as cache references


@pytest.mark.timeout(300)
def test_train_cpu_benchmark_trains_both_on_the_same_rows() -> None:
    out = run("train_cpu.py", "--rows", "96", "--max-length", "32", "--threads", "1")
    rows = [line for line in out.splitlines() if line.startswith("| padpipe") or line.startswith("| HF")]
    assert len(rows) == 2 and all("| 96 |" in r for r in rows)
    assert re.search(r"padpipe trains [\d.]+x the rows/s", out)


@pytest.mark.timeout(300)
def test_sft_cache_benchmark_reads_every_conversation_from_the_cache_with_the_same_batches() -> None:
    out = run("sft_cache.py", "--conversations", "60", "--templates", "chatml")
    (row,) = [line for line in out.splitlines() if line.startswith("| chatml |")]
    cells = [c.strip() for c in row.split("|")[1:-1]]
    assert cells[1] == "60" and all(re.fullmatch(r"[\d.]+ s", c) for c in cells[3:8])
    assert re.fullmatch(r"\d+x", cells[8]) and re.fullmatch(r"[\d.]+ / [\d.]+ = \d+x", cells[9])
    assert cells[10] == "yes" and re.fullmatch(r"[\d.]+ KiB", cells[11])
