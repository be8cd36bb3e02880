"""The state a :class:`~padpipe.loader.PipelineLoader` saves, declared once for the loader and the elastic planner.

Example:
    >>> sorted(LOADER_STATE.fields)
    ['epoch', 'finished', 'layout', 'lockstep', 'root', 'step']
"""

from __future__ import annotations

from padpipe.state import Bool, Child, Int, ListOf, Optional, StateSchema

MAX_LAYOUT = 1 << 20
"""Most ranks, and most workers a rank, a state may name (a claim of more is refused before anything is made for it)."""

LOADER_STATE = StateSchema(
    "PipelineLoader",
    3,
    root=Optional(Child()),  # the graph's state (None: saved before the first batch)
    finished=Bool(),  # the epoch's for loop had ended
    layout=ListOf(Int(0, MAX_LAYOUT), length=3),  # [rank, ranks, workers] of the loader that saved it
    epoch=Int(-1),  # the epoch of the last batch returned (-1: none yet)
    step=Int(0),  # batches returned in that epoch
    lockstep=Bool(),  # whether ranks agreed each step (so every rank's state has the same step)
)
