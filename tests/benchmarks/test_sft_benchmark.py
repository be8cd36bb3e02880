"""A small run of benchmarks/sft.py (a few hundred conversations; TRL's columns read "not installed" without trl),
and its label comparison on hand-made conversations."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from tests.benchmarks.test_trainer_benchmark import benchmark

ROOT = Path(__file__).resolve().parents[2]
HAS_TRL = importlib.util.find_spec("trl") is not None
COLUMNS = [
    "template",
    "rows",
    "TRL pre-pass (s)",
    "padpipe 1st batch (s)",
    "sooner",
    "TRL packing eff.",
    "padpipe packing eff.",
    "labels equal (fit)",
    "labels equal (cut)",
    "trained by TRL only",
    "trained by padpipe only",
    "dropped by padpipe",
]


def cells(line: str) -> list[str]:
    return [c.strip() for c in line.split("|")[1:-1]]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_sft_benchmark_fills_its_tables(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "PADPIPE_PROGRESS": "0"}
    chart = tmp_path / "sft.png"
    args = [
        "--conversations",
        "300",
        "--rate-conversations",
        "300",
        "--buffers",
        "64",
        "--repeat",
        "1",
        "--rate-rounds",
        "1",
        "--documents",
        "300",
        "--sections",  # all but steps (four fresh Python processes with TRL: minutes)
        "cases",
        "packing",
        "rates",
        "buffers",
    ]
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "sft.py"), *args, "--seq-len", "512", "--chart", str(chart)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith("| ")]
    assert cells(lines[0]) == COLUMNS
    rows = {cells(line)[0]: cells(line) for line in lines[1:6]}
    assert list(rows) == [
        "`llama3_marked`",
        "`llama3_marked`, prompt/completion",
        "`chatml_marked`",
        "`gemma_marked`",
        "`chatml`",
    ]
    for row in rows.values():
        assert row[1] == "300" and float(row[3]) > 0, row
        assert 90 < float(row[6].rstrip("%")) <= 100, row
    if HAS_TRL:
        fit = re.fullmatch(r"([\d,]+) of ([\d,]+)", rows["`llama3_marked`"][7])
        assert fit and fit.group(1) == fit.group(2), rows["`llama3_marked`"]
        assert rows["`chatml`"][2].startswith("refused: ")
    else:
        assert all(row[2] == "not installed" for row in rows.values())
    rates = [cells(line) for line in lines if line.startswith(("| marked", "| no markers"))]
    assert len(rates) == 6 and all(float(r[1].replace(",", "")) > 0 for r in rates)
    assert rates[0][2] == "1.00"
    assert [cells(line)[0] for line in lines if re.match(r"^\| [\d,]+ \| ", line)] == ["64"]
    assert chart.stat().st_size > 1000
    packing = {cells(line)[0].split(" ")[1]: cells(line) for line in lines if re.match(r"^\| 300 (conv|long|of)", line)}
    assert list(packing) == ["conversations", "long", "of"]
    for kind, row in packing.items():  # chats at 1,024; long documents split at 1,024 and at 512
        ours, limit = float(row[4].rstrip("%")), float(row[5].rstrip("%"))
        assert limit - (0.1 if kind == "conversations" else 0.5) <= ours <= limit, row
        if HAS_TRL:
            assert ours >= float(row[2].rstrip("%")), row


def test_sft_benchmark_names_the_tokens_one_side_trains_and_the_other_does_not() -> None:
    arms = benchmark("sft_arms")

    class Tok:
        def convert_ids_to_tokens(self, ids: list[int]) -> list[str]:
            return [f"t{i}" for i in ids]

    ids = np.array([1, 2, 3, 4, 5])
    ours = {"conversations": {0: (ids, np.array([-100, -100, 3, 4, -100])), 1: (ids[:2], np.array([-100, 2]))}}
    theirs = {
        "conversations": [
            (ids, np.array([-100, -100, 3, 4, 5])),  # also trains the token after the span
            (ids[:2], np.array([-100, 2])),
            (np.array([9, 9]), np.array([-100, -100])),  # a conversation padpipe dropped: nothing trained
        ]
    }
    found = arms.compare(ours, theirs, seq_len=5, tok=Tok())
    assert {k: found[k] for k in ("fit", "fit_equal", "cut", "cut_equal", "missing")} == {
        "fit": 1,
        "fit_equal": 1,
        "cut": 1,
        "cut_equal": 0,
        "missing": 0,
    }
    assert found["only_trl"] == Counter({"t5": 1}) and found["only_padpipe"] == Counter()
    assert (found["trl_only"], found["trl_only_untrained"]) == (1, 1)
