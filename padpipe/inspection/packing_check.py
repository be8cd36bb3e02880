"""``pp.check_packing``: does the user's own model see each packed document on its own?

It compares the model's logits (and losses: :mod:`padpipe.inspection.packing_loss`) on packed batches with
each document's alone, and raises :class:`PackingError` naming the cause and the fix
(:mod:`padpipe.inspection.packing_causes`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

from padpipe.errors import positive
from padpipe.inspection.packing_causes import Cause, attention_of, diagnose, is_causal, tolerance, use_cache_of
from padpipe.inspection.packing_loss import LossCheck, compare_loss, label_cause, max_difference
from padpipe.inspection.packing_rows import Document, choose, find_documents, read_batches


@dataclasses.dataclass(frozen=True)
class DocumentCheck:
    """One document's largest logit difference, packed against alone, the tolerance it had, and its loss check.

    ``loss`` is ``None`` when the batch has no ``labels``.
    """

    document: Document
    max_abs_diff: float
    tolerance: float
    loss: LossCheck | None = None

    @property
    def logits_exact(self) -> bool:
        return self.max_abs_diff <= self.tolerance

    @property
    def exact(self) -> bool:
        return self.logits_exact and (self.loss is None or self.loss.exact)


@dataclasses.dataclass(frozen=True)
class PackingReport:
    """What :func:`check_packing` compared: the documents, the model's settings, the verdict."""

    documents: tuple[DocumentCheck, ...]
    attn_implementation: str | None
    use_cache: bool
    dtype: str
    atol: float
    rtol: float

    @property
    def exact(self) -> bool:
        return all(d.exact for d in self.documents)

    @property
    def max_abs_diff(self) -> float:
        return max((d.max_abs_diff for d in self.documents), default=0.0)

    @property
    def worst(self) -> DocumentCheck | None:
        """The document whose difference is largest against its tolerance."""
        return max(self.documents, key=lambda d: d.max_abs_diff / d.tolerance, default=None)

    @property
    def verdict(self) -> str:
        count, diff = len(self.documents), f"{self.max_abs_diff:.1e}"
        wrong = sum(not d.logits_exact for d in self.documents)
        if wrong:
            return f"wrong: {wrong} of {count} documents see others (max abs difference {diff})"
        wrong = sum(not d.exact for d in self.documents)
        if wrong:
            return f"wrong: {wrong} of {count} documents get another loss packed than alone (their labels)"
        what = "logits and loss" if all(d.loss is not None for d in self.documents) else "logits"
        return f"exact: {count} documents get their own {what} (max abs difference {diff})"

    def __str__(self) -> str:
        head = (
            f"check_packing: attn_implementation={self.attn_implementation!r}, use_cache={self.use_cache}, "
            f"dtype={self.dtype}, tolerance atol={self.atol:.0e} + rtol={self.rtol:.0e} x |logits|"
        )
        lines = [
            f"  {d.document}: max abs difference {d.max_abs_diff:.1e}{'' if d.loss is None else f'; {d.loss}'}"
            f"{'' if d.exact else '  WRONG'}"
            for d in self.documents
        ]
        return "\n".join([head, *lines, self.verdict])


class PackingError(ValueError):
    """Packed documents get other logits than alone (attention crosses documents), with the cause.

    ``cause`` is the :class:`~padpipe.inspection.packing_causes.Cause` found (its ``key``, e.g.
    ``"use_cache"``), or ``None``; ``report`` is the :class:`PackingReport` (``None`` when the
    packed forward itself failed).
    """

    def __init__(self, message: str, cause: Cause | None, report: PackingReport | None) -> None:
        super().__init__(message)
        self.cause, self.report = cause, report


class NothingToCheck(ValueError):
    """The batches hold no document that another could be seen from (padding only, or one document a row)."""


