"""The README's layout section names every module of the tree, and only those; the import graph has no circle."""

from __future__ import annotations

import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "padpipe"


def _layout_block() -> str:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Layout", 1)[1]
    return section.split("```", 2)[1]


def _named(block: str) -> set[str]:
    """Module paths the layout names: top-level ``x.py`` words and each wing's listed module names."""
    named, wing = set(), None
    for line in block.splitlines()[1:]:
        head = re.match(r"  (\w+)/\s", line)
        if head:
            wing = head.group(1)
        elif re.match(r"  \S", line):
            wing = None
        words = re.findall(r"\b[\w]+\.py\b", line) if wing is None else []
        named |= {f"padpipe/{w}" for w in words}
        if wing and wing not in ("data",):
            listing = line.split(":", 1)[1] if head and ":" in line else (line if not head else "")
            named |= {f"padpipe/{wing}/{w}.py" for w in re.findall(r"\b[a-z_]+\b", listing) if w.islower()}
    return named


def test_the_layout_section_lists_every_module_in_the_tree():
    named = _named(_layout_block())
    modules = {
        str(p.relative_to(ROOT))
        for p in PACKAGE.rglob("*.py")
        if p.name not in ("__init__.py", "__main__.py") and "data" not in p.parts
    }
    assert sorted(modules - named) == []  # in the tree, missing from the README
    wings = {m for m in named if m.count("/") == 2}
    assert sorted(wings - modules) == []  # listed in a wing, but no such module


def test_no_padpipe_module_imports_another_inside_a_function_to_dodge_a_circle():
    """Imports inside functions are kept only for start-up time (the command line, the matplotlib chart)."""
    allowed = {"padpipe/cli.py", "padpipe/inspection/report.py"}
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        for fn in (n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.FunctionDef)):
            for node in ast.walk(fn):
                if (
                    isinstance(node, ast.ImportFrom)
                    and (node.module or "").startswith("padpipe")
                    and rel not in allowed
                ):
                    found.append(f"{rel}:{node.lineno}")
    assert found == []
