"""Elastic resume through the frameworks under real torchrun: checkpointed on 2 ranks, resumed on 3.

``padpipe.hf.Trainer`` and Lightning (``LightningLoader`` + ``ExactResume``) each train a few steps on
2 CPU ranks with loader workers and checkpoint; a new launch on 3 ranks resumes from that checkpoint
and trains past the end of the saved epoch. The saved epoch must have every row exactly once over
both launches, and every rank the same number of steps in it. Both frameworks share the two launches
(one after the other in the same processes): every checkpoint is still resumed by fresh processes.
"""

from __future__ import annotations

import collections
import importlib.util
import json
from pathlib import Path

import pytest

from tests.integrations.tiny import TRAIN_ROWS, run_script, write_mrpc

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]  # two launches, each bounded by run_script
SCRIPT = "elastic_frameworks_run.py"
FRAMEWORKS = {"hf": "transformers", "lightning": "lightning"}  # each needs transformers (the model) and its own


@pytest.fixture(scope="module")
def out(tmp_path_factory) -> tuple[Path, list[str]]:
    """The launches' folder and the frameworks they ran: those installed, both saved on 2 ranks, resumed on 3."""
    pytest.importorskip("transformers")
    frameworks = ",".join(f for f, package in FRAMEWORKS.items() if importlib.util.find_spec(package))
    folder = tmp_path_factory.mktemp("elastic_frameworks")
    data = write_mrpc(folder / "mrpc")
    run_script(SCRIPT, "save", str(data), str(folder), "1", frameworks, processes=2, timeout=400)
    run_script(SCRIPT, "resume", str(data), str(folder), "2", frameworks, processes=3, timeout=400)
    return folder, frameworks.split(",")


def steps(out, framework: str, phase: str, ranks: int) -> list[list[dict]]:
    return [json.loads((out / f"{framework}-{phase}-rank{r}.json").read_text()) for r in range(ranks)]


@pytest.mark.parametrize("framework", ["hf", "lightning"])
def test_a_framework_checkpoint_of_2_ranks_resumes_on_3_with_every_row_once(framework, out):
    folder, ran = out
    if framework not in ran:
        pytest.skip(f"{FRAMEWORKS[framework]} is not installed")
    saved, resumed = steps(folder, framework, "save", 2), steps(folder, framework, "resume", 3)
    before = collections.Counter(i for rank in saved for s in rank for i in s["idx"])
    epoch = min(s["epoch"] for rank in resumed for s in rank)
    rest = [[s for s in rank if s["epoch"] == epoch] for rank in resumed]
    after = collections.Counter(i for rank in rest for s in rank for i in s["idx"])
    assert before + after == collections.Counter(range(TRAIN_ROWS)), "the saved epoch has every row exactly once"
    assert len({len(rank) for rank in rest}) == 1, f"equal steps per rank: {[len(r) for r in rest]}"
    later = [[s for s in rank if s["epoch"] == epoch + 1] for rank in resumed]
    assert all(later), "training went on into the next epoch"
