"""Elastic resume through the frameworks under real torchrun: checkpointed on 2 ranks, resumed on 3.

``padpipe.hf.Trainer`` and Lightning (``LightningLoader`` + ``ExactResume``) each train a few steps on
2 CPU ranks with loader workers and checkpoint; a new launch on 3 ranks resumes from that checkpoint
and trains past the end of the saved epoch. The saved epoch must have every row exactly once over
both launches, and every rank the same number of steps in it.
"""

from __future__ import annotations

import collections
import json

import pytest

from tests.integrations.tiny import TRAIN_ROWS, run_script, write_mrpc

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]  # two launches, each bounded by run_script
SCRIPT = "elastic_frameworks_run.py"


def steps(out, framework: str, phase: str, ranks: int) -> list[list[dict]]:
    return [json.loads((out / f"{framework}-{phase}-rank{r}.json").read_text()) for r in range(ranks)]


@pytest.mark.parametrize("framework", ["hf", "lightning"])
def test_a_framework_checkpoint_of_2_ranks_resumes_on_3_with_every_row_once(framework, tmp_path):
    pytest.importorskip("transformers")
    if framework == "lightning":
        pytest.importorskip("lightning")
    data = write_mrpc(tmp_path / "mrpc")
    run_script(SCRIPT, framework, "save", str(data), str(tmp_path), "1", processes=2, timeout=300)
    run_script(SCRIPT, framework, "resume", str(data), str(tmp_path), "2", processes=3, timeout=300)
    saved, resumed = steps(tmp_path, framework, "save", 2), steps(tmp_path, framework, "resume", 3)
    before = collections.Counter(i for rank in saved for s in rank for i in s["idx"])
    epoch = min(s["epoch"] for rank in resumed for s in rank)
    rest = [[s for s in rank if s["epoch"] == epoch] for rank in resumed]
    after = collections.Counter(i for rank in rest for s in rank for i in s["idx"])
    assert before + after == collections.Counter(range(TRAIN_ROWS)), "the saved epoch has every row exactly once"
    assert len({len(rank) for rank in rest}) == 1, f"equal steps per rank: {[len(r) for r in rest]}"
    later = [[s for s in rank if s["epoch"] == epoch + 1] for rank in resumed]
    assert all(later), "training went on into the next epoch"
