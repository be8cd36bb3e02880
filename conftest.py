"""Shared pytest set-up: docstring examples run with ``pp`` (padpipe), ``np`` and ``datasets`` in scope."""

import numpy as np
import pytest

import padpipe as pp


@pytest.fixture(autouse=True)
def _doctest_names(doctest_namespace: dict) -> None:
    doctest_namespace["pp"] = pp
    doctest_namespace["np"] = np
    doctest_namespace["datasets"] = pytest.importorskip("datasets")
