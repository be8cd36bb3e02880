"""Masked SFT rows packed, in a tiny Llama built from a config: each document's loss packed is its loss alone.

``pp.check_packing`` compares each document's loss terms packed and alone (and the trained tokens);
HF's own loss on a packed batch of masked rows equals the documents' own losses alone, summed.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import padpipe as pp
from padpipe.inspection.packing_check import DocumentCheck
from padpipe.inspection.packing_loss import compare_loss
from padpipe.inspection.packing_rows import Document, find_documents
from tests.inspection.test_packing_check import VOCAB, causal_lm

transformers = pytest.importorskip("transformers")

SEQ_LEN = 48


def masked_rows(count: int = 24) -> list[dict]:
    """Chat-like rows: a prompt masked with -100, then a trained answer; ids within the tiny vocabulary."""
    rows = []
    for i in range(count):
        ids = [5 + (i * 31 + j * 17) % (VOCAB - 5) for j in range(4 + (i * 7) % 19)]
        prompt = 1 + i % (len(ids) - 1)
        rows.append({"input_ids": ids, "labels": [-100] * prompt + ids[prompt:], "idx": i})
    return rows


def packed_loader(**options: Any) -> Any:
    pipe = pp.from_iterable(masked_rows()).tokens(pad_id=0)
    return pipe.pack(SEQ_LEN, batch_size=2, buffer_size=16, **options).loader()


def test_check_packing_compares_each_masked_documents_loss_packed_and_alone() -> None:
    model = causal_lm("llama", "sdpa", use_cache=False)
    report = pp.check_packing(model, packed_loader(), max_documents=6)
    assert report.exact and report.verdict.startswith("exact: 6 documents get their own logits and loss (")
    for check in report.documents:
        assert check.loss is not None and check.loss.exact
        assert check.loss.trained_packed == check.loss.trained_alone > 0
        assert abs(check.loss.packed - check.loss.alone) <= check.loss.tolerance
    assert "trained tokens packed" in str(report).splitlines()[1]


def test_a_documents_loss_alone_is_hfs_own_loss_of_it() -> None:
    """compare_loss counts and sums as the model's own loss does (shifted labels, -100 left out)."""
    model = causal_lm("llama", "sdpa", use_cache=False).eval()
    batch = next(iter(packed_loader()))
    with torch.no_grad():
        packed = model(**{k: v for k, v in batch.items() if k != "labels"}).logits
        for d in find_documents(batch, 0)[:4]:
            ids, labels = batch["input_ids"][d.row, d.start : d.end], batch["labels"][d.row, d.start : d.end]
            own = model(input_ids=ids[None], labels=labels[None])
            check = compare_loss(packed[d.row], own.logits[0], batch["labels"][d.row], d, causal=True, tolerance=1e-5)
            assert check.trained_alone == int((labels[1:] != -100).sum())
            assert check.alone == pytest.approx(float(own.loss) * check.trained_alone, rel=1e-5)


def test_hfs_loss_of_a_packed_masked_batch_is_the_sum_of_its_documents_losses_alone() -> None:
    model = causal_lm("llama", "sdpa", use_cache=False).eval()
    for batch in packed_loader():
        with torch.no_grad():
            packed = model(**batch)
            total, trained = 0.0, 0
            for d in find_documents(batch, 0):
                ids, labels = batch["input_ids"][d.row, d.start : d.end], batch["labels"][d.row, d.start : d.end]
                count = int((labels[1:] != -100).sum())
                if count:
                    total += float(model(input_ids=ids[None], labels=labels[None]).loss) * count
                    trained += count
        assert trained == int((batch["labels"][:, 1:] != -100).sum())
        assert float(packed.loss) == pytest.approx(total / trained, rel=1e-5)


def test_check_packing_raises_error_naming_labels_across_a_boundary() -> None:
    """A stage after pack() that trains each document's first token: logits are exact, the loss is not."""
    batch = dict(next(iter(packed_loader())))
    labels = batch["labels"].clone()
    later = next(d for d in find_documents(batch, 0) if d.start > 0)
    labels[later.row, later.start] = batch["input_ids"][later.row, later.start]
    message = (
        rf"^check_packing: 1 of \d documents get another loss packed than alone, first at batch 0, row "
        rf"{later.row}, tokens {later.start}:{later.end}: loss \S+ over (\d+) trained tokens packed, \S+ over "
        rf"(?!\1)\d+ alone; cause \[labels_cross_boundary\]: labels\[{later.row}, {later.start}\] is \d+, not -100, "
        rf"at the first token of batch 0, row {later.row}, tokens {later.start}:{later.end}: the loss trains the "
        r"token before it \(of another document\) to predict it\. Fix: put -100 at each document's first token "
        r"and on padding, as pack\(\) makes its labels \(a stage or collator after pack\(\) must keep them\)\.$"
    )
    model = causal_lm("llama", "sdpa", use_cache=False)
    with pytest.raises(pp.PackingError, match=message) as caught:
        pp.check_packing(model, {**batch, "labels": labels}, max_documents=8)
    assert caught.value.cause.key == "labels_cross_boundary"
    report = caught.value.report
    assert (
        report.verdict
        == f"wrong: 1 of {len(report.documents)} documents get another loss packed than alone (their labels)"
    )
    assert all(d.logits_exact for d in report.documents)


def test_a_document_check_is_exact_only_with_its_logits_and_its_loss() -> None:
    d = Document(0, 0, 2, 6)
    logits = torch.zeros(6, 3)
    crossing = compare_loss(logits, logits[2:], torch.tensor([-100, 1, 2, 1, 0, 2]), d, causal=True, tolerance=1e-5)
    assert not DocumentCheck(d, 0.0, 1e-5, crossing).exact and DocumentCheck(d, 0.0, 1e-5, crossing).logits_exact
    assert DocumentCheck(d, 0.0, 1e-5, None).exact and not DocumentCheck(d, 1.0, 1e-5, None).exact
