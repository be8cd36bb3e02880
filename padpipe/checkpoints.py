"""A loader's checkpoints: rank states checked as one checkpoint of one run (:func:`one_checkpoint`), and every
rank's in one value (:data:`CHECKPOINT`, what :meth:`~padpipe.loader.PipelineLoader.checkpoint` gathers and every
framework adapter saves; docs/elastic.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from padpipe.runtime.held import SPEC, Held
from padpipe.sharing.ranks import all_ranks
from padpipe.state import ListOf, Plain, StateMismatchError, StateSchema, invalid, load_value
from padpipe.state_walk import deeper_than

CHECKPOINT = StateSchema("PipelineLoader checkpoint", 1, ranks=ListOf(Plain()))
"""Every rank's ``{"loader": its state, "ahead": its batches returned and not trained}``, in rank order."""
PART_KEYS = ("loader", "ahead")


def gathered(state: Any, ahead: list[Any], group: Any = None) -> dict[str, Any]:
    """The :data:`CHECKPOINT` of every rank of ``group``, from this rank's loader ``state`` and ``ahead`` batches
    (a collective: every rank calls it)."""
    return CHECKPOINT.make({}, ranks=all_ranks({"loader": state, "ahead": Held(ahead).saved()}, group))


def is_checkpoint(state: Any) -> bool:
    """Whether ``state`` is a :data:`CHECKPOINT` (every rank's), not one rank's loader state."""
    return isinstance(state, Mapping) and "ranks" in state and "root" not in state


def own_part(state: dict[str, Any]) -> list[dict[str, Any]]:
    """The parts of a :data:`CHECKPOINT`, checked: one ``{"loader", "ahead"}`` per saved rank."""
    loaded = CHECKPOINT.check(state, {})
    if not loaded.ranks:
        raise invalid(CHECKPOINT.stage, "ranks", "a list of every rank's state", "[]")
    for r, one in enumerate(loaded.ranks):
        if not isinstance(one, dict) or set(one) != set(PART_KEYS) or not isinstance(one["ahead"], list):
            found = sorted(one) if isinstance(one, dict) else type(one).__name__
            raise invalid(CHECKPOINT.stage, f"ranks[{r}]", f"a dict with keys {sorted(PART_KEYS)}", found)
        load_value(CHECKPOINT.stage, f"ranks[{r}].ahead", one["ahead"], SPEC)
    return list(loaded.ranks)


STATE_DEPTH = 256
"""Most levels of lists and dicts a whole loader state nests (states of 20 stages with worker processes nest 20)."""


def check_nesting(state: dict[str, Any]) -> None:
    """Refuse a state nesting deeper than :data:`STATE_DEPTH` levels, before anything walks it recursively (a copy,
    pickling it for worker processes): each stage refuses deep values of its own; this, a chain of stage states."""
    where = deeper_than(state, STATE_DEPTH, sealed=None)
    if where is not None:
        raise invalid("PipelineLoader", where, f"plain data nested at most {STATE_DEPTH} levels deep", "nested deeper")


def one_checkpoint(states: list[dict[str, Any]], *, independent: bool = False) -> list[dict[str, Any]]:
    """``states`` sorted by rank, after checking they are one checkpoint of one run (``StateMismatchError`` if not).

    Each rank at most once, all saved with the same number of ranks and workers, in the same
    epoch, and at the same step: where ranks agreed every step (``torch.distributed``) always;
    otherwise unless every rank had ended its share of the epoch or the caller says the ranks ran
    ``independent``-ly (each saving at a step of its own).
    """
    key = "layout"
    layouts = {tuple(s[key][1:]) for s in states}
    if len(layouts) > 1:
        found = ", ".join(f"{r} ranks x {w} workers" for r, w in sorted(layouts))
        raise StateMismatchError(
            f"PipelineLoader states come from different runs: saved on {found}; pass the states "
            "of one checkpoint (every rank's, from one folder)."
        )
    ranks = [s[key][0] for s in states]
    twice = sorted({r for r in ranks if ranks.count(r) > 1})
    if twice:
        raise StateMismatchError(
            f"PipelineLoader states hold rank {twice[0]} more than once (ranks {sorted(ranks)}): "
            "pass each rank's state of one checkpoint once."
        )
    if any(r >= states[0][key][1] for r in ranks):
        raise StateMismatchError(
            f"PipelineLoader states name ranks {sorted(ranks)}, but were saved by {states[0][key][1]} ranks."
        )
    states = sorted(states, key=lambda s: s[key][0])
    where = [(s["epoch"], s["step"]) for s in states]
    lockstep = all(s["lockstep"] for s in states)
    agree = lockstep or not (independent or all(s["finished"] for s in states))
    if len({e for e, _ in where}) > 1 or (agree and len(set(where)) > 1):
        found = ", ".join(f"rank {s[key][0]} at epoch {e} step {n}" for s, (e, n) in zip(states, where))
        unless = (
            ""
            if lockstep or len({e for e, _ in where}) > 1
            else ", or pass independent=True if the ranks ran independently (no equal steps), each saving at a step "
            "of its own"
        )
        raise StateMismatchError(
            f"PipelineLoader states come from different checkpoints: {found}; pass the states "
            f"of one checkpoint (every rank's, saved at the same step){unless}."
        )
    return states
