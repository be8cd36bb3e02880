"""Who drives a loader or iterates a pipeline: a registry the framework adapters fill, so the core knows no framework.

Two hooks, each a list the adapters fill (none imports its framework; each answers only while its
framework, already imported, is the caller). The adapters are found as plugins are: on the first
question, the package named by :data:`ADAPTERS` is imported by name, and registers them; the core's
code imports nothing of it.

- :func:`loader_driver`: asked by :class:`~padpipe.loader.PipelineLoader` at ``iter``, ``state_dict``
  and ``load_state_dict``. A finder returns a :class:`Driver` when its framework drives the loader
  (Lightning's fit loop: :mod:`padpipe.integrations.lightning_fit`), which then runs the call.
- :func:`check_iteration`: asked by ``Pipeline.__iter__``. A check raises or warns when a wrapper
  reading the pipeline would lose, repeat or stack rows (:mod:`padpipe.integrations.guard`).

An adapter that sees its framework calling in a way it does not recognise raises, naming itself:
it never answers "not driving" in its place, so no guarantee weakens in silence.

Example:
    >>> loader_driver(object()) is None  # no framework is driving it
    True
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from typing import Any, Protocol

ADAPTERS = "padpipe.integrations"
"""The package whose import registers the framework adapters (found by name, like a plugin entry point)."""


class Driver(Protocol):
    """What a framework's driver does in place of the loader's own ``iter``, ``state_dict`` and ``load_state_dict``."""

    def iterate(self) -> Iterator[Any]:
        """The epoch the framework runs next."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """The state the framework's checkpoint holds."""
        ...

    def load_state_dict(self, state: Any) -> None:
        """Restore from the framework's checkpoint."""
        ...


LoaderFinder = Callable[[Any], "Driver | None"]
PipelineCheck = Callable[[Any, bool], None]
_finders: list[LoaderFinder] = []
_checks: list[PipelineCheck] = []


def register_loader_driver(find: LoaderFinder) -> None:
    """Add ``find(loader)``: a :class:`Driver` when its framework drives ``loader`` now, else ``None``."""
    if find not in _finders:
        _finders.append(find)


def register_pipeline_check(check: PipelineCheck) -> None:
    """Add ``check(pipeline, batches)``, run each time a pipeline is iterated (``batches``: it yields tensors)."""
    if check not in _checks:
        _checks.append(check)


def loader_driver(loader: Any) -> Driver | None:
    """The driver of ``loader`` when a framework drives the call in progress, else ``None``."""
    _discover()
    for find in _finders:
        driver = find(loader)
        if driver is not None:
            return driver
    return None


def check_iteration(pipeline: Any, *, batches: bool) -> None:
    """Run every registered check on ``pipeline``, about to be iterated."""
    _discover()
    for check in _checks:
        check(pipeline, batches)


_found: list[bool] = []


def _discover() -> None:
    """Import :data:`ADAPTERS` once (it registers the adapters)."""
    if not _found:
        _found.append(True)
        importlib.import_module(ADAPTERS)
