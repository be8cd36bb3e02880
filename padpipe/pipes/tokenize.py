"""The tokenize stage's settings, checked when ``.tokenize()`` is called; its work is
:class:`~padpipe.tokenizer.rows.ChunkTokenizer` (shared with the token cache)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from padpipe.errors import check_bool, one_of, positive
from padpipe.tokenizer import TextEncoder
from padpipe.tokenizer.rows import no_eos


def tokenize_options(
    tokenizer: Any,
    *,
    fields: str | Sequence[str],
    max_length: int | None,
    truncation: bool,
    add_special_tokens: bool,
    num_threads: int,
    on_error: str,
    append_eos: bool,
) -> dict[str, Any]:
    """Check the tokenize stage's settings, load the encoder, and return the stage's options.

    Cheap checks come first, so a bad argument fails before any tokenizer is loaded.

    Example:
        >>> opts = tokenize_options(pp.examples.tokenizer(), fields="text", max_length=None, truncation=True,
        ...                         add_special_tokens=True, num_threads=2, on_error="raise", append_eos=False)
        >>> opts["fields"], opts["encoder"].pad_id
        (('text',), 0)
    """
    fields = (fields,) if isinstance(fields, str) else tuple(fields)
    if len(fields) not in (1, 2) or not all(isinstance(f, str) for f in fields):
        raise ValueError(f"`fields` must be one column name or two for pairs, but is {fields!r} instead.")
    positive("max_length", max_length, allow_none=True)
    positive("num_threads", num_threads)
    one_of("on_error", on_error, ("raise", "skip"))
    check_bool("append_eos", append_eos)
    encoder = TextEncoder.load(
        tokenizer, max_length=max_length, truncation=truncation, add_special_tokens=add_special_tokens
    )
    if append_eos and encoder.eos_id is None:
        raise ValueError(no_eos(encoder))
    return dict(encoder=encoder, fields=fields, num_threads=num_threads, on_error=on_error, append_eos=append_eos)