def check_packing(
    model: Any,
    batches: Mapping[str, Any] | Iterable[Mapping[str, Any]],
    *,
    max_documents: int = 8,
    max_batches: int = 2,
    columns: Callable[[dict], dict] | None = None,
    atol: float | None = None,
    rtol: float | None = None,
) -> PackingReport:
    """Check that ``model`` gives every packed document the logits it gives the document alone.

    The model runs as it is (its ``attn_implementation``, ``use_cache``, dtype and device), in eval
    mode under ``torch.no_grad()``, random states untouched: once per packed batch as the loader
    yields it (``columns`` applied), and once per document alone (``model(input_ids=doc[None])``).
    Where the batch has ``labels``, each document's loss terms and trained tokens are compared too
    (:mod:`padpipe.inspection.packing_loss`). A padpipe loader is read through
    :meth:`~padpipe.loader.PipelineLoader.copy`, so it may be checked inside its own ``for`` loop
    (under ``torch.distributed``, on every rank), the loop, its state and stats as without the check;
    another stateful loader is put back where it was. Cost: at most ``max_batches`` packed forwards
    and ``max_documents`` single ones, memory one batch's logits plus one document's (docs/packing.md).

    Args:
        model: A ``transformers`` model (or any module whose output has ``logits``, or is them).
        batches: A packed batch, or batches (a loader: at most ``max_batches`` are read).
        max_documents: Documents run alone (those after another in their row first).
        max_batches: Packed batches read from ``batches``.
        columns: What the model is given of a batch (e.g. a trainer's column filter); default: all.
        atol: Absolute tolerance; default by the model's dtype (float32 ``1e-5``, bfloat16 ``1e-2``).
        rtol: Tolerance relative to the largest logit of the document; default by dtype (float32 ``1e-4``).

    Returns:
        A :class:`PackingReport` of an exact check.

    Raises:
        PackingError: A document's logits or loss differ beyond the tolerance, or the packed forward
            fails for a known cause (the message names the document, the cause and the fix).
        NothingToCheck: No document of the batches could see another: no verdict can be given.

    Example:
        >>> import transformers
        >>> config = transformers.LlamaConfig(vocab_size=8000, hidden_size=32, num_hidden_layers=2,
        ...                                   attn_implementation="sdpa", use_cache=False)
        >>> model = transformers.LlamaForCausalLM(config)
        >>> tokens = pp.read_jsonl(pp.examples.SAMPLE_JSONL).tokenize(pp.examples.tokenizer(), max_length=16)
        >>> pipe = tokens.pack(64, batch_size=2)  # 4 or more documents a row
        >>> pp.check_packing(model, pipe.loader()).exact
        True
    """
    positive("max_documents", max_documents)
    positive("max_batches", max_batches)
    read = read_batches(batches, max_batches)
    if not read:
        raise ValueError("check_packing: `batches` holds no batch; expected at least one packed batch.")
    select = columns if columns is not None else dict
    pad_id = getattr(getattr(model, "config", None), "pad_token_id", None)
    found = [find_documents(b, i, pad_id=pad_id) for i, b in enumerate(read)]
    chosen = choose([d for docs in found for d in docs], max_documents)
    if not chosen:
        raise NothingToCheck(
            f"check_packing: the batches read ({len(read)}) hold padding only; expected packed rows with documents."
        )
    _refuse_one_document_rows(model, read, chosen)
    parameter = next(iter(model.parameters()), None)
    device = parameter.device if parameter is not None else torch.device("cpu")
    dtype = parameter.dtype if parameter is not None else torch.float32
    default_atol, default_rtol = tolerance(dtype)
    atol, rtol = default_atol if atol is None else atol, default_rtol if rtol is None else rtol
    inputs = [_to(select(dict(b)), device) for b in read]
    checks = []
    causal = is_causal(model) is not False
    training = model.training
    model.eval()
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            for number, (batch, given) in enumerate(zip(read, inputs)):
                docs = [d for d in chosen if d.batch == number]
                if not docs:
                    continue
                try:  # without its labels: the model's own loss over the batch is not needed here
                    packed = _logits(model(**{k: v for k, v in given.items() if k != "labels"}))
                except Exception as exc:  # a forward that fails for a known cause says which
                    cause = diagnose(model, batch, given, found[number])
                    if cause is None:
                        raise
                    raise PackingError(
                        _message(cause, f"the packed forward failed ({exc!r:.160})"), cause, None
                    ) from exc
                labels = _labels(batch)
                cache = {"use_cache": given["use_cache"]} if "use_cache" in given else {}  # as the batch says
                for d in docs:
                    ids = batch["input_ids"][d.row, d.start : d.end][None].to(device)
                    alone = _logits(model(input_ids=ids, **cache))[0]
                    diff, top = max_difference(packed[d.row, d.start : d.end], alone)
                    within = atol + rtol * top
                    loss = None
                    if labels is not None:
                        loss = compare_loss(packed[d.row], alone, labels[d.row], d, causal=causal, tolerance=within)
                    checks.append(DocumentCheck(d, diff, within, loss))
    finally:
        model.train(training)
    report = PackingReport(tuple(checks), attention_of(model), use_cache_of(model, inputs[0]), str(dtype), atol, rtol)
    if report.exact:
        return report
    if all(d.logits_exact for d in checks):  # the logits are right, so the labels are not
        wrong = [d for d in checks if d.loss is not None and not d.loss.exact]
        first = wrong[0]
        cause = label_cause(read[first.document.batch]["labels"], first.document)
        what = (
            f"{len(wrong)} of {len(checks)} documents get another loss packed than alone, first at "
            f"{first.document}: {first.loss}"
        )
        raise PackingError(_message(cause, what), cause, report)
    worst = max(checks, key=lambda d: d.max_abs_diff / d.tolerance)
    number = worst.document.batch
    cause = diagnose(model, read[number], inputs[number], found[number])
    what = (
        f"{sum(not d.exact for d in checks)} of {len(checks)} documents get other logits packed than alone, "
        f"worst at {worst.document}: max abs difference {worst.max_abs_diff:.1e}, "
        f"expected at most {worst.tolerance:.1e}"
    )
    raise PackingError(_message(cause, what), cause, report)


