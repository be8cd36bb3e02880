"""The token cache: tokenize once, read ids on every later epoch and run (``tokenize(..., cache=...)``; docs/cache.md).

A recipe with a cache holds it (``Pipeline.cache``, :func:`tokenize_plan`). Command line: ``padpipe cache info
PATH`` prints the size; ``padpipe cache clear PATH`` deletes it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import fsspec.core

from padpipe.errors import one_of
from padpipe.readers.source import UnitSource
from padpipe.token_cache.plan import CachePlan
from padpipe.token_cache.store import ABOUT, FORMAT, CacheError, Store
from padpipe.tokenizer.serialized import tokenizer_json

__all__ = ["CacheError", "CacheInfo", "TokenCache", "clear", "info"]


@dataclass(frozen=True)
class TokenCache:
    """Where a pipeline keeps its tokens, and what to do when it cannot write there.

    Pass it (or just the path) as ``tokenize(..., cache=...)``. Many loaders, DataLoader workers and
    ranks may fill one cache at once: a file is published whole under a name that holds its size
    and checksum, and two writers of the same rows write the same file.

    Args:
        path: A local folder or an fsspec URL (``s3://bucket/cache``, ``memory://cache``).
        storage_options: Keyword arguments for the fsspec filesystem (credentials, endpoint).
        on_write_error: An unwritable or full location: ``"raise"`` a :class:`CacheError` naming
            it, or ``"skip"``: go on without writing, counted as ``cache.write_errors``.

    Example:
        >>> import padpipe as pp, tempfile
        >>> cache = pp.TokenCache(tempfile.mkdtemp())
        >>> pipe = (pp.read_parquet(pp.examples.SAMPLE_PARQUET).tokenize(pp.examples.tokenizer(),
        ...           fields=("sentence1", "sentence2"), cache=cache).batch(512).pad())
        >>> first = [b["input_ids"] for b in pipe.loader()]   # tokenizes, and fills the cache
        >>> loader = pipe.loader(); again = [b["input_ids"] for b in loader]   # reads the cache
        >>> all(a.equal(b) for a, b in zip(first, again)), loader.stats().counters["cache.hit_rows"]
        (True, 20000)
    """

    path: str
    storage_options: dict[str, Any] | None = None
    on_write_error: str = "raise"

    def __post_init__(self) -> None:
        if not isinstance(self.path, (str, os.PathLike)) or not os.fspath(self.path):
            raise TypeError(f"`path` must be a folder path or an fsspec URL, but is {self.path!r} instead.")
        object.__setattr__(self, "path", os.fspath(self.path))
        one_of("on_write_error", self.on_write_error, ("raise", "skip"))

    @staticmethod
    def of(cache: Any) -> TokenCache:
        """``cache`` as a :class:`TokenCache` (a path or URL becomes one with default options).

        Example:
            >>> TokenCache.of("memory://tokens").path
            'memory://tokens'
        """
        if isinstance(cache, TokenCache):
            return cache
        if isinstance(cache, (str, os.PathLike)):
            return TokenCache(os.fspath(cache))
        raise TypeError(f"`cache` must be a path, an fsspec URL or a padpipe.TokenCache, but is {cache!r} instead.")


def check_recipe(source: Any, stages: Sequence[Any], stage: str) -> None:
    """Raise ``ValueError`` unless a cache can sit on this recipe's next stage, ``stage``: the cache keys rows by
    the reader's work units, and the rows must reach ``stage`` unchanged."""
    reader = source.options.get("reader")
    if not (isinstance(reader, type) and issubclass(reader, UnitSource)):
        raise ValueError(
            "`cache` needs a reader with work units (read_parquet, read_arrow, read_jsonl, read_csv or from_hf of a "
            f"datasets.Dataset), but this pipeline starts with {source.name}() instead."
        )
    other = [s.name for s in stages if s.name != "shuffle"]
    if other:
        raise ValueError(
            f"`cache` needs {stage}() right after the reader (and shuffle()), but .{other[0]}() comes before it."
        )


def tokenize_plan(cache: Any, options: dict[str, Any]) -> CachePlan:
    """The recipe's cache of a ``tokenize`` stage with ``options``: keyed by what decides the ids (the tokenizer's
    JSON as a digest, its settings, the tokenize options); a row holds at most ``max_length`` tokens (and the EOS
    appended), where the Rust tokenizer truncates at all: not below the special tokens it adds."""
    import tokenizers

    cache, encoder, eos = TokenCache.of(cache), options["encoder"], options["append_eos"]
    added = encoder.special_tokens_added() if encoder.add_special_tokens else 0
    bounded = encoder.max_length is not None and encoder.max_length >= added
    about = {
        "format": FORMAT,
        "tokenizer": encoder.fingerprint(),  # vocabulary size and a digest of its JSON
        "tokenizers": tokenizers.__version__,
        "max_length": encoder.max_length,
        "truncation_side": encoder.truncation_side,
        "add_special_tokens": encoder.add_special_tokens,
        "encode_special_tokens": encoder.encode_special_tokens,
        "type_ids": encoder.returns_token_type_ids,
        "fields": list(options["fields"]),
        "on_error": options["on_error"],
        "append_eos": eos,
        "eos_id": encoder.eos_id if eos else None,
    }
    return CachePlan(
        Store(cache.path, cache.storage_options),
        cache.on_write_error,
        about,
        vocab_size=encoder.vocab_size,
        max_length=encoder.max_length + eos if bounded else None,
        fields=options["fields"],
        type_ids=encoder.returns_token_type_ids,
    )


def chat_plan(cache: Any, template: Any, settings: Any) -> CachePlan:
    """The recipe's cache of a ``chat`` stage: a segment row holds what a conversation became."""
    cache = TokenCache.of(cache)
    return CachePlan(
        Store(cache.path, cache.storage_options),
        cache.on_write_error,
        chat_fingerprint_of(template, settings),
        vocab_size=tokenizer_json(template.tokenizer.backend_tokenizer).id_bound,  # with the added tokens
        max_length=settings.max_length,
        fields=settings.consumed(),
        chat=True,
    )


def chat_fingerprint_of(template: Any, settings: Any) -> dict[str, Any]:
    """What decides a conversation's token rows, labels and counters: the tokenizer (a digest of its JSON), the
    template and its special tokens, every chat option (``on_error`` too: it decides what is skipped) and the
    libraries that render and tokenize."""
    import jinja2
    import tokenizers
    import transformers

    return {
        "format": FORMAT,
        "stage": "chat",
        "tokenizer": tokenizer_json(template.tokenizer.backend_tokenizer).fingerprint,  # read once per process
        "split_special_tokens": bool(getattr(template.tokenizer, "split_special_tokens", False)),
        "template": template.fingerprint(),
        "options": {**settings.settings(), "on_error": settings.on_error},
        "tokenizers": tokenizers.__version__,
        "transformers": transformers.__version__,
        "jinja2": jinja2.__version__,
    }


@dataclass(frozen=True)
class CacheInfo:
    """What a cache location holds.

    Attributes:
        path: The location.
        files: Segment files (and ``about.json`` files) in it.
        bytes: Their total size.
        fingerprints: Tokenizer + options fingerprints, each with its ``about.json`` (when readable).
    """

    path: str
    files: int
    bytes: int
    fingerprints: dict[str, dict[str, Any]]

    def __str__(self) -> str:
        lines = [
            f"{self.path}: {self.files} files, {size_text(self.bytes)}, {len(self.fingerprints)} tokenizer setting(s)"
        ]
        for name, about in sorted(self.fingerprints.items()):
            if about.get("stage") == "chat" and isinstance(about.get("options"), dict):
                options = about["options"]
                chat = ", ".join(f"{k}={options[k]}" for k in ("max_length", "train_on", "messages") if k in options)
                lines.append(f"  {name}: chat() {chat}")
                continue
            what = ", ".join(f"{k}={about[k]}" for k in ("max_length", "fields", "append_eos") if k in about)
            lines.append(f"  {name}: {what}")
        return "\n".join(lines)


def info(path: str, *, storage_options: dict[str, Any] | None = None) -> CacheInfo:
    """The size of the token cache at ``path`` (nothing there: zero files).

    Example:
        >>> import tempfile
        >>> info(tempfile.mkdtemp()).files
        0
    """
    fs, root = _root(path, storage_options)
    files, total, fingerprints = 0, 0, {}
    for name, detail in _files(fs, root).items():
        files, total = files + 1, total + int(detail.get("size") or 0)
        parts = name[len(root) :].strip("/").split("/")
        if len(parts) == 2 and parts[1] == ABOUT:
            try:
                fingerprints[parts[0]] = json.loads(fs.cat_file(name))
            except (OSError, ValueError):
                fingerprints[parts[0]] = {}
    return CacheInfo(path, files, total, fingerprints)


def clear(path: str, *, storage_options: dict[str, Any] | None = None) -> int:
    """Delete the token cache at ``path`` (only the files padpipe wrote); returns the bytes freed.

    Example:
        >>> import tempfile
        >>> clear(tempfile.mkdtemp())
        0
    """
    freed = info(path, storage_options=storage_options).bytes
    fs, root = _root(path, storage_options)
    if _files(fs, root):
        try:
            fs.rm(root, recursive=True)
        except OSError as exc:
            raise CacheError(f"token cache: cannot delete {path!r} ({type(exc).__name__}: {exc}).") from exc
    return freed


def _root(path: str, storage_options: dict[str, Any] | None) -> tuple[Any, str]:
    fs, base = fsspec.core.url_to_fs(os.fspath(path), **(storage_options or {}))
    return fs, f"{base.rstrip('/')}/{FORMAT}"


def _files(fs: Any, root: str) -> dict[str, dict[str, Any]]:
    """Every file under ``root`` with its details; none when it is not there (not ``fs.exists(root)``: fsspec
    2023.6 says a memory folder made by writing files into it does not exist)."""
    try:
        return fs.find(root, detail=True)
    except FileNotFoundError:
        return {}


def size_text(n: float) -> str:
    """Bytes as text: ``'12 B'``, ``'3.4 MiB'``."""
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n:.0f} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"
