"""The public face loads lazily (``padpipe --help`` imports no torch) yet every documented name is there."""

from __future__ import annotations

import subprocess
import sys

import padpipe as pp


def test_every_public_name_and_documented_submodule_resolves_after_a_plain_import():
    code = (
        "import padpipe as pp; names = [getattr(pp, n) for n in pp.__all__]; "
        "print(pp.cache.clear.__name__, pp.examples.SAMPLE_PARQUET.endswith('sample.parquet'), callable(pp.mix))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["clear", "True", "True"]


def test_an_unknown_name_is_an_attribute_error():
    try:
        pp.no_such_name  # noqa: B018
    except AttributeError as exc:
        assert str(exc) == "module 'padpipe' has no attribute 'no_such_name'"
    else:
        raise AssertionError("pp.no_such_name resolved")
