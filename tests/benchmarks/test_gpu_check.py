"""The CPU-side behaviour of benchmarks/gpu_check.py (the GPU run itself happens on a GPU box)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"
NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the run without CUDA")


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True, timeout=280)


@NO_CUDA
@pytest.mark.timeout(60)
def test_gpu_check_skips_cleanly_without_cuda() -> None:
    result = run()
    assert (result.returncode, result.stdout, result.stderr) == (0, "no CUDA device: skipped\n", "")


@NO_CUDA
@pytest.mark.timeout(300)
def test_gpu_check_smoke_run_works_on_the_cpu(tmp_path: Path) -> None:
    result = run("--smoke", "--out", str(tmp_path / "gpu_check.json"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "1. device batches == CPU batches: True over 8 batches; resume equal: True" in result.stdout
    for check in ("split: True", "workers: True", "varlen: None", "packing: True", "hybrid: None"):  # no kernel here
        assert f"\n   {check}  " in result.stdout
    for feed in (
        "compute only",
        "cpu + .cuda() in loop",
        ".prefetch(2) + .cuda() in loop",
        ".prefetch(2) + pin + non_blocking in loop",
        ".to_cuda(prefetch=2) [smoke: .prefetch(2)]",
    ):
        assert f"\n   {feed}" in result.stdout
    assert not (tmp_path / "gpu_check.json").exists()  # a CPU run measures nothing, writes nothing
