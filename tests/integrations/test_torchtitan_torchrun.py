"""PadpipeDataLoader under real ``torchrun`` (gloo, CPU), checkpointed by torchtitan's CheckpointManager (DCP).

Saved on 2 DP ranks (1 loader worker each) and on 3 (no workers), two optimizer steps in; the first
resumed on 3 DP ranks with 2 workers, the second on 2 DP ranks x 2 tensor-parallel peers (4
processes) with 1 worker: what torchtitan 0.3.0's own loaders refuse (a changed DP degree). For the
loader reading Parquet itself (``pack``) and a mix of two corpora (``mix``), checked by token
histograms: the saved epoch's tokens, before and after the change, are the corpus's exactly once;
every DP rank takes the same steps, which end at a multiple of the batches per optimizer step
(3 on 2 DP ranks, 2 on 3: the global batch is 12 rows of 2); the next epoch is whole; every label
is the next token of its document; tensor-parallel peers read the same batches.
"""

from __future__ import annotations

import collections
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import padpipe as pp
from tests.runtime.launchers import run_launchers, torchrun_command

pytest.importorskip(
    "torchtitan.components.dataloader",
    reason="needs torchtitan 0.3.0: pip install 'padpipe[torchtitan]' && pip install --no-deps torchtitan==0.3.0",
)
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]  # the module fixture runs three launches, each bounded

SCRIPT = Path(__file__).parent / "scripts" / "titan_run.py"
WORDS = "the cat sat on a mat and then ran far away from the big dog under blue sky".split()
SEQ_LEN, TIMEOUT = 64, 300
KINDS = ("pack", "mix")


def write_corpus(data: Path) -> None:
    """``a.parquet`` (300 documents of 1 to 90 words: some longer than a row) and ``b.parquet`` (100 short ones)."""
    for name, count, most in (("a", 300, 90), ("b", 100, 20)):
        texts = [" ".join(WORDS[(i * 5 + j) % len(WORDS)] for j in range(1 + (i * 37) % most)) for i in range(count)]
        pq.write_table(pa.table({"text": texts}), data / f"{name}.parquet", row_group_size=70)


def documents(data: Path, kind: str) -> list[list[int]]:
    tok = pp.examples.tokenizer()
    names = ("a",) if kind == "pack" else ("a", "b")
    texts = [t for name in names for t in pq.read_table(data / f"{name}.parquet")["text"].to_pylist()]
    return [e.ids for e in tok.encode_batch(texts)]


def corpus_tokens(data: Path, kind: str) -> collections.Counter:
    """What the epoch reads: every token of each document, and the token before each cut again (a piece after a
    document's first starts with it, as context, then ``SEQ_LEN - 1`` new tokens)."""
    cut = [doc[i] for doc in documents(data, kind) for i in range(SEQ_LEN - 1, len(doc) - 1, SEQ_LEN - 1)]
    return collections.Counter(t for doc in documents(data, kind) for t in doc) + collections.Counter(cut)


def corpus_labels(data: Path, kind: str) -> collections.Counter:
    """What the epoch trains: every token of each document but its first (cut or not), each once."""
    return collections.Counter(t for doc in documents(data, kind) for t in doc[1:])


def phase(tag: str, dp: int, workers: int, *extra: str) -> list[str]:
    """One phase of titan_run.py: its tag, DP degree, loader workers and options."""
    return [tag, "--dp", str(dp), "--workers", str(workers), *extra]


def launch(data: Path, nproc: int, *phases: list[str]) -> list[list[dict]]:
    """One launch of ``nproc`` processes running ``phases`` one after another; every process's record of each."""
    args = [arg for i, p in enumerate(phases) for arg in (["--then"] if i else []) + p]
    command = torchrun_command(SCRIPT, str(data), str(data), *args, nproc=nproc)
    run_launchers([command], timeout=TIMEOUT * len(phases), what=" + ".join(p[0] for p in phases))
    return [[json.loads((data / f"{p[0]}-rank{r}.json").read_text()) for r in range(nproc)] for p in phases]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """Three launches: the save on 2 DP ranks; the save on 3 and, in the same processes, the resume of the first
    save on 3 (a state is loaded by processes that did not save it); the resume of the second on 2 DP x 2 TP."""
    data = tmp_path_factory.mktemp("titan_torchrun")
    write_corpus(data)
    out: dict = {"data": data}
    for dp in (2, 3):
        (data / f"saved-{dp}").mkdir()
    save = ("--take", "2", "--save")
    [out["saved", 2]] = launch(data, 2, phase("save-2", 2, 1, *save, str(data / "saved-2")))
    out["saved", 3], out["resumed", 3] = launch(
        data,
        3,
        phase("save-3", 3, 0, *save, str(data / "saved-3")),
        phase("resume-2-3", 3, 2, "--load", str(data / "saved-2")),
    )
    [out["resumed", 2]] = launch(data, 4, phase("resume-3-2", 2, 1, "--load", str(data / "saved-3")))  # 2 TP peers
    return out


def tokens(records: list[dict], kind: str, epoch: int | None = None, what: str = "tokens") -> collections.Counter:
    return collections.Counter(
        t for r in records for b in r[kind]["batches"] if epoch is None or b["epoch"] == epoch for t in b[what]
    )


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("saved", "resumed"), [(2, 3), (3, 2)])
def test_a_torchtitan_checkpoint_resumes_on_another_dp_degree_with_every_token_once(runs, kind, saved, resumed):
    data, old, new = runs["data"], runs["saved", saved], runs["resumed", resumed]
    peers = len(new) // resumed
    firsts = new[::peers]  # one process of each DP rank
    assert [r["dp_rank"] for r in new] == [r // peers for r in range(len(new))]
    assert {r[kind]["group"] for r in new} == {resumed}, "the loader agrees in the DP group, not the world"
    for what, every in (("tokens", corpus_tokens(data, kind)), ("labels", corpus_labels(data, kind))):
        before, after = tokens(old, kind, what=what), tokens(firsts, kind, epoch=0, what=what)
        assert before + after == every, f"the saved epoch's {what}, before and after the change, once each"
        assert tokens(firsts, kind, epoch=1, what=what) == every, f"the next epoch's {what} are whole"
    assert {len(r[kind]["batches"]) for r in old} == {2 * old[0][kind]["k"]}, "two optimizer steps before the save"
    counts = {len(r[kind]["batches"]) for r in new}
    assert len(counts) == 1, f"every rank takes the same steps: {counts}"
    assert counts.pop() % new[0][kind]["k"] == 0 and new[0][kind]["k"] == 12 // (2 * resumed)
    assert all(b["shape"] == [2, SEQ_LEN] and b["errors"] == 0 for r in old + new for b in r[kind]["batches"])


@pytest.mark.parametrize("kind", KINDS)
def test_tensor_parallel_peers_of_a_dp_rank_read_the_same_batches(runs, kind):
    new = runs["resumed", 2]
    for a, b in ((0, 1), (2, 3)):
        assert new[a][kind]["batches"] == new[b][kind]["batches"]
    assert new[0][kind]["batches"] != new[2][kind]["batches"]
