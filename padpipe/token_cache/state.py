"""Small states with a token cache: buffered rows the cache holds are saved as references, re-read on resume.

A buffered batch whose every row is in a segment the session published or read is saved as its units' folders
and each row's unit and position (12 bytes a row; docs/state.md), and read back checked, in the same order; rows
no longer in the cache are an error naming them. Other batches are saved whole, as without a cache.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import torch

from padpipe.buffers import REFERENCES_KEY
from padpipe.chunks import TokenChunk, truncate_rows
from padpipe.readers.aligned import concat
from padpipe.state import StateMismatchError, seal, unseal
from padpipe.state_walk import show
from padpipe.token_cache import rows as cr
from padpipe.token_cache.plan import Session
from padpipe.token_cache.store import UNIT_FOLDER, CacheError
from padpipe.tokenizer.rows import pass_through

CACHE_KEY, FOLDERS_KEY, UNIT_KEY, POS_KEY = REFERENCES_KEY, "folders", "unit", "pos"
KEYS = (CACHE_KEY, FOLDERS_KEY, UNIT_KEY, POS_KEY)


def references(session: Session, ref: pa.Array) -> dict[str, Any] | None:
    """The compact state of rows ``ref``, or ``None`` unless every row is in a segment ``session`` published or
    read."""
    units, positions = cr.split_refs(ref.to_numpy(zero_copy_only=False))
    if not len(units) or (units < 0).any():
        return None
    distinct, index = np.unique(units, return_inverse=True)
    if not all(session.covered(int(u), positions[units == u]) for u in distinct):
        return None
    return seal(
        {
            CACHE_KEY: session.key,
            FOLDERS_KEY: [session.unit_folder(int(u)) for u in distinct],
            UNIT_KEY: torch.from_numpy(index.astype(np.int32)),
            POS_KEY: torch.from_numpy(positions.astype(np.int64)),
        }
    )


def resolve_chunk(session: Session, state: dict[str, Any], truncate_to: int | None) -> TokenChunk:
    """The token rows a compact state names, read back (cut to ``truncate_to`` tokens)."""
    rows = resolve(session, state)
    columns = {**pass_through(cr.without_hidden(rows), session.fields), cr.REF: rows.column(cr.REF)}
    chunk = cr.chunk_of(rows, columns)
    return chunk if truncate_to is None else truncate_rows(chunk, truncate_to)


def resolve(session: Session, state: dict[str, Any]) -> pa.RecordBatch:
    """The reader rows a compact state names, read back from the cache in the saved order."""
    state = unseal("token cache references", state, KEYS)
    key, folders, index, positions = state[CACHE_KEY], state[FOLDERS_KEY], state[UNIT_KEY], state[POS_KEY]
    if not (
        isinstance(key, str)
        and isinstance(folders, list)
        and all(isinstance(f, str) for f in folders)
        and _vector(index, torch.int32)
        and _vector(positions, torch.int64)
        and len(index) == len(positions)
        and len(index)
        and int(index.min()) >= 0
        and int(index.max()) < len(folders)
    ):
        raise StateMismatchError(
            "token cache references must be a cache name, its folders and one unit and position "
            "per row (int32 and int64 tensors of one length)"
        )
    if key != session.key:
        raise StateMismatchError(
            f"this state refers to rows in the token cache {show(key[:300].partition('|')[0], 200)}, but this "
            "pipeline does not use it; resume with the same tokenize(cache=...) settings."
        )
    for folder in folders:
        _check_folder(session, folder)
    index, positions = index.numpy().astype(np.int64), positions.numpy()
    parts, places = [], []
    for u, folder in enumerate(folders):
        rows = np.flatnonzero(index == u)
        uid = session.unit_number(folder)
        for table, where in _rows_of(session, folder, uid, positions[rows]):
            parts.append(cr.as_cached_rows(table, uid))
            places.append(rows[where])
    batch = concat(parts)
    return batch.take(pa.array(np.argsort(np.concatenate(places), kind="stable")))


def _rows_of(session: Session, folder: str, uid: int, wanted: np.ndarray) -> list[tuple[pa.Table, np.ndarray]]:
    """The rows at positions ``wanted`` of one unit, segment by segment: ``(rows, their places in wanted)``."""
    found = np.zeros(len(wanted), bool)
    out = []
    for segment in sorted(session.segments(folder), key=lambda s: s.lo - s.hi):  # widest first
        inside = ~found & (wanted >= segment.lo) & (wanted < segment.hi)
        if not inside.any():
            continue
        table = session.load(folder, segment, uid, kind=None)
        if table is None:
            continue
        positions = table.column(cr.POS).to_numpy()
        at = np.searchsorted(positions, wanted[inside])
        hit = (at < len(positions)) & (positions[np.minimum(at, len(positions) - 1)] == wanted[inside])
        places = np.flatnonzero(inside)[hit]
        if len(places):
            out.append((table.take(pa.array(at[hit])), places))
            found[places] = True
    if not found.all():
        raise StateMismatchError(
            f"this state refers to {int((~found).sum())} row(s) of {session.store.url(folder)!r} that the token cache "
            "no longer holds (cleared or changed since); resume with the cache it was saved with, or from the start."
        )
    return out


def _check_folder(session: Session, folder: str) -> None:
    """Refuse a state's folder unless it is a unit folder of this cache and fingerprint, under its root."""
    problem = None
    if not UNIT_FOLDER.match(folder) or not folder.startswith(f"{session.fingerprint}/"):
        problem = f"expected '{session.fingerprint}/' and 20 hex digits, the folders this cache writes"
    else:
        try:
            session.store.inside(folder)
        except CacheError:
            problem = "it resolves outside the cache (a link?)"
    if problem:
        raise StateMismatchError(
            f"token cache references name the folder {show(folder, 120)}, which is not a unit folder of the token "
            f"cache at {session.store.url()!r} ({problem}); this state was not made by this pipeline."
        )


def _vector(value: Any, dtype: torch.dtype) -> bool:
    return isinstance(value, torch.Tensor) and value.dtype == dtype and value.dim() == 1
