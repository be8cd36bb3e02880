"""The packer's pieces: documents cut to fit a row (:func:`cut_pieces`), each with its own token-level labels and
kept values, and saved as one chunk in the packer's state (:func:`pieces_to_chunk`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from padpipe.chunks import TokenChunk, exclusive_cumsum
from padpipe.errors import DataError
from padpipe.tokenizer.rows import LABELS, ROW_ID_COLUMNS

IGNORE = -100
"""The label HF's losses leave out (besides the packer's own ``label_pad_id``)."""


class Piece(NamedTuple):
    """A document, or a part of one, as the packer places it.

    Attributes:
        ids: Its token ids.
        labels: Its token-level labels (``int64``, one per token), or ``None`` when its row had none
            (its labels are then its ids).
        values: The values of the kept columns (``pack(keep=...)``) of its document, in ``keep`` order.
    """

    ids: np.ndarray
    labels: np.ndarray | None
    values: tuple[Any, ...]


def _is_list(kind: pa.DataType) -> bool:
    return pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind)


def _where(chunk: TokenChunk, row: int) -> str:
    name = next((c for c in ROW_ID_COLUMNS if c in chunk.columns), None)
    return f"row {row} of the chunk" + (f" ({name}={chunk.columns[name][row].as_py()!r})" if name else "")


def token_labels(chunk: TokenChunk) -> np.ndarray | None:
    """The chunk's token-level labels (a ``labels`` list column), flat and aligned with its ids, or ``None``.

    A ``labels`` column of one value per row (a class label) is not token-level: ``None``.

    Example:
        >>> chunk = TokenChunk.from_lists([[5, 6], [7]], {"labels": pa.array([[-100, 6], [7]], pa.large_list(pa.int64()))})
        >>> token_labels(chunk).tolist()
        [-100, 6, 7]
    """  # noqa: E501
    column = chunk.columns.get(LABELS)
    if column is None or not _is_list(column.type):
        return None
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    counts = pc.list_value_length(column).to_numpy(zero_copy_only=False)
    bad = np.flatnonzero(pc.is_null(column).to_numpy(zero_copy_only=False) | (counts != chunk.lengths))
    if len(bad):
        row = int(bad[0])
        found = "None" if column[row].as_py() is None else f"{int(counts[row])} labels"
        raise DataError(
            f"pack: token-level labels at {_where(chunk, row)} are {found} for {int(chunk.lengths[row])} tokens; "
            "expected one label per token."
        )
    values = pc.list_flatten(column)
    if values.null_count or not pa.types.is_integer(values.type):
        raise DataError(f"pack: token-level labels must be non-null integers, but are {column.type} instead.")
    return values.to_numpy(zero_copy_only=False).astype(np.int64)


def kept_values(chunk: TokenChunk, keep: Sequence[str]) -> list[list[Any]]:
    """The values of each column in ``keep``, as Python lists (``DataError`` if one is missing or not ids).

    Example:
        >>> kept_values(TokenChunk.from_lists([[5], [6]], {"idx": [3, 4]}), ("idx",))
        [[3, 4]]
    """
    out = []
    for name in keep:
        column = chunk.columns.get(name)
        if column is None:
            raise DataError(
                f"pack: column {name!r} named in `keep` is not in the data; expected one of the columns "
                f"{sorted(chunk.columns)!r}."
            )
        kind = column.type
        if not (pa.types.is_integer(kind) or pa.types.is_string(kind) or pa.types.is_large_string(kind)):
            raise DataError(
                f"pack: column {name!r} named in `keep` has type {kind}; expected integers or strings (row ids)."
            )
        out.append(column.to_pylist())
    return out


def token_problem(
    ids: np.ndarray, labels: np.ndarray | None, *, vocab_size: int | None, ignore: Sequence[int]
) -> tuple[int, str, str] | None:
    """The first id or label that no model takes, as ``(its index, what it must be, what it is)``, else ``None``.

    Ids are ``[0, vocab_size)`` (``>= 0`` where the vocabulary is not known); labels are such ids
    or one of ``ignore`` (the labels a loss leaves out). Whole-array reductions, no loop.

    Example:
        >>> token_problem(np.array([5, 2, 9]), np.array([-100, 2, 9]), vocab_size=8, ignore=(-100,))
        (2, 'ids from 0 to 7', 'id 9')
        >>> token_problem(np.array([5, 2]), np.array([-1, 2]), vocab_size=None, ignore=(-100,))
        (0, 'labels that are ids >= 0 or -100', 'label -1')
    """
    span = "ids >= 0" if vocab_size is None else f"ids from 0 to {vocab_size - 1}"
    high = np.iinfo(np.int64).max if vocab_size is None else vocab_size - 1
    if len(ids) and (int(ids.min()) < 0 or int(ids.max()) > high):
        at = int(np.argmax((ids < 0) | (ids > high)))
        return at, span, f"id {int(ids[at])}"
    if labels is not None and len(labels) and (int(labels.min()) < 0 or int(labels.max()) > high):
        bad = ((labels < 0) | (labels > high)) & ~np.isin(labels, ignore)
        if bad.any():
            at, ignored = int(np.argmax(bad)), " or ".join(map(str, sorted(set(ignore))))
            return at, f"labels that are {span} or {ignored}", f"label {int(labels[at])}"
    return None


def cut_pieces(
    chunk: TokenChunk,
    *,
    seq_len: int,
    long_docs: str | None,
    keep_tail: bool,
    keep: Sequence[str] = (),
    vocab_size: int | None = None,
    ignore: Sequence[int] = (IGNORE,),
) -> tuple[list[Piece], dict[str, int]]:
    """The pieces a packer places for the documents of ``chunk``, in order, with their counts.

    A document of at most ``seq_len`` tokens is one piece; a longer one is handled by ``long_docs``.
    Token-level labels are cut with their ids; empty documents are dropped. A split document's
    pieces overlap by one token: each after the first starts with the token before the cut, as
    context (the packer gives a piece's first token no label), so every token but the document's
    first is a target exactly once, at one token more per cut.

    Args:
        chunk: Tokenized documents, one per row.
        seq_len: Tokens per packed row.
        long_docs: ``"split"`` into pieces of ``seq_len`` tokens and a tail, ``"truncate"`` to the
            first ``seq_len``, ``"drop"``, or ``"raise"`` a :class:`~padpipe.errors.DataError` naming it.
            ``None``: ``"raise"`` for a chunk with token-level labels, else ``"split"``.
        keep_tail: With ``"split"``, keep the last piece shorter than ``seq_len``.
        keep: Columns whose values each piece carries (its document's).
        vocab_size: Every id is below it (``None``: not known, every id ``>= 0``).
        ignore: Labels a loss leaves out; every other label is an id.

    Returns:
        ``(pieces, counts)``: the pieces and how many documents were ``"split"``, ``"truncated"``,
        ``"dropped"`` (too long), ``"tails_dropped"`` and ``"empty"``, and the ``"context"``
        tokens repeated at the start of a split document's later pieces (one per cut).

    Example:
        >>> pieces, counts = cut_pieces(TokenChunk.from_lists([[1, 2, 3, 4, 5, 6], [7]]), seq_len=3,
        ...                             long_docs=None, keep_tail=True)
        >>> [p.ids.tolist() for p in pieces], counts["split"], counts["context"]
        ([[1, 2, 3], [3, 4, 5], [5, 6], [7]], 1, 2)
    """
    labels = token_labels(chunk)
    values = kept_values(chunk, keep)
    problem = token_problem(chunk.ids, labels, vocab_size=vocab_size, ignore=ignore)
    if problem is not None:
        at, expected, found = problem
        row = int(np.searchsorted(chunk.offsets, at, side="right")) - 1
        raise DataError(f"pack: {_where(chunk, row)} has {found}; expected {expected}.")
    policy = long_docs or ("raise" if labels is not None else "split")
    lengths = chunk.lengths
    long = lengths > seq_len
    if policy == "raise" and long.any():
        raise _long_row_error(chunk, long, seq_len, labelled=labels is not None, explicit=long_docs == "raise")
    counts = {"split": 0, "truncated": 0, "dropped": 0, "tails_dropped": 0, "empty": int((lengths == 0).sum())}
    counts["context"] = 0
    pieces = (lengths > 0).astype(np.int64)
    step = seq_len - 1  # new tokens per piece after a document's first: the rest is the cut token, again
    if policy == "split":
        tails = long & ((lengths - 1) % step > 0)
        pieces[long] = (lengths[long] - 1) // step + (tails[long] if keep_tail else 0)
        counts["split"] = int(long.sum())
        counts["tails_dropped"] = 0 if keep_tail else int(tails.sum())
        counts["context"] = int(pieces[long].sum() - long.sum())
    elif policy == "truncate":
        counts["truncated"] = int(long.sum())
    elif policy == "drop":
        pieces[long] = 0
        counts["dropped"] = int(long.sum())
    doc = np.repeat(np.arange(len(lengths), dtype=np.int64), pieces)
    part = np.arange(len(doc), dtype=np.int64) - np.repeat(exclusive_cumsum(pieces)[:-1], pieces)
    starts = chunk.offsets[:-1][doc] + part * step
    sizes = np.minimum(seq_len, lengths[doc] - part * step)
    offsets = exclusive_cumsum(sizes)
    index = np.arange(int(offsets[-1]), dtype=np.int64) + np.repeat(starts - offsets[:-1], sizes)
    ids = chunk.ids[index]
    cut = None if labels is None else labels[index]
    rows = [tuple(column[d] for column in values) for d in doc.tolist()] if keep else [()] * len(doc)
    bounds = offsets.tolist()
    out = [Piece(ids[a:b], None if cut is None else cut[a:b], row) for a, b, row in zip(bounds, bounds[1:], rows)]
    return out, counts


def _long_row_error(chunk: TokenChunk, long: np.ndarray, seq_len: int, *, labelled: bool, explicit: bool) -> DataError:
    row = int(np.flatnonzero(long)[0])
    tokens = int(chunk.lengths[row])
    what = f"{tokens} tokens with token-level labels" if labelled else f"{tokens} tokens"
    why = (
        "long_docs='raise'"
        if explicit
        else "a row with token-level labels is not split across packed rows unless asked"
    )
    more = int(long.sum()) - 1
    return DataError(
        f"pack: {_where(chunk, row)} has {what}; expected at most seq_len={seq_len} ({why})"
        + (f"; {more} more row(s) of this chunk are longer" if more else "")
        + f". Keep the first {seq_len} tokens of each row with max_length={seq_len} on .tokens() or .chat() "
        "(or .tokenize()), or pass long_docs='split', 'truncate' or 'drop' to pack()."
    )


def pieces_to_chunk(pieces: Sequence[Piece], keep: Sequence[str] = ()) -> TokenChunk:
    """The pieces as one compact chunk (for state dicts): ids, ``labels`` when any piece has them, kept columns.

    Example:
        >>> chunk = pieces_to_chunk([Piece(np.array([1, 2], np.int32), None, (7,)), Piece(np.array([3], np.int32), None, (8,))], ("idx",))
        >>> chunk.offsets.tolist(), chunk.columns["idx"].to_pylist()
        ([0, 2, 3], [7, 8])
    """  # noqa: E501
    if not pieces:
        return TokenChunk.empty()
    lengths = np.fromiter((len(p.ids) for p in pieces), dtype=np.int64, count=len(pieces))
    offsets = exclusive_cumsum(lengths)
    columns: dict[str, pa.Array] = {}
    if any(p.labels is not None for p in pieces):
        labels = np.concatenate([p.ids if p.labels is None else p.labels for p in pieces]).astype(np.int64)
        columns[LABELS] = pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(labels))
    for j, name in enumerate(keep):
        columns[name] = pa.array([p.values[j] for p in pieces])
    return TokenChunk(np.concatenate([p.ids for p in pieces]), offsets, None, columns)
