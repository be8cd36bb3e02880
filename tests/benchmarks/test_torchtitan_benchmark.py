"""A tiny run of benchmarks/torchtitan_loader.py: both loaders read the same corpus and the table says so."""

from __future__ import annotations

import re

import pytest

from tests.benchmarks.test_cache_benchmarks import run

pytest.importorskip(
    "torchtitan.components.dataloader",
    reason="needs torchtitan 0.3.0: pip install 'padpipe[torchtitan]' && pip install --no-deps torchtitan==0.3.0",
)


@pytest.mark.timeout(300)
def test_torchtitan_benchmark_compares_both_loaders_on_the_same_corpus() -> None:
    out = run("torchtitan_loader.py", "--documents", "1000", "--seq-len", "256", "--batch-size", "2")
    rows = {line.split("|")[1].strip(): line.split("|")[2:-1] for line in out.splitlines() if line.startswith("| ")}
    titan, ours = rows["torchtitan HuggingFaceTextDataLoader"], rows["padpipe PadpipeDataLoader"]
    assert titan[5].strip() == "100.0%" and float(ours[5].strip(" %")) > 90, "torchtitan's rows have no padding"
    assert int(titan[7].replace(",", "")) > int(ours[7].replace(",", "")), "torchtitan cuts documents at every row"
    assert re.search(r"padpipe / torchtitan: [\d.]+x the real tokens/s, [\d.]+x the slots/s, [\d.]+x the time", out)
