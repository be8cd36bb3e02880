"""A tiny run of benchmarks/trainer.py (three lm arms in one process, ~1 min on the shared 2 cores): each trains to
the token budget and fills its row of the table."""

from __future__ import annotations

import importlib
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "PADPIPE_PROGRESS": "0"}
COLUMNS = [
    "task",
    "arm",
    "1st batch (s)",
    "1st step (s)",
    "steady tokens/s",
    "mean tokens/s",
    "end-to-end tokens/s",
    "rows/s",
    "tokens/row",
    "padding eff.",
    "peak RSS (MiB)",
    "held-out loss",
    "tokens",
    "steps",
]
TINY = "--quick --docs 300 --cls-rows 300 --eval-docs 16 --eval-rows 32 --threads 1 --one-process".split()


def benchmark(name: str) -> ModuleType:
    """``benchmarks/<name>.py`` imported as its scripts import each other (``benchmarks/`` on the path)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


def run(*args: str, timeout: float = 280) -> str:
    """The benchmark's stdout; the whole process group is killed past ``timeout``."""
    cmd = [sys.executable, str(ROOT / "benchmarks" / "trainer.py"), *TINY, *args]
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    assert proc.returncode == 0, err[-3000:]
    return out


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_trainer_benchmark_trains_every_arm_to_the_same_budget(tmp_path: Path) -> None:
    out = run(
        "--tasks",
        "lm",
        "--lm-tokens",
        "2000",
        "--arms",
        "hf_random",
        "padpipe_bucket_accum",
        "padpipe_pack",
        "--workdir",
        str(tmp_path),
        "--chart",
        str(tmp_path / "chart.png"),
    )
    lines = [line for line in out.splitlines() if line.startswith("| ")]
    assert [c.strip() for c in lines[0].split("|")[1:-1]] == COLUMNS
    rows = {(cells[0], cells[1]): cells for cells in ([c.strip() for c in x.split("|")[1:-1]] for x in lines[1:])}
    assert set(rows) == {
        ("lm", "HF Trainer, random batches + padding collator (after map)"),
        ("lm", "padpipe.hf.Trainer, bucket(max_tokens / accumulation) + pad (accumulation steps)"),
        ("lm", "padpipe.hf.Trainer, pack(seq_len)"),
    }
    for (_, arm), cells in rows.items():
        assert len(cells) == len(COLUMNS), (arm, cells)
        first_batch, first_step = float(cells[2]), float(cells[3])
        assert 0 < first_batch <= first_step, (arm, cells)
        # rates are timings of a shared machine: only that they were measured (their order is not a test)
        assert 0 < float(cells[6].replace(",", "")) and 0 < float(cells[5].replace(",", "")), (arm, cells)
        assert 0 < float(cells[9]) <= 1, (arm, cells)  # padding efficiency
        assert 2000 <= int(cells[12].replace(",", "")) < 2000 + 8 * 512  # to the budget, stopped within a step
        assert int(cells[13].replace(",", "")) >= 1
    assert float(rows["lm", "padpipe.hf.Trainer, pack(seq_len)"][9]) > 0.99
    assert re.search(
        r"^lm: steady tokens/s, best padpipe \(padpipe_\w+\) / best HF-TRL \(hf_random\): "
        r"[\d.]+x; first step [\d.]+x sooner",
        out,
        re.M,
    )
    assert (tmp_path / "chart.png").stat().st_size > 1000


def test_repeated_runs_report_the_median_run_whole() -> None:
    trainer = benchmark("trainer")
    runs = [{"tokens_per_s": 9.0, "loss": 1}, {"error": "timed out"}, {"tokens_per_s": 5.0, "loss": 2}]
    assert trainer.median_run(runs) == {"tokens_per_s": 5.0, "loss": 2}  # the lower middle of two: one real run
    runs.append({"tokens_per_s": 7.0, "loss": 3})
    assert trainer.median_run(runs) == {"tokens_per_s": 7.0, "loss": 3}
    assert trainer.median_run([{"error": "x"}]) == {"error": "x"}
    assert trainer.micro_budget(1511, 512) == {"accum_steps": 3, "micro_tokens": 512}  # each holds a 512-token row
    assert trainer.micro_budget(2377, 128) == {"accum_steps": 4, "micro_tokens": 594}


@pytest.mark.slow
def test_microbatch_benchmark_times_every_shape(capsys: pytest.CaptureFixture[str]) -> None:
    microbatch = benchmark("microbatch")
    microbatch.main(["--rounds", "1"])
    rows = [line for line in capsys.readouterr().out.splitlines() if re.match(r"^\| \d+ x \d+ \|", line)]
    assert [r.split("|")[1].strip() for r in rows] == [f"{a} x {b}" for a, b, _ in microbatch.SHAPES]
    assert all(float(r.split("|")[4].replace(",", "")) > 0 for r in rows)
