"""What a rewrite cannot keep: a digest of a file's bytes, read once per file when it is listed.

Size and mtime survive ``cp -p`` and ``rsync -t``, so where the store gives no version that changes with the
content (ETag, GCS generation, S3 version id), a file's identity holds this digest of its size and its whole
bytes (up to :data:`FULL_BYTES`), or its first and last :data:`EDGE_BYTES` and its Parquet footer; what it
cannot see is in docs/cache.md ("Keyed so it is never stale").
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

FULL_BYTES = 1 << 20
EDGE_BYTES = 64 << 10
PARQUET_MAGIC = b"PAR1"
STRONG_VERSION_KEYS = ("ETag", "etag", "generation", "VersionId", "version_id")
"""fsspec ``info`` keys whose value changes whenever the content does."""


def strong_version(info: dict[str, Any] | None) -> bool:
    """Whether a listing's ``info`` holds a version that changes with the content (so no digest is needed).

    Example:
        >>> strong_version({"ETag": '"9b2c"'}), strong_version({"mtime": 1.5})
        (True, False)
    """
    return info is not None and any(info.get(key) is not None for key in STRONG_VERSION_KEYS)


def content_digest(read: Callable[[int, int], bytes], size: int) -> str:
    """A digest of a file's size, head and tail (see the module docs); ``read(start, end)`` reads bytes.

    Example:
        >>> data = b"x" * 10
        >>> content_digest(lambda a, b: data[a:b], 10) == content_digest(lambda a, b: b"y" * (b - a), 10)
        False
    """
    digest = hashlib.sha256(str(size).encode())
    if size <= FULL_BYTES:
        digest.update(read(0, size))
        return digest.hexdigest()[:16]
    digest.update(read(0, EDGE_BYTES))
    tail = read(size - EDGE_BYTES, size)
    if tail[-4:] == PARQUET_MAGIC:
        footer = int.from_bytes(tail[-8:-4], "little") + 8
        if EDGE_BYTES < footer <= size:
            tail = read(size - footer, size)
    digest.update(tail)
    return digest.hexdigest()[:16]
