"""Checks of who calls padpipe: a registry the framework adapters fill, so the core knows no framework.

A check only raises or warns, never changes what the call does: whether a wrapper reading the pipeline would
lose, repeat or stack rows (:mod:`padpipe.integrations.guard`), or a framework save or restore the loader in a way
that would not resume exactly (:mod:`padpipe.integrations.loader_guard`). The adapters are found as plugins are.

Example:
    >>> check_iteration(object(), batches=True)  # nobody is wrapping it: nothing to say
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import Any

ADAPTERS = "padpipe.integrations"
"""The package whose import registers the framework adapters' checks (found by name, like a plugin entry point)."""

PipelineCheck = Callable[[Any, bool], None]
LoaderCheck = Callable[[Any, str, Any], None]
_checks: list[PipelineCheck] = []
_loader_checks: list[LoaderCheck] = []


def register_pipeline_check(check: PipelineCheck) -> None:
    """Add ``check(pipeline, batches)``, run each time a pipeline is iterated (``batches``: it yields tensors)."""
    if check not in _checks:
        _checks.append(check)


def register_loader_check(check: LoaderCheck) -> None:
    """Add ``check(loader, method, state)``, run when a loader's ``state_dict`` or ``load_state_dict`` is called, or
    an epoch's first batch is taken (``method`` ``"__next__"``, ``loader`` the epoch's iterator)."""
    if check not in _loader_checks:
        _loader_checks.append(check)


def check_iteration(pipeline: Any, *, batches: bool) -> None:
    """Run every registered check on ``pipeline``, about to be iterated."""
    _discover()
    for check in _checks:
        check(pipeline, batches)


def check_loader_call(loader: Any, method: str, state: Any) -> None:
    """Run every registered check on ``loader``, whose ``method`` is called (``state``: the one being loaded)."""
    _discover()
    for check in _loader_checks:
        check(loader, method, state)


@functools.cache
def _discover() -> None:
    """Import :data:`ADAPTERS` once (it registers the adapters)."""
    importlib.import_module(ADAPTERS)
