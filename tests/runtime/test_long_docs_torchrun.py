"""Every token once on packed long documents under real ``torchrun`` (gloo, CPU), the workload that lost 4%.

Documents of very uneven length, packed, make shares that are uneven by tokens: a byte-balanced
JSONL share or a row-balanced Parquet share of the same documents packs into very different
numbers of batches on each rank. One launch per world size (tests/dist_scripts/long_docs_run.py, in
the launch it shares with test_fillers_torchrun.py: tests/runtime/workloads.py) reads them through
every loader kind for two epochs; the histogram of the predictions the ranks trained (labels as the
model shifts them), summed, must equal the corpus's (every token but each document's first, its
``[SEP]`` included), and the tokens they read the corpus's plus one context token per cut, every
epoch, with equal steps and nothing counted as dropped — except under the explicit
``equal_steps="drop"``, whose skips must account for exactly the tokens missing.
"""

from __future__ import annotations

import collections
import json

import pytest
import torch.distributed as dist

import padpipe as pp
from tests.runtime import workloads

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]  # the first file to run launches both

LOSSLESS = ("default", "workers", "repeat", "accum")


def reference(texts: list[str], first: int = 0) -> collections.Counter:
    """Every token of the corpus, each document tokenized alone (from its token ``first``: 1 for the predictions)."""
    tok = pp.examples.tokenizer()
    return collections.Counter(i for text in texts for i in tok.encode(text).ids[first:])


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    texts, tok = workloads.corpus(), pp.examples.tokenizer()
    out: dict = {"every": reference(texts), "predictions": reference(texts, first=1)}
    lengths = [len(tok.encode(text).ids) for text in texts]
    out["cuts"] = sum(-(-(n - 1) // 255) - 1 for n in lengths if n > 256)  # rows of 256: 255 new tokens a piece after
    assert out["cuts"] > 100, "the corpus has documents to cut"
    for ranks in (2, 3):
        folder = workloads.launched(tmp_path_factory, ranks)  # shared with test_fillers_torchrun.py
        out[ranks] = [json.loads((folder / f"x{ranks}-long_docs-rank{r}.json").read_text()) for r in range(ranks)]
    return out


def summed(records: list[dict], key: str, epoch: int, what: str = "histogram") -> collections.Counter:
    total: collections.Counter = collections.Counter()
    for record in records:
        total.update({int(k): v for k, v in record[key][epoch][what].items()})
    return total


@pytest.mark.parametrize("ranks", [2, 3])
@pytest.mark.parametrize("name", ["docs.jsonl", "docs.parquet"])
def test_shares_of_packed_long_documents_are_uneven_by_batches(runs, ranks, name):
    """The premise: without moving batches, the ranks would end many steps apart."""
    own = [r[f"{name}/default"][0]["counters"] for r in runs[ranks]]
    moved = sum(c.get("equal_steps.moved_batches", 0) for c in own)
    assert moved >= 10, f"only {moved} batches moved: the corpus no longer tests uneven shares"
    assert sum(c["pack.context_tokens"] for c in own) == runs["cuts"], "the ranks' stats name one token a cut"


@pytest.mark.parametrize("ranks", [2, 3])
@pytest.mark.parametrize("kind", LOSSLESS)
@pytest.mark.parametrize("name", ["docs.jsonl", "docs.parquet"])
def test_every_token_of_packed_long_documents_arrives_once_under_torchrun(runs, ranks, name, kind):
    records = runs[ranks]
    key = f"{name}/{kind}"
    for epoch in range(2):
        predicted = summed(records, key, epoch, "predicted")
        assert predicted == runs["predictions"], f"epoch {epoch}: every prediction of the corpus once"
        read = summed(records, key, epoch)
        assert not runs["every"] - read and sum((read - runs["every"]).values()) == runs["cuts"], "one more a cut"
        assert len({r[key][epoch]["steps"] for r in records}) == 1, "every rank takes the same steps"
        assert all(r[key][epoch]["skipped"] == {} for r in records), "nothing dropped, nothing counted as dropped"


@pytest.mark.parametrize("ranks", [2, 3])
@pytest.mark.parametrize("name", ["docs.jsonl", "docs.parquet"])
def test_repeat_counts_its_rows_once_and_reads_nothing_again(runs, ranks, name):
    """Replays come from memory: the ranks' rows are the default loader's, not twice a share."""
    for epoch in range(2):
        default = sum(r[f"{name}/default"][epoch]["rows"] for r in runs[ranks])
        repeat = sum(r[f"{name}/repeat"][epoch]["rows"] for r in runs[ranks])
        assert repeat == default
        replays = sum(
            r[f"{name}/repeat"][epoch]["counters"].get("equal_steps.repeated_batches", 0) for r in runs[ranks]
        )
        assert replays > 0


@pytest.mark.parametrize("ranks", [2, 3])
@pytest.mark.parametrize("name", ["docs.jsonl", "docs.parquet"])
def test_accumulation_windows_count_the_label_tokens_of_every_rank(runs, ranks, name):
    records = [r[f"{name}/accum"][0]["windows"] for r in runs[ranks]]
    assert len({len(w) for w in records}) == 1
    for start in range(0, len(records[0]), 3):
        window = [w[start : start + 3] for w in records]
        counted = {items for w in window for items, _ in w}
        assert counted == {sum(mine for w in window for _, mine in w)}, f"window at step {start}"


@pytest.mark.parametrize("ranks", [2, 3])
@pytest.mark.parametrize("name", ["docs.jsonl", "docs.parquet"])
def test_drop_is_opt_in_and_counts_exactly_what_it_drops(runs, ranks, name):
    records = runs[ranks]
    for epoch in range(2):
        got = summed(records, f"{name}/drop", epoch, "predicted")
        missing = runs["predictions"] - got
        assert not got - runs["predictions"], "no prediction twice"
        dropped = sum(r[f"{name}/drop"][epoch]["skipped"].get("equal_steps.dropped_batches", 0) for r in records)
        assert sum(missing.values()) > 0 and dropped > 0
