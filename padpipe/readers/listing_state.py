"""What a file reader's state keeps of its listing: digests and the file being read, never the file list.

A listing identity (a line a file) would grow a state with the corpus, so a state holds a :class:`ListingDigest`
of it under ``"files"`` and the line of the file being read under ``"file"``; :func:`listing_difference` says
how two differ, as far as the digests tell.

Example:
    >>> saved = ListingDigest.of("a\\t1\\tv1\\nb\\t2\\tv1")
    >>> listing_difference(saved, "b\\t2\\tv1", "b\\t2\\tv1\\na\\t1\\tv1")
    'the same 2 files in another order'
    >>> listing_difference(saved, "b\\t2\\tv1", "a\\t1\\tv1\\nb\\t3\\tv2")
    'the same file names, but a size, version or content changed; the file being read changed: b (2 -> 3 bytes)'
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from padpipe.state import Invalid, Spec

FILES_KEY = "files"
FILE_KEY = "file"
LINE_CHARS = 1 << 16  # the most a state's line of a file may hold: its name (a path or URL), size, version, digest
DIGEST_CHARS = 32  # 128 bits of SHA-256, hex


@dataclass(frozen=True)
class ListingDigest:
    """A listing's identity in constant size: its file count and digests of its lines, names and sorted lines.

    Attributes:
        count: Number of files.
        lines: Digest of the identity lines in order (the listing itself).
        names: Digest of the file names in order (tells a size/version/content change from a rename).
        unordered: Digest of the lines sorted (tells a reorder from other changes).
    """

    count: int
    lines: str
    names: str
    unordered: str

    @classmethod
    def of(cls, identity: str) -> ListingDigest:
        """The digest of a listing identity (lines ``name\\tsize\\tversion[\\tcontent]``); cached per identity.

        Example:
            >>> ListingDigest.of("a\\t1\\tv1").count
            1
        """
        return _digest(identity)

    def plain(self) -> dict[str, Any]:
        """As saved in a state."""
        return {"count": self.count, "lines": self.lines, "names": self.names, "unordered": self.unordered}


class DigestSpec(Spec):
    """A state's ``"files"`` value: a :meth:`ListingDigest.plain` dict; loads a :class:`ListingDigest`."""

    def load(self, value: Any) -> ListingDigest:
        expected = f"a dict of 'count' (an int >= 0) and 'lines', 'names', 'unordered' ({DIGEST_CHARS} hex digits)"
        if not isinstance(value, Mapping) or set(value) != {"count", "lines", "names", "unordered"}:
            raise Invalid(expected)
        count, digests = value["count"], [value[k] for k in ("lines", "names", "unordered")]
        if isinstance(count, bool) or not isinstance(count, int) or count < 0 or not all(map(_is_digest, digests)):
            raise Invalid(expected)
        return ListingDigest(count, *digests)


def line_of(identity: str, name: str) -> str:
    """The identity line of file ``name`` in ``identity`` (``""`` when it is not listed).

    Example:
        >>> line_of("a\\t1\\tv1\\nb\\t2\\tv1", "b")
        'b\\t2\\tv1'
    """
    return _lines_by_name(identity).get(name, "")


def listing_difference(saved: ListingDigest, saved_file: str, identity: str) -> str | None:
    """How listing ``identity`` differs from the ``saved`` one in words (``None``: the same).

    Args:
        saved: The state's listing digest.
        saved_file: The state's line of the file being read (``""``: none, at the end of an epoch).
        identity: This reader's listing identity.
    """
    now = ListingDigest.of(identity)
    if now == saved:
        return None
    if now.unordered == saved.unordered:
        return f"the same {_files(now.count)} in another order"
    if now.names == saved.names:
        words = f"the same file name{'s' if now.count > 1 else ''}, but a size, version or content changed"
    elif now.count != saved.count:
        words = f"{_files(saved.count)} when saved, {now.count} now: files were added or removed"
    else:
        words = f"{_files(now.count)} as when saved, but other names: files were renamed, or added and removed"
    if saved_file:
        name = saved_file.split("\t", 1)[0]
        line = line_of(identity, name)
        if not line:
            words += f"; the file being read, {name}, is no longer listed"
        elif line != saved_file:
            words += f"; the file being read changed: {name} ({_change(saved_file, line)})"
        else:
            words += f"; the file being read, {name}, is unchanged"
    return words


def _files(count: int) -> str:
    return f"{count} file" if count == 1 else f"{count} files"


def _change(before: str, after: str) -> str:
    """What changed between two identity lines of one file."""
    (size0, version0, content0), (size1, version1, content1) = (
        (line.split("\t") + ["", "", ""])[1:4] for line in (before, after)
    )
    if size0 != size1:
        return f"{size0} -> {size1} bytes"
    if version0 != version1:
        return f"version {version0} -> {version1}"
    return f"content {content0 or '?'} -> {content1 or '?'}, same size and version"


@lru_cache(maxsize=8)
def _digest(identity: str) -> ListingDigest:
    lines = identity.split("\n") if identity else []
    names = (line.split("\t", 1)[0] for line in lines)
    return ListingDigest(len(lines), _sha(lines), _sha(names), _sha(sorted(lines)))


@lru_cache(maxsize=8)
def _lines_by_name(identity: str) -> dict[str, str]:
    return {line.split("\t", 1)[0]: line for line in (identity.split("\n") if identity else [])}


def _sha(items: Iterable[str]) -> str:
    digest = hashlib.sha256()
    for item in items:
        digest.update(item.encode())
        digest.update(b"\n")
    return digest.hexdigest()[:DIGEST_CHARS]


def _is_digest(value: Any) -> bool:
    return isinstance(value, str) and len(value) == DIGEST_CHARS and all(c in "0123456789abcdef" for c in value)
