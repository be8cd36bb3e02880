"""``pp.mix``: one pipeline drawing rows from several by weight (web 70 %, code 30 %, ...)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

from padpipe.errors import check_seed, one_of, positive
from padpipe.pipeline import RECORDS, TOKENS, Pipeline, Stage
from padpipe.pipes.mix import STOPS, WeightedMixer, check_weights

if TYPE_CHECKING:
    from torchdata.nodes import BaseNode

    from padpipe._build import BuildContext


def mix(
    pipelines: Mapping[str, Pipeline],
    *,
    weights: Mapping[str, float] | None = None,
    seed: int = 0,
    stop: Literal["all_exhausted", "first_exhausted", "cycle"] = "all_exhausted",
    chunk_rows: int = 1024,
) -> Pipeline:
    """Mix pipelines row by row: each row comes from pipeline ``name`` with probability ~ ``weights[name]``.

    The pipelines must all yield records (mix, then ``.tokenize()`` once; the same column names,
    e.g. ``columns=["text"]`` in each reader) or all yield tokens (tokenized each its own way,
    the same pass-through columns; pass ``pad_id=`` to ``.pad()`` then). The draws are seeded by
    ``(seed, epoch)`` and are the same on every rank and DataLoader worker; each sub-pipeline's
    readers split their own files across ranks and workers as usual, so every consumer mixes
    its own share. Epoch ``e`` of the mix reads epoch ``e`` of every sub-pipeline. Resume is exact
    (the sub-pipelines' states and the rows buffered per pipeline are saved).

    Unlike ``torchdata.nodes.MultiNodeWeightedSampler``, it draws rows, not chunks of unequal sizes, the same
    on every rank, starts any epoch on ``reset()``, and checks its state on resume.

    Args:
        pipelines: Name -> pipeline, all yielding ``"records"`` or all ``"tokens"``.
        weights: Name -> weight (> 0; normalized), the same keys as ``pipelines``; default:
            equal weights.
        seed: Seed of the draws; also the default seed of a later ``.bucket()``.
        stop: When a pipeline runs out: ``"all_exhausted"`` (it leaves the draw, the rest share
            its weight; every row of every pipeline once per epoch), ``"first_exhausted"`` (the
            epoch ends) or ``"cycle"`` (it restarts with its next epoch, keeping the weights,
            until every pipeline has run out once).
        chunk_rows: Rows per mixed chunk passed downstream.

    Example:
        >>> web = pp.read_jsonl("web/*.jsonl.zst", columns=["text"])  # doctest: +SKIP
        >>> code = pp.read_parquet("code/", columns=["text"])  # doctest: +SKIP
        >>> pipe = pp.mix({"web": web, "code": code}, weights={"web": 0.7, "code": 0.3}, seed=0)  # doctest: +SKIP
        >>> pipe.tokenize(tok).bucket(max_tokens=16384).pad().loader()  # doctest: +SKIP
    """
    if not isinstance(pipelines, Mapping) or not pipelines:
        raise ValueError("`pipelines` must be a non-empty dict of name -> Pipeline.")
    for name, pipe in pipelines.items():
        if not isinstance(pipe, Pipeline):
            raise TypeError(f"`pipelines[{name!r}]` must be a padpipe Pipeline, but is {type(pipe).__name__} instead.")
    outputs = {name: pipe.output for name, pipe in pipelines.items()}
    kinds = set(outputs.values())
    if len(kinds) != 1 or not kinds <= {RECORDS, TOKENS}:
        raise ValueError(
            f"mix() needs pipelines that all yield records or all yield tokens, but they yield {outputs!r}."
        )
    weights = check_weights(list(pipelines), {name: 1.0 for name in pipelines} if weights is None else weights)
    check_seed(seed)
    one_of("stop", stop, STOPS)
    positive("chunk_rows", chunk_rows)
    options = {"pipelines": dict(pipelines), "weights": weights, "seed": seed, "stop": stop, "chunk_rows": chunk_rows}
    return Pipeline(Stage("mix", _build_mix, options), output=kinds.pop(), seed=seed)


def _build_mix(upstream: None, ctx: BuildContext, *, pipelines: dict[str, Pipeline], **options: Any) -> BaseNode:
    """Build every sub-pipeline's graph for this consumer, into one mixer sharing the stats."""
    sources = {name: pipe.build(consumer=ctx.consumer, stats=ctx.stats) for name, pipe in pipelines.items()}
    return WeightedMixer(sources, stats=ctx.stats, **options)
