"""Progress for the long passes people wait for (``padpipe inspect``, sorting an evaluation split), never in a
training loader's hot path: a ``tqdm`` bar on a terminal, elsewhere a line to the ``padpipe`` logger (INFO) every
:data:`LOG_EVERY_S` seconds and at the end. Off with ``PADPIPE_PROGRESS=0`` or ``enabled=False``.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import Any, TextIO

from torchdata.nodes import BaseNode

from padpipe.errors import check_bool
from padpipe.state import Child, StateSchema

ENV = "PADPIPE_PROGRESS"
LOG_EVERY_S = 10.0
logger = logging.getLogger("padpipe")


def progress_enabled(enabled: bool | None = None) -> bool:
    """``enabled`` when given, else whether ``PADPIPE_PROGRESS`` is unset or not ``0``/``false``/``off``/``no``.

    Example:
        >>> progress_enabled(False), progress_enabled(True)
        (False, True)
    """
    if enabled is not None:
        check_bool("progress", enabled)
        return enabled
    return os.environ.get(ENV, "1").strip().lower() not in ("0", "false", "off", "no")


class Progress:
    """Count work done towards an optional total, shown as a bar or as log lines.

    Args:
        desc: What is being done, e.g. ``"inspect: tokenizing"``.
        total: The rows at the end, when known.
        enabled: Show progress at all; ``None`` reads ``PADPIPE_PROGRESS``.
        stream: Where a bar goes (default: standard error); a bar only when it is a terminal.

    Example:
        >>> with Progress("sorting", total=3, enabled=False) as bar:
        ...     bar.update(2); bar.update(1)
        >>> bar.count
        3
    """

    def __init__(
        self,
        desc: str,
        *,
        total: int | None = None,
        enabled: bool | None = None,
        stream: TextIO | None = None,
    ) -> None:
        self.desc, self.total = desc, total
        self.count = 0
        self._on = progress_enabled(enabled)
        self._closed = False
        self._start = self._logged = time.monotonic()
        self._bar: Any = None
        stream = stream if stream is not None else sys.stderr
        if self._on and getattr(stream, "isatty", lambda: False)():
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=desc, unit=" rows", file=stream, leave=False, dynamic_ncols=True)

    def update(self, n: int) -> None:
        """Add ``n`` to the count."""
        self.count += n
        if self._bar is not None:
            self._bar.update(n)
        elif self._on and time.monotonic() - self._logged >= LOG_EVERY_S:
            self._logged = time.monotonic()
            logger.info("%s", self._line())

    def set_total(self, total: int | None) -> None:
        """Change the expected total (an estimate that became known or better)."""
        self.total = total
        if self._bar is not None:
            self._bar.total = total
            self._bar.refresh()

    def close(self) -> None:
        """End the bar, or log the final line; later calls do nothing."""
        if self._closed:
            return
        self._closed = True
        if self._bar is not None:
            self._bar.close()
        elif self._on:
            logger.info("%s, done", self._line())

    def _line(self) -> str:
        seconds = time.monotonic() - self._start
        if self.total:
            share = self.count / self.total
            return f"{self.desc}: {self.count:,} of {self.total:,} rows ({share:.0%}), {seconds:.1f} s"
        return f"{self.desc}: {self.count:,} rows, {seconds:.1f} s"

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ProgressNode(BaseNode[Any]):
    """Pass items through unchanged and count their rows (``num_rows``) on a :class:`Progress`, from a pass's
    first item until ``total`` rows went by or the pass ends.

    Args:
        source: Upstream node.
        desc: What the pass is, for the bar.
        total: Rows in the pass, when known.
        enabled: Show progress; ``None`` reads ``PADPIPE_PROGRESS``.

    Example:
        >>> from torchdata.nodes import IterableWrapper
        >>> import pyarrow as pa
        >>> node = ProgressNode(IterableWrapper([pa.record_batch({"a": [1, 2]})]), desc="reading", enabled=False)
        >>> [b.num_rows for b in node]
        [2]
    """

    STATE = StateSchema("progress", 1, source=Child())

    def __init__(self, source: BaseNode, *, desc: str, total: int | None = None, enabled: bool | None = None) -> None:
        super().__init__()
        progress_enabled(enabled)  # checked now
        self.source, self.desc, self.total, self.enabled = source, desc, total, enabled
        self._bar: Progress | None = None
        self._finished = False  # the bar of this pass has ended

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        super().reset(initial_state)
        self._end_bar()
        self._finished = False
        self.source.reset(None if initial_state is None else self.STATE.check(initial_state, {}).source)

    def next(self) -> Any:
        try:
            item = next(self.source)
        except StopIteration:
            self._end_bar()
            raise
        if self._finished:
            return item
        if self._bar is None:
            self._bar = Progress(self.desc, total=self.total, enabled=self.enabled)
        self._bar.update(getattr(item, "num_rows", 1))
        if self.total is not None and self._bar.count >= self.total:
            self._end_bar()
            self._finished = True
        return item

    def get_state(self) -> dict[str, Any]:
        return self.STATE.make({}, source=self.source.state_dict())

    def _end_bar(self) -> None:
        if self._bar is not None:
            self._bar.close()
        self._bar = None


def progress_stage(upstream: BaseNode, ctx: Any, *, desc: str, total: int | None, enabled: bool | None) -> BaseNode:
    """A :meth:`padpipe.Pipeline.add_stage` builder for :class:`ProgressNode`.

    Example:
        >>> pipe = pp.from_iterable([{"text": "a"}]).add_stage(
        ...     "progress", progress_stage, output="records", desc="reading", total=1, enabled=False)
        >>> next(iter(pipe.loader())).num_rows
        1
    """
    return ProgressNode(upstream, desc=desc, total=total, enabled=enabled)