def _refuse_one_document_rows(model: Any, read: list[dict], chosen: list[Document]) -> None:
    """Refuse batches where no document could see another: an "exact" verdict on them would prove nothing."""
    causal = is_causal(model) is not False
    if any(d.start > 0 or (not causal and d.end < read[d.batch]["input_ids"].shape[1]) for d in chosen):
        return
    what = "a document after another" if causal else "a document beside another or beside padding"
    raise NothingToCheck(
        f"check_packing: no row of the batches read ({len(read)}) holds {what}, so none can see another and the "
        "check would prove nothing; expected packed rows of several documents (read more batches, or pack "
        "shorter documents)."
    )


def _message(cause: Cause | None, what: str) -> str:
    if cause is None:
        return (
            f"check_packing: {what}; attention crosses documents for a cause padpipe does not know. Fix: compare "
            "with attn_implementation='sdpa' and pack(block_mask=True), or raise atol/rtol if this is rounding."
        )
    return f"check_packing: {what}; cause [{cause.key}]: {cause.what}. Fix: {cause.fix}."


def _labels(batch: Mapping[str, Any]) -> torch.Tensor | None:
    """The batch's labels when they lie over its ids (``[rows, seq_len]``), else ``None``."""
    labels, ids = batch.get("labels"), batch.get("input_ids")
    if isinstance(labels, torch.Tensor) and isinstance(ids, torch.Tensor) and labels.shape == ids.shape:
        return labels
    return None


def _to(batch: dict, device: torch.device) -> dict:
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def _logits(output: Any) -> torch.Tensor:
    for name in ("logits", "last_hidden_state"):
        value = output.get(name) if isinstance(output, Mapping) else getattr(output, name, None)
        if isinstance(value, torch.Tensor):
            return value
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    raise TypeError(
        f"check_packing: the model's output is {type(output).__name__}; expected logits (an output with `logits` "
        "or `last_hidden_state`, or a tensor)."
    )
