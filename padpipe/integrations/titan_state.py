"""The torchtitan loader's checkpoint state, and the data-parallel group it shares the data in.

torchtitan's DCP flattens a state into one key per leaf and reads back only the keys the new loader names, so a
per-rank key cannot reach another number of ranks: the state is one key, :data:`KEY`, the same bytes on every
rank (``torch.save`` of :data:`STATE`, every DP rank's position; docs/torchtitan.md). Its settings
(:func:`recipe`) are checked inside torchtitan's ``CheckpointManager.load``, before the model loads.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Mapping
from typing import Any

import torch

from padpipe.sharing.ranks import all_ranks
from padpipe.state import Child, Int, StateMismatchError, StateSchema

KEY = "padpipe"
"""The one key of the loader's state (``"dataloader.padpipe"`` in a torchtitan checkpoint)."""

COUNTS = dict(
    yielded=Int(0),  # batches given to torchtitan since the run started (fill batches included)
    batches_per_step=Int(1),  # batches per optimizer step in the run that saved it
    epochs=Int(0),  # epochs finished
)
STATE = StateSchema("PadpipeDataLoader", 2, checkpoint=Child(), **COUNTS)  # settings: the loader's recipe()
"""``loader.checkpoint()`` (:data:`padpipe.checkpoints.CHECKPOINT`) and torchtitan's counts."""
SOURCE_OPTIONS = ("paths", "columns", "iterable", "dataset")
"""The reader options that say what a pipeline reads (not how: retries, credentials, chunk sizes)."""
HASHED_ITEMS = 100_000
"""In-memory rows (``from_iterable``) up to this many are told apart by a digest; more, by their number."""


def packed(state: dict[str, Any]) -> dict[str, bytes]:
    """The loader state torchtitan saves: ``state`` (a :data:`STATE`) in one bytes value.

    Example:
        >>> state = STATE.make({}, checkpoint={"version": 1}, yielded=4, batches_per_step=2, epochs=0)
        >>> saved = packed(state); sorted(saved), type(saved[KEY]).__name__
        (['padpipe'], 'bytes')
        >>> unpacked(saved).yielded
        4
    """
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return {KEY: buffer.getvalue()}


def recipe(pipe: Any, seq_len: int) -> dict[str, Any]:
    """What a saved state must have been read with: ``pipe``'s data and tokenizers, and torchtitan's ``seq_len``.

    Example:
        >>> pipe = pp.from_iterable([{"text": "a"}, {"text": "b"}]).tokenize(pp.examples.tokenizer())
        >>> recipe(pipe, 2048)
        {'data': 'from_iterable(iterable=2 rows sha1=...)', 'tokenizer': 'vocab=8000 sha1=...', 'seq_len': 2048}
    """
    return {"data": _data(pipe), "tokenizer": _tokenizers(pipe), "seq_len": seq_len}


def _data(pipe: Any) -> str:
    source = pipe.source
    if source.name == "mix":
        parts = sorted(source.options["pipelines"].items())
        return f"mix({', '.join(f'{name}: {_data(part)}' for name, part in parts)})"
    shown = [f"{key}={_shown(value)}" for key, value in source.options.items() if key in SOURCE_OPTIONS]
    return f"{source.name}({', '.join(shown)})"


def _shown(value: Any) -> str:
    """A value as the data's identity: plain values as they are; rows by a digest; a dataset by its type and size."""
    if value is None or isinstance(value, (str, int, float, bool)):
        return repr(value)
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value) and len(value) <= 64:
        return repr(list(value))
    size = len(value) if hasattr(value, "__len__") else None
    if isinstance(value, (list, tuple)) and size is not None and size <= HASHED_ITEMS:
        return f"{size} rows sha1={hashlib.sha1(repr(value).encode()).hexdigest()[:16]}"
    return f"{type(value).__name__}" + (f" of {size} rows" if size is not None else "")


def _tokenizers(pipe: Any) -> str:
    parts = sorted(pipe.source.options["pipelines"].items()) if pipe.source.name == "mix" else []
    found = [_tokenizers(part) for _, part in parts]
    for stage in pipe.stages:
        if stage.name in ("tokenize", "chat"):
            found += [v.fingerprint() for v in stage.options.values() if callable(getattr(v, "fingerprint", None))]
    return ", ".join(found) or "none (token ids)"


def unpacked(state: Any, expected: Mapping[str, Any] | None = None) -> Any:
    """A loader state's :data:`STATE`, checked and loaded (fields as attributes).

    Args:
        state: The loader state (``{"padpipe": bytes}``).
        expected: The loading loader's :func:`recipe`, which the saved one must equal (``None``: not checked).

    Raises:
        StateMismatchError: ``state`` is not this loader's, is of another version, is invalid, or was saved with
            another recipe (data, tokenizer or ``seq_len``).
    """
    blob = state.get(KEY) if isinstance(state, Mapping) else None
    if not isinstance(blob, bytes):
        found = sorted(state) if isinstance(state, Mapping) else type(state).__name__
        raise StateMismatchError(
            f"PadpipeDataLoader state must be a dict with {KEY!r}: bytes (saved by PadpipeDataLoader.state_dict()), "
            f"but is {found} instead."
        )
    try:
        loaded = torch.load(io.BytesIO(blob), weights_only=True)
    except Exception as exc:  # any unpickling failure: the bytes are not a state this loader wrote
        raise StateMismatchError(f"PadpipeDataLoader state {KEY!r} could not be read: {exc}") from None
    return STATE.check(loaded, expected or {})


def data_parallel_group(dp_rank: int, dp_world_size: int) -> Any:
    """The process group of this process's data-parallel peers, found from every process's DP rank (a collective).

    torchtitan 0.3.0 builds its loader with ``dp_rank`` and ``dp_world_size`` only. Each group holds
    the ``j``-th process (by global rank) of every DP rank: in a row-major device mesh, as
    torchtitan's, the ranks sharing every other coordinate. ``None`` (the world) where every process
    is its own DP rank in global-rank order; new gloo groups otherwise (made by every rank in order).

    Raises:
        ValueError: The processes' DP ranks and sizes do not make equal groups, or a group would
            number its ranks otherwise than their DP ranks.
    """
    import torch.distributed as dist

    world, me = dist.get_world_size(), dist.get_rank()
    every = all_ranks([dp_rank, dp_world_size])
    members = {d: [r for r, (rank, _) in enumerate(every) if rank == d] for d in range(dp_world_size)}
    peers = world // dp_world_size if dp_world_size else 0
    if any(size != dp_world_size for _, size in every) or any(len(m) != peers for m in members.values()) or not peers:
        raise ValueError(
            f"padpipe.integrations.torchtitan: every process must have a DP rank of the same dp_world_size, each DP "
            f"rank as often as the others, but the processes' (dp_rank, dp_world_size) are {every}."
        )
    if peers == 1 and all(rank == r for r, (rank, _) in enumerate(every)):
        return None
    groups = [[members[d][j] for d in range(dp_world_size)] for j in range(peers)]
    if any(group != sorted(group) for group in groups):
        raise ValueError(
            f"padpipe.integrations.torchtitan: DP ranks must follow global ranks within each group of peers, but the "
            f"groups by DP rank are {groups}: pass the data-parallel group to the loader (group=...)."
        )
    mine = None
    for group in groups:  # every rank makes every group, in the same order
        made = dist.new_group(group, backend="gloo")
        if me in group:
            mine = made
    return mine
