"""README.md and docs/*.md run as written: every python, bash and console block (see tests/docs_blocks.py).

Each page runs in its own interpreter, offline, every python block with fresh names in an empty
temporary folder, so a block that forgets an import or needs a file it never made fails here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import docs_blocks
from tests.docs_blocks import ROOT, Block

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PAGE_TIMEOUT = 900
BLOCKS = [block for page in PAGES for block in docs_blocks.runnable(page)]


@pytest.fixture(scope="module")
def checkout_before() -> str | None:
    return _git_status()


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory, checkout_before: str | None) -> dict[str, dict]:
    """Every page run once, all in one interpreter apart from the tests' (imports paid once), results by block name."""
    folder = tmp_path_factory.mktemp("docs")
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    report = folder / "report.json"
    command = [sys.executable, "-m", "tests.docs_blocks", *map(str, PAGES), str(report)]
    done = subprocess.run(
        command, cwd=folder, env=env, capture_output=True, text=True, timeout=PAGE_TIMEOUT * len(PAGES)
    )
    assert done.returncode == 0, f"running the pages failed:\n{done.stderr[-3000:]}"
    return {r["name"]: r for r in json.loads(report.read_text())}


@pytest.mark.timeout(PAGE_TIMEOUT * len(PAGES))
@pytest.mark.parametrize("block", BLOCKS, ids=[b.name for b in BLOCKS])
def test_doc_block_runs_as_written(block: Block, results: dict[str, dict]) -> None:
    result = results[block.name]
    if result.get("skipped"):
        pytest.skip(result["skipped"])
    assert result["ok"], f"{block.name} ({block.kind}):\n{block.code}\n{result['message']}"


def test_docs_leave_the_checkout_as_it_was(results: dict[str, dict], checkout_before: str | None) -> None:
    if checkout_before is None:
        pytest.skip("not a git checkout")
    assert _git_status() == checkout_before


def test_every_page_has_runnable_blocks_and_says_why_others_do_not_run() -> None:
    for page in PAGES:
        found = docs_blocks.blocks(page)
        assert any(b.kind == "python" and b.no_run is None for b in found) or page.name != "README.md"
        for block in found:
            if block.no_run is not None:
                assert len(block.no_run) > 5, f"{block.name}: say why it cannot run"


def test_blocks_reads_outputs_markers_and_commands(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "Intro.\n\n```python\nprint(1 + 1)\n```\n\n```text\n2\n```\n\nA signature:\n\n```text\nf(x)\n```\n\n"
        "<!-- no-run: installs packages -->\n```bash\npip install padpipe\n```\n\n"
        "```console\n$ echo a \\\n    b\na b\n$ echo c\nc\n```\n"
    )
    found = docs_blocks.blocks(page)
    assert [(b.kind, b.line, b.output, b.no_run) for b in found] == [
        ("python", 3, "2\n", None),
        ("text", 13, None, None),
        ("bash", 18, None, "installs packages"),
        ("console", 22, None, None),
    ]
    assert [b.kind for b in docs_blocks.runnable(page)] == ["python", "console"]
    assert docs_blocks.run_python(found[0]) == ""
    assert docs_blocks.run_console(found[3]) == ""


def test_a_bare_fence_right_after_a_python_block_is_its_output_and_is_checked(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("```python\nprint(2 * 20000)\n```\n\n```\n0 40000\n```\n\nTimed:\n\n```\n1.5 s\n```\n")
    found = docs_blocks.blocks(page)
    assert [(b.kind, b.output) for b in found] == [("python", "0 40000\n"), ("", None)]  # after a sentence: shown only
    assert docs_blocks.run_python(found[0]).startswith("output differs:")


def test_a_block_marked_continues_goes_on_from_the_python_block_above(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "```python\nx = 1\nopen('made', 'w').close()\n```\n\n```console\n$ true\n```\n\n"
        "<!-- continues -->\n```python\nimport os\nprint(x + 1, os.path.exists('made'))\n```\n\n```text\n2 True\n```\n\n"
        "```python\nprint(x)\n```\n"
    )
    assert [b.continues for b in docs_blocks.blocks(page)] == [False, False, True, False]
    results = docs_blocks.run_page(page)
    assert [r.ok for r in results] == [True, True, True, False]
    assert "NameError: name 'x' is not defined" in results[3].message  # a block not marked starts afresh


def test_a_block_fails_when_it_prints_something_else_or_names_what_it_never_defined(tmp_path: Path) -> None:
    wrong = Block("page.md", 1, "python", "print('hello')\n", output="goodbye\n")
    assert docs_blocks.run_python(wrong).startswith("output differs:\n--- the page shows\n+++ the block printed\n")
    with pytest.raises(NameError, match=r"^name 'pp' is not defined$"):
        docs_blocks.run_python(Block("page.md", 1, "python", "pp.examples.tokenizer()\n"))
    console = Block("page.md", 1, "console", "$ echo yes\nno\n")
    assert docs_blocks.run_console(console).startswith("$ echo yes\noutput differs:")
    assert docs_blocks.run_bash(Block("page.md", 1, "bash", "true\nfalse\n")) == "`false` exited with 1:\n"


def _git_status() -> str | None:
    if not (ROOT / ".git").exists():
        return None
    done = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=all"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    return done.stdout if done.returncode == 0 else None
