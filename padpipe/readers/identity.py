"""The listing identity a file reader holds: what it listed, checked against the files and kept in its states
(the state keys and digests: :mod:`padpipe.readers.listing_state`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from padpipe.readers.listing_state import (
    FILE_KEY,
    FILES_KEY,
    LINE_CHARS,
    DigestSpec,
    ListingDigest,
    line_of,
    listing_difference,
)
from padpipe.readers.paths import ChangedFileError, FileRef
from padpipe.state import Loaded, Spec, StateMismatchError, Str, invalid
from padpipe.state_walk import show

Retried = Callable[..., Any]  # retried(what, fn, *args): fn(*args) with transient storage errors retried


class ListingIdentity:
    """The part of a file reader that knows what it listed, checks files against it, and keeps it in states.

    A state has the listing's :class:`ListingDigest` under ``"files"`` and the line of the file
    being read under ``"file"``; a state whose listing differs is refused, saying how. Before a file
    is read in an epoch, :meth:`check_unchanged` makes sure it is still the file that was listed.

    Args:
        stage: The reader's name in messages (``"ParquetReader"``).

    Example:
        >>> identity = ListingIdentity("ParquetReader"); identity.text = "a\\t1\\tv1\\nb\\t2\\tv1"
        >>> sorted(identity.values("b")), identity.values("b")[FILE_KEY]
        (['file', 'files'], 'b\\t2\\tv1')
    """

    FIELDS: dict[str, Spec] = {FILES_KEY: DigestSpec(), FILE_KEY: Str(max_length=LINE_CHARS)}

    def __init__(self, stage: str) -> None:
        self.stage = stage
        self.text = ""  # one line a file: name, size, version, content digest (FileRef.identity)
        self._checked: set[str] = set()  # files found unchanged since listing, this epoch
        self._verified: dict[str, tuple[int, ...]] = {}  # a local file's signature when it was last found unchanged

    def values(self, path: str | None) -> dict[str, Any]:
        """The state's keys at a position in file ``path`` (``None``: past the epoch's last unit)."""
        return {FILES_KEY: ListingDigest.of(self.text).plain(), FILE_KEY: self.line(path)}

    def line(self, path: str | None) -> str:
        """The listing's line of file ``path`` (``""`` for ``None`` or a file not listed)."""
        return "" if path is None else line_of(self.text, path)

    def check_listing(self, loaded: Loaded) -> None:
        """Raise ``StateMismatchError`` unless the state's listing digest is this listing's, saying how it differs."""
        difference = listing_difference(loaded[FILES_KEY], loaded[FILE_KEY], self.text)
        if difference is None:
            return
        raise StateMismatchError(
            f"{self.stage} state doesn't match this pipeline: its files changed since the state was saved "
            f"({difference}); resuming would read other rows. Resume with the files as they were, or start a new run."
        )

    def check_line(self, loaded: Loaded, unit: int, path: str | None) -> None:
        """Raise unless the state's file line is the listed line of ``path``, the file of its unit ``unit``."""
        current = self.line(path)
        if loaded[FILE_KEY] != current:
            raise invalid(self.stage, FILE_KEY, f"the file at unit {unit}, {current!r}", show(loaded[FILE_KEY], 300))

    # -- files against the listing ---------------------------------------------------------------
    def new_epoch(self) -> None:
        """Check each file again before it is next read."""
        self._checked = set()

    def check_unchanged(self, ref: FileRef | None, *, cached: bool, retried: Retried) -> None:
        """Once per file per epoch, before its first unit is read (from the file or the token cache): raise
        ``ChangedFileError`` (or ``FileNotFoundError``) unless ``ref`` is the file that was listed.

        A pipeline keeps its listing for its life, so a file rewritten between epochs (same size and
        mtime, as ``cp -p`` leaves it) would otherwise be read against the old listing, or served
        from the token cache with its old ids. The check is one small read per file (see
        :meth:`~padpipe.readers.paths.FileRef.check_unchanged`); a local file found unchanged is
        only ``stat``-ed in later epochs while its :meth:`~padpipe.readers.paths.FileRef.signature`
        (which a write changes, and restoring the mtime too) stays the same.

        Args:
            ref: The listed file (``None``: not a listed file, nothing to check).
            cached: Whether rows may come from the token cache instead of the file.
            retried: Calls a function with transient storage errors retried (the reader's).
        """
        if ref is None or ref.name in self._checked:
            return
        if not cached and ref.listed_content is None:
            return  # its ETag is checked whenever the file is opened, and without a cache it is opened to be read
        signature = ref.signature()
        if signature is None or self._verified.get(ref.name) != signature:
            retried(f"{ref.name}: read its first and last bytes", ref.check_unchanged)
            if signature is not None:
                self._verified[ref.name] = signature
        self._checked.add(ref.name)

    def check_resumed(self, refs: Iterable[FileRef | None], *, cached: bool, retried: Retried) -> None:
        """On resume: the files still to be read this epoch hold what they held when listed (else a mismatch).

        A fresh listing already has today's digests; this catches a rewrite (same size and mtime)
        after a listing this pipeline keeps in memory. Once per file per resume, never per batch; a
        file gone since listing is left to the reader's ``on_missing`` when it gets there.
        """
        for ref in refs:
            try:
                self.check_unchanged(ref, cached=cached, retried=retried)
            except FileNotFoundError:
                continue
            except ChangedFileError as exc:
                raise StateMismatchError(
                    f"{self.stage} state doesn't match this pipeline: {exc}; resuming would read other "
                    "rows. Resume with the files as they were, or start a new run."
                ) from exc
