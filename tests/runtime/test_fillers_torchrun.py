"""The epoch's uneven tail under real ``torchrun`` x2 and x3: real pieces where tokens can fill a step, no row twice.

The issue-39 tails: ``pack(256, batch_size=1)`` over 40 documents left 4 one-row batches for 3
ranks (2 fillers) and 41 documents 3 for 2 (1 filler), and packed chats one filler an epoch; a loop
that knows nothing of fillers trained those rows twice. One launch per world size
(tests/dist_scripts/fillers_run.py) reads the three workloads for two epochs in a plain loop. With
token-level labels the ranks must get real pieces (no filler) and the labels they train, summed, must
be each label of the data once; sentence pairs (one label a row) keep a filler only where fewer
rows are left than ranks. The launches also serve test_long_docs_torchrun.py (tests/runtime/workloads.py).
"""

from __future__ import annotations

import collections
import importlib.util
import json
from pathlib import Path

import pytest
import torch.distributed as dist

import padpipe as pp
from tests.runtime import workloads

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]  # the first file to run launches both

SCRIPT = Path(__file__).parent.parent / "dist_scripts" / "fillers_run.py"
SIZES = workloads.FILLERS


def script():
    spec = importlib.util.spec_from_file_location("fillers_run", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    run = script()
    out = {}
    for ranks in SIZES:
        folder = workloads.launched(tmp_path_factory, ranks)  # shared with test_long_docs_torchrun.py
        records = [json.loads((folder / f"x{ranks}-fillers-rank{r}.json").read_text()) for r in range(ranks)]
        every = {}
        for name, pipe in run.pipelines(str(folder / "fillers")).items():  # one process: each label once
            every[name] = collections.Counter(x for b in pipe.loader() for x in run.trained(b, name != "pairs"))
        out[ranks] = (records, every)
    return out


def summed(records: list[dict], name: str, epoch: int, key: str) -> collections.Counter:
    total: collections.Counter = collections.Counter()
    for record in records:
        total.update({int(k): v for k, v in record[name][epoch][key].items()})
    return total


@pytest.mark.parametrize("ranks", [2, 3])
@pytest.mark.parametrize("name", ["docs", "docs_idx", "chats", "one_doc"])
def test_packed_rows_are_cut_into_real_pieces_so_a_plain_loop_trains_every_label_once(runs, ranks, name):
    records, every = runs[ranks]
    for epoch in range(2):
        mine = [record[name][epoch] for record in records]
        assert len({m["steps"] for m in mine}) == 1, "every rank takes the same steps"
        assert [m["fillers"] for m in mine] == [0] * ranks
        assert summed(records, name, epoch, "plain") == every[name], "a loop unaware of fillers: each label once"
        assert all(m["real"] for m in mine), "every rank trains real tokens"
    splits = sum(record[name][0]["counters"].get("equal_steps.split_batches", 0) for record in records)
    assert splits > 0, "the tail was uneven: rows were cut"


@pytest.mark.parametrize("ranks", [2, 3])
def test_the_labels_each_trained_once_are_every_prediction_of_the_documents(runs, ranks):
    """The reference above is no artefact of packing: it is every token of the documents but each one's first (the
    pieces after a cut start with the token before it, as context), ``[SEP]`` included."""
    _, every = runs[ranks]
    tok = pp.examples.tokenizer()
    texts = workloads.corpus()[: SIZES[ranks]["docs"]]
    assert any(len(tok.encode(text).ids) > 256 for text in texts), "some documents are cut"
    assert every["docs"] == collections.Counter(i for text in texts for i in tok.encode(text).ids[1:])


@pytest.mark.parametrize("ranks", [2, 3])
def test_kept_ids_go_with_the_pieces_of_their_documents_and_each_prediction_once(runs, ranks):
    """``pack(keep=("idx",))``: the rows are cut as without it (no filler, above), every segment's tokens are a
    stretch of the document its ``idx`` names, and the predictions the ranks train, counted per ``idx``, are each
    document's tokens but its first, once."""
    records, _ = runs[ranks]
    tok = pp.examples.tokenizer()
    corpus = [tok.encode(text).ids for text in workloads.corpus()[: SIZES[ranks]["docs"]]]
    expected = collections.Counter((idx, token) for idx, ids in enumerate(corpus) for token in ids[1:])
    for epoch in range(2):
        segments = [s for record in records for s in record["docs_idx"][epoch]["documents"]]
        predicted = collections.Counter((idx, label) for idx, _, labels in segments for label in labels)
        assert predicted == expected, f"epoch {epoch}: every prediction of every document once, under its idx"
        for idx, tokens, _ in segments:
            document = corpus[idx]
            assert any(document[s : s + len(tokens)] == tokens for s in range(len(document))), idx
        cut = [r["docs_idx"][epoch]["counters"].get("equal_steps.split_batches", 0) for r in records]
        assert sum(cut) > 0, "rows were cut at the tail"


@pytest.mark.parametrize("ranks", [2, 3])
def test_rows_with_one_label_keep_a_filler_only_where_fewer_rows_are_left_than_ranks(runs, ranks):
    records, every = runs[ranks]
    for epoch in range(2):
        mine = [record["pairs"][epoch] for record in records]
        assert len({m["steps"] for m in mine}) == 1
        assert sum(m["fillers"] for m in mine) == ranks - SIZES[ranks]["pairs"]
        assert summed(records, "pairs", epoch, "real") == every["pairs"]
