"""The data of the workloads that tests/dist_scripts/workloads_run.py reads, and its launch, once per test session.

One ``torchrun`` launch per world size (2 and 3 ranks) runs the uneven tails of fillers_run.py and the
long documents of long_docs_run.py in one process group, and both test files check its records
(test_fillers_torchrun.py, test_long_docs_torchrun.py): process start and imports paid once.
"""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from filelock import FileLock

import padpipe as pp
from tests import chat_fixtures
from tests.runtime.launchers import run_launchers, torchrun_command

SCRIPT = Path(__file__).parent.parent / "dist_scripts" / "workloads_run.py"
FILLERS = {2: {"pairs": 1, "docs": 41, "chats": 29}, 3: {"pairs": 2, "docs": 37, "chats": 30}}
"""Rows of each fillers workload, per world size."""
DOCS = 700
"""Documents of the long-documents corpus."""


def write_fillers(data: Path, sizes: dict[str, int]) -> None:
    pairs = pq.read_table(pp.examples.SAMPLE_PARQUET).slice(0, sizes["pairs"])
    pq.write_table(pairs, data / "pairs.parquet")
    with gzip.open(Path(pp.examples.DATA_DIR) / "corpus.jsonl.gz", "rt") as f:
        texts = [json.loads(line)["text"] for _, line in zip(range(sizes["docs"]), f)]
    (data / "docs.jsonl").write_text("".join(json.dumps({"text": t, "idx": i}) + "\n" for i, t in enumerate(texts)))
    (data / "one_doc.jsonl").write_text(json.dumps({"text": " ".join(texts[0].split()[:120])}) + "\n")
    chats = chat_fixtures.conversations(sizes["chats"], seed=39)
    (data / "chats.jsonl").write_text("".join(json.dumps({"messages": c}) + "\n" for c in chats))


def corpus() -> list[str]:
    """The shipped documents (median ~100 words, a few of 1,000-3,000), first ``DOCS``."""
    with gzip.open(Path(pp.examples.DATA_DIR) / "corpus.jsonl.gz", "rt") as f:
        return [json.loads(line)["text"] for _, line in zip(range(DOCS), f)]


def write_long_docs(data: Path, texts: list[str]) -> None:
    """docs.jsonl: the first half by bytes spread out by spaces (few tokens a byte); docs.parquet: longest first."""
    half = len(texts) // 3
    spread = [text.replace(" ", "        ") for text in texts[:half]] + texts[half:]
    with open(data / "docs.jsonl", "w") as f:
        f.writelines(json.dumps({"text": t}) + "\n" for t in spread)
    longest = sorted(texts, key=len, reverse=True)
    pq.write_table(pa.table({"text": longest}), data / "docs.parquet", row_group_size=100)


def launched(tmp_path_factory: pytest.TempPathFactory, ranks: int) -> Path:
    """The folder of the launch on ``ranks`` ranks: ``fillers/`` and ``long_docs/`` (the data) and the records,
    ``x<ranks>-<workload>-rank<R>.json``. Launched once per test session: under pytest-xdist by the process
    that asks first, while another that asks waits for it on a file lock."""
    shared = os.environ.get("PYTEST_XDIST_WORKER") is not None
    root = tmp_path_factory.getbasetemp().parent if shared else tmp_path_factory.getbasetemp()
    folder = root / f"workloads-x{ranks}"
    with FileLock(f"{folder}.lock"):
        done = folder / "done"
        if not done.exists():
            fillers, long_docs = folder / "fillers", folder / "long_docs"
            for data in (fillers, long_docs):
                data.mkdir(parents=True, exist_ok=True)
            write_fillers(fillers, FILLERS[ranks])
            write_long_docs(long_docs, corpus())
            args = [f"fillers={fillers}", f"long_docs={long_docs}"]
            command = torchrun_command(SCRIPT, str(folder), f"x{ranks}", *args, nproc=ranks)
            run_launchers([command], timeout=900, what=f"x{ranks}")
            done.touch()
    return folder
