"""Shared pytest set-up: docstring examples run with ``pp`` (padpipe), ``np`` and ``datasets`` in scope,
and the ``slow`` marker on every test that starts processes, ``torchrun`` or a training framework.

``make test-fast`` (``pytest -m "not slow"``) leaves those out; ``make test`` (CI) runs everything.
A test is slow when its file is in ``SLOW_FILES`` (every test there starts processes or a framework),
when its body calls ``subprocess`` or ``torchrun`` or asks for ``num_workers=N`` (DataLoader worker
processes; a ``num_workers`` parameter above 0 too), or when it carries ``@pytest.mark.slow`` itself
(a test that starts processes through a helper, or one that alone runs for several seconds), as
do the docstring examples named in ``SLOW_DOCTESTS``.
"""

from __future__ import annotations

import os

# One intra-op thread in each pytest process and every process a test starts (before numpy or torch read it): the
# suite runs two pytest processes on two cores, where a second thread per process only spins (a tiny model's steps
# cost several times the CPU). torchrun gives its ranks one thread too. A test that sets a count keeps its own.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# Likewise the tokenizers' own thread pool: with two busy pytest processes its threads wait for a core and cost 6-8%
# more CPU for the same ids. padpipe's ``num_threads`` (its own threads) is unaffected.
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import atexit  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402

# The processes tests start keep their temporary files in a folder of this pytest process, removed when it exits:
# torchrun's agent makes a torchelastic_* folder per launch and leaves it (some 250 a run in the shared temp folder).
# This process keeps the shared one (``gettempdir`` reads TMPDIR once, here, before it changes), and with it pytest's
# own tmp_path folders, which it keeps for a look after a failure.
tempfile.gettempdir()
CHILD_TEMP_FOLDER = tempfile.mkdtemp(prefix="padpipe-tests-")
os.environ["TMPDIR"] = CHILD_TEMP_FOLDER
atexit.register(shutil.rmtree, CHILD_TEMP_FOLDER, True)

import gc  # noqa: E402
import importlib  # noqa: E402
import inspect  # noqa: E402
import re  # noqa: E402
from collections import Counter  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

import padpipe as pp  # noqa: E402

ROOT = Path(__file__).resolve().parent
SLOW_FILES = (
    "tests/test_distributed.py",  # torchrun ranks
    "tests/runtime/test_elastic.py",  # torchrun ranks, restarted at other world sizes
    "tests/test_docs.py",  # every README/docs block in a fresh interpreter
    "tests/test_resume_random.py",  # resumes in a fresh process
    "tests/integrations/",  # Accelerate, Lightning, the HF Trainer and the examples, most under torchrun
    "tests/benchmarks/",  # timing runs
    "tests/readers/test_s3_faults.py",  # a local S3 server behind a fault-injecting proxy
    "tests/readers/test_many_shards.py",  # a local S3 server with 4,000 shards
    "tests/inspection/test_packing_check.py",  # transformers models run on every document
    "tests/inspection/test_packing_labels.py",  # the same, on masked rows
    "tests/inspection/test_packing_command.py",  # the same, from the command line
    "tests/test_markers.py",  # pytest collections in fresh processes
    "tests/chat/test_adversarial_spans.py",  # 250 crafted conversations on 28 templates (test_published_templates
    # keeps every template in make test-fast)
    "padpipe/integrations/",  # docstring examples that import Lightning, transformers' Trainer, torchtitan
)
OPTIONAL_MODULES = {"padpipe/integrations/torchtitan.py": "torchtitan.components.dataloader"}
"""Modules whose docstring examples run only where an optional package imports (their tests skip on their own)."""
SLOW_DOCTESTS = (
    "padpipe.cache.TokenCache",
    "padpipe.recipes.glue.main",
    "padpipe.inspection.inspect",
)  # examples that take seconds alone
STARTS_PROCESSES = re.compile(r"\bsubprocess\.|\btorchrun\b|\bnum_workers=[1-9]")


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Leave out the docstring examples of a module in :data:`OPTIONAL_MODULES` whose package does not import, and
    under ``-m "not slow"`` (``make test-fast``) the files of :data:`SLOW_FILES`: not importing them (Lightning,
    torchtitan, TRL, a local S3 server) saves each pytest process seconds."""
    path = collection_path.resolve()
    if config.getoption("markexpr") == "not slow" and path.is_relative_to(ROOT):
        where = path.relative_to(ROOT).as_posix() + ("/" if path.is_dir() else "")
        if where.startswith(SLOW_FILES):
            return True
    needs = OPTIONAL_MODULES.get(path.relative_to(ROOT).as_posix()) if path.is_relative_to(ROOT) else None
    if needs is None:
        return None
    try:
        importlib.import_module(needs)
    except ImportError:
        return True
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Add the ``slow`` marker to the tests that start processes, ``torchrun`` or a framework, and put the files
    with the most such tests first: ``--dist loadfile`` hands files out in this order, so the long ones start early
    and the many short ones fill in at the end (with the docs' page run, one long file, collected late, one
    process worked alone for its last minutes)."""
    slow_in_file: Counter[Path] = Counter()
    for item in items:
        if _is_slow(item):
            item.add_marker(pytest.mark.slow)
            slow_in_file[item.path] += 1
    items.sort(key=lambda item: -slow_in_file[item.path])  # stable: each file's tests keep their order


def pytest_collection_finish(session: pytest.Session) -> None:
    """Freeze what collection made (the test modules, and Lightning, transformers and torch they import): a full
    garbage collection then skips those ~580,000 objects, which live to the end anyway (each took ~0.3 s, some 15
    times a pytest process); what the tests make is collected as before."""
    gc.collect()
    gc.freeze()


def _is_slow(item: pytest.Item) -> bool:
    path = Path(str(item.path)).resolve()
    where = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else path.as_posix()
    if where.startswith(SLOW_FILES):
        return True
    callspec = getattr(item, "callspec", None)
    if callspec is not None and (callspec.params.get("num_workers") or 0) > 0:  # DataLoader worker processes
        return True
    function = getattr(item, "function", None)
    if function is None:  # a docstring example
        return item.name in SLOW_DOCTESTS
    try:
        source = inspect.getsource(function)
    except (OSError, TypeError):
        return False
    return STARTS_PROCESSES.search(source) is not None


@pytest.fixture(autouse=True)
def _doctest_names(doctest_namespace: dict) -> None:
    doctest_namespace["pp"] = pp
    doctest_namespace["np"] = np
    doctest_namespace["datasets"] = pytest.importorskip("datasets")
