"""The ``slow`` marker (conftest.py): on the tests that start processes, so ``make test-fast`` leaves them out."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


REPORT = """
import sys, pytest

class Report:
    def pytest_collection_finish(self, session):  # after conftest.py has marked the items
        for item in session.items:
            print("SLOW" if item.get_closest_marker("slow") else "FAST", item.nodeid)

sys.exit(pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", *sys.argv[1:]], plugins=[Report()]))
"""


def collect(script: str, *args: str) -> list[str]:
    """The lines ``script`` (a pytest collection with a reporting plugin) prints, run on ``args`` in a fresh process."""
    done = subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        timeout=200,
        cwd=ROOT,
        check=False,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.splitlines()


def collected(*files: str) -> tuple[set[str], set[str]]:
    """The tests of ``files`` marked ``slow`` and the others, from one collection."""
    marked = [line.split(" ", 1) for line in collect(REPORT, *files) if line.startswith(("SLOW ", "FAST "))]
    return {t for m, t in marked if m == "SLOW"}, {t for m, t in marked if m == "FAST"}


def test_slow_marks_processes_torchrun_and_frameworks_and_nothing_else() -> None:
    files = ["tests/test_loader.py", "tests/test_distributed.py", "tests/test_cli.py", "tests/test_stats.py"]
    slow, fast = collected(*files)
    assert slow and fast and not slow & fast
    assert any(t.startswith("tests/test_distributed.py::") for t in slow)
    assert not any(t.startswith("tests/test_distributed.py::") for t in fast)  # torchrun: the whole file
    assert "tests/test_loader.py::test_loader_reads_every_row_once_per_epoch_and_epochs_differ[2]" in slow
    assert "tests/test_loader.py::test_loader_reads_every_row_once_per_epoch_and_epochs_differ[0]" in fast
    assert "tests/test_loader.py::test_loader_with_workers_resumes_exactly" in slow  # num_workers=2 in its body
    assert "tests/test_cli.py::test_python_m_padpipe_runs_the_command_line" in slow  # subprocess
    assert not any(t.startswith("tests/test_stats.py::") for t in slow)
    assert "tests/test_cli.py::test_cli_help_names_every_option_and_its_default" in fast


def test_the_slow_marker_is_registered() -> None:
    text = (ROOT / "pyproject.toml").read_text()
    assert 'markers = ["slow: starts processes, torchrun or a training framework' in text
    makefile = (ROOT / "Makefile").read_text()
    assert 'test-fast: $(STAMP)\n\t$(PY) $(PYTEST) -m "not slow"\n' in makefile
    assert "\nPYTEST = -m pytest -q -n $(JOBS) --dist loadfile\n" in makefile  # a file's fixtures run once


NOT_IMPORTED = """
import sys, pytest

class Report:
    def pytest_collection_finish(self, session):
        print("ITEMS", len(session.items), "LIGHTNING", "lightning" in sys.modules)

sys.exit(pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", *sys.argv[1:]], plugins=[Report()]))
"""


def test_test_fast_does_not_import_the_files_it_leaves_out() -> None:
    """Under ``-m "not slow"`` the folders and files of SLOW_FILES are not collected (their imports cost each process
    seconds)."""
    found = {}
    for marks, folder in ((["-m", "not slow"], "tests/integrations"), ([], "tests/integrations/test_lightning.py")):
        lines = collect(NOT_IMPORTED, *marks, folder, "tests/test_stats.py")  # (the control: one Lightning file)
        found[bool(marks)] = next(line for line in lines if line.startswith("ITEMS "))
    fast, every = found[True].split(), found[False].split()
    assert fast[3] == "False" and every[3] == "True"  # Lightning imported only when its tests are collected
    assert 0 < int(fast[1]) < int(every[1])  # test_stats.py's tests still collected
