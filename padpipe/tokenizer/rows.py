"""The tokenize stage's core, shared by ``pipes/`` and ``token_cache/``: a record batch of text in, a token chunk out.

:class:`ChunkTokenizer` keeps no state between calls; the token cache reads and checks text with the same helpers,
so a cached row is exactly what tokenizing would give.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from padpipe.chunks import TokenChunk
from padpipe.errors import DataError, one_of
from padpipe.readers.schema import row_of, source_of
from padpipe.stats import PipelineStats
from padpipe.tokenizer.encoder import EOS_TOKENS, TextEncoder

ROW_ID_COLUMNS = ("idx", "id")
"""Columns whose value names a bad row in error messages, first found wins."""
LABEL, LABELS = "label", "labels"


def no_eos(encoder: TextEncoder) -> str:
    """The error for ``append_eos=True`` with a tokenizer without EOS: its special tokens, and how to set one.

    Example:
        >>> enc = TextEncoder.load(pp.examples.tokenizer(), max_length=None, truncation=True, add_special_tokens=True)
        >>> print(no_eos(enc))  # doctest: +ELLIPSIS
        `append_eos=True` needs ... has none; set one of its special tokens ['[PAD]', ..., '[MASK]'] as EOS: ...
    """
    specials = encoder.special_tokens()
    example = next((t for t in specials if any(k in t.lower() for k in ("eos", "end", "sep", "/s"))), "...")
    shown = repr(example) if example != "..." else example
    eos = " or ".join(repr(t) for t in EOS_TOKENS)
    return (
        f"`append_eos=True` needs a tokenizer with an EOS token, but this one has none; set one of its special tokens "
        f"{specials!r} as EOS: AutoTokenizer.from_pretrained(path, eos_token={shown}) or tok.eos_token = {shown} "
        f"(transformers; a tokenizers.Tokenizer or tokenizer.json has one when it holds {eos})."
    )


class ChunkTokenizer:
    """Tokenize the text field(s) of a record batch; pass the other columns through.

    A ``None``, non-string or invalid UTF-8 text (Arrow IPC files are not checked when read) raises a
    :class:`~padpipe.errors.DataError` naming the field, the row and its ``idx``/``id``, or is dropped and
    counted as ``tokenize.bad_text`` (``on_error="skip"``). The other columns pass through as Arrow arrays,
    ``label`` as ``labels`` (what ``transformers`` models take) unless the batch has ``labels`` too.

    Args:
        encoder: The :class:`~padpipe.tokenizer.TextEncoder` to call.
        fields: One text column, or two for sentence pairs.
        on_error: ``"raise"`` or ``"skip"`` rows with ``None``/non-string text.
        append_eos: Append the tokenizer's EOS id to every row, after truncation (so a row may
            be ``max_length + 1`` long); ``ValueError`` if the tokenizer has no EOS.
        stats: Counters to report into (``tokenize`` time, ``tokenize.rows``, skips); default: new.

    Example:
        >>> import pyarrow as pa
        >>> from padpipe.tokenizer.rows import ChunkTokenizer
        >>> from padpipe.tokenizer import TextEncoder
        >>> enc = TextEncoder.load(pp.examples.tokenizer(), max_length=None, truncation=True,
        ...                        add_special_tokens=True)
        >>> fn = ChunkTokenizer(enc, fields=("text",))
        >>> chunk = fn(pa.RecordBatch.from_pylist([{"text": "hello world", "label": 1}]))
        >>> chunk.lengths.tolist(), list(chunk.columns), chunk.columns["labels"].to_pylist()
        ([4], ['labels'], [1])
    """

    def __init__(
        self,
        encoder: TextEncoder,
        *,
        fields: Sequence[str] = ("text",),
        on_error: str = "raise",
        append_eos: bool = False,
        stats: PipelineStats | None = None,
    ) -> None:
        if not isinstance(encoder, TextEncoder):
            raise TypeError(f"`encoder` must be a TextEncoder, but is {type(encoder).__name__} instead.")
        fields = (fields,) if isinstance(fields, str) else tuple(fields)
        if len(fields) not in (1, 2) or not all(isinstance(f, str) for f in fields):
            raise ValueError(f"`fields` must be one column name or two for pairs, but is {fields!r} instead.")
        one_of("on_error", on_error, ("raise", "skip"))
        self.encoder, self.fields, self.on_error = encoder, fields, on_error
        if append_eos and encoder.eos_id is None:
            raise ValueError(no_eos(encoder))
        self.eos_id = encoder.eos_id if append_eos else None
        self.stats = stats if stats is not None else PipelineStats()

    def __call__(self, batch: pa.RecordBatch) -> TokenChunk:
        """Tokenize one record batch (thread-safe: no state is kept between calls)."""
        with self.stats.timer("tokenize"):
            if not isinstance(batch, pa.RecordBatch):
                raise TypeError(f"tokenize expects a pyarrow.RecordBatch, but got {type(batch).__name__} instead.")
            missing = [f for f in self.fields if f not in batch.schema.names]
            if missing:
                raise DataError(
                    f"tokenize: text field {missing[0]!r} is not in the data{row_origin(batch)}; "
                    f"expected one of the columns {batch.schema.names!r}."
                )
            texts = [as_text_column(batch.column(f)) for f in self.fields]
            bad = bad_rows(batch, texts)
            if bad is not None:
                if self.on_error == "raise":
                    raise DataError(_bad_text_message(batch, self.fields, texts, bad))
                keep = pa.array(~bad)
                batch = batch.filter(keep)
                texts = [t.filter(keep) for t in texts]
                self.stats.record_skip("tokenize.bad_text", int(bad.sum()))
            pairs = texts[1].to_pylist() if len(texts) == 2 else None
            chunk = self.encoder.encode(texts[0].to_pylist(), pairs)
            if self.eos_id is not None:
                chunk = append_token(chunk, self.eos_id)
            columns = pass_through(batch, self.fields)
            self.stats.add("tokenize.rows", chunk.num_rows)
            self.stats.add("tokenize.tokens", chunk.num_tokens)
            return TokenChunk(chunk.ids, chunk.offsets, chunk.type_ids, columns)

    def __repr__(self) -> str:
        return f"ChunkTokenizer({self.encoder!r}, fields={self.fields!r}, on_error={self.on_error!r})"


def as_text_column(column: pa.Array) -> pa.Array:
    """Decode dictionary-encoded strings; other types are left for :func:`bad_rows` to judge."""
    if pa.types.is_dictionary(column.type) and _is_text(column.type.value_type):
        return column.dictionary_decode()
    return column


def _is_text(kind: pa.DataType) -> bool:
    return pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind)


def _bad_mask(column: pa.Array) -> np.ndarray:
    """``True`` for rows that are ``None`` or not valid UTF-8, or every row when the column is not text."""
    if _is_text(column.type):
        bad = pc.is_null(column).to_numpy(zero_copy_only=False)
        if not _valid_utf8(column):  # Arrow IPC files are not checked when read: place the bad rows (error path)
            raw = column.cast(pa.large_binary()).to_pylist()  # valid UTF-8 round-trips, a replaced byte does not
            bad |= np.array([v is not None and v.decode("utf-8", "replace").encode() != v for v in raw], dtype=bool)
        return bad
    return np.ones(len(column), dtype=bool)


def _valid_utf8(column: pa.Array) -> bool:
    """Whether every string of ``column`` is valid UTF-8 (vectorized)."""
    try:
        column.validate(full=True)
    except pa.ArrowInvalid:
        return False
    return True


def bad_rows(batch: pa.RecordBatch, texts: list[pa.Array]) -> np.ndarray | None:
    """A boolean mask of rows with a bad text in any field, or ``None`` when all are good."""
    if all(_is_text(t.type) and t.null_count == 0 and _valid_utf8(t) for t in texts):
        return None
    bad = np.zeros(batch.num_rows, dtype=bool)
    for column in texts:
        bad |= _bad_mask(column)
    return bad if bad.any() else None


def _bad_text_message(batch: pa.RecordBatch, fields: tuple[str, ...], texts: list[pa.Array], bad: np.ndarray) -> str:
    row = int(np.flatnonzero(bad)[0])
    field, column = next((f, t) for f, t in zip(fields, texts) if _bad_mask(t)[row])
    if not _is_text(column.type) or column.null_count == len(column):  # every row, for one reason: no skip
        return _bad_column_message(batch, field, column)
    found = "None" if not column[row].is_valid else "not valid UTF-8"
    return (
        f"tokenize: field {field!r} at {row_place(batch, row)} is {found}; expected a string. "
        f"{int(bad.sum())} row(s) of this chunk have bad text; pass on_error='skip' to drop them."
    )


def row_place(batch: pa.RecordBatch, row: int) -> str:
    """Where row ``row`` of a batch is, for an error: its file's row, as the readers' errors name it, else its row
    in the chunk; with its ``idx``/``id``.

    Example:
        >>> row_place(pa.RecordBatch.from_pylist([{"id": 1}, {"id": 7}]), 1)
        'row 1 of the chunk (id=7)'
    """
    name = next((c for c in ROW_ID_COLUMNS if c in batch.schema.names), None)
    row_id = f"{name}={batch.column(name)[row].as_py()!r}" if name else ""
    in_file = row_of(batch, row)
    if in_file:
        return f"{in_file} ({row_id + '; ' if row_id else ''}row {row} of the chunk)"
    return f"row {row} of the chunk" + (f" ({row_id})" if row_id else "") + row_origin(batch)


def _bad_column_message(batch: pa.RecordBatch, field: str, column: pa.Array) -> str:
    """A text field that is no text in any row of the chunk: say what it holds and what to use instead."""
    head = f"tokenize: field {field!r}{row_origin(batch)}"
    if _holds_messages(column.type):
        return (
            f"{head} holds chat messages ({column.type}), not text; expected a string: apply the chat template "
            f"with .chat(tokenizer, messages={field!r}) instead of .tokenize(...)."
        )
    columns = f"the chunk's columns are {batch.schema.names!r}"
    if pa.types.is_null(column.type) or column.null_count == len(column):
        first = row_of(batch, 0)
        return (
            f"{head} is None in all {len(column)} rows of this chunk{f' (from {first} on)' if first else ''}; "
            f"expected a string: name the text field(s) to tokenize ({columns})."
        )
    return (
        f"{head} is of type {column.type} in every row, not text; expected a string: name the text field(s) to "
        f"tokenize ({columns})."
    )


def _holds_messages(kind: pa.DataType) -> bool:
    """Whether ``kind`` is a list of structs with a ``content`` or ``role`` field (chat messages)."""
    if not (pa.types.is_list(kind) or pa.types.is_large_list(kind)) or not pa.types.is_struct(kind.value_type):
        return False
    return bool({"role", "content"} & {f.name for f in kind.value_type})


def row_origin(batch: pa.RecordBatch) -> str:
    """`` from <file>`` when the reader tagged the batch with its file (not after shuffle or mix)."""
    source = source_of(batch)
    return f" from {source}" if source else ""


def pass_through(batch: pa.RecordBatch, fields: tuple[str, ...]) -> dict[str, pa.Array]:
    """The non-text columns, ``label`` renamed to ``labels`` unless ``labels`` already exists."""
    names = batch.schema.names
    rename = LABEL in names and LABELS not in names
    return {
        (LABELS if rename and name == LABEL else name): batch.column(i)
        for i, name in enumerate(names)
        if name not in fields
    }


def append_token(chunk: TokenChunk, token: int) -> TokenChunk:
    """Append ``token`` to the end of every row (vectorized); its type id is the row's last one.

    Example:
        >>> append_token(TokenChunk.from_lists([[5, 6], [], [7]]), 9).offsets.tolist()
        [0, 3, 4, 6]
    """
    ends = chunk.offsets[1:]
    ids = np.insert(chunk.ids, ends, np.asarray(token, dtype=chunk.ids.dtype))
    offsets = chunk.offsets + np.arange(chunk.num_rows + 1, dtype=np.int64)
    type_ids = None
    if chunk.type_ids is not None:
        last = np.zeros(chunk.num_rows, dtype=chunk.type_ids.dtype)
        nonempty = chunk.lengths > 0
        last[nonempty] = chunk.type_ids[ends[nonempty] - 1]
        type_ids = np.insert(chunk.type_ids, ends, last)
    return TokenChunk(ids, offsets, type_ids, chunk.columns)
