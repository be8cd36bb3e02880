"""CONTRIBUTING.md's layout section names every module of the tree, and only those; the import graph has no circle.

Imports count wherever they are: at the top, inside a function, and under ``TYPE_CHECKING`` (a type a
lower module needs from a higher one is a small ``typing.Protocol`` of the lower module's own).
"""

from __future__ import annotations

import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "padpipe"


def _layout_block() -> str:
    text = (ROOT / "CONTRIBUTING.md").read_text()
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
    assert sorted(modules - named) == []  # in the tree, missing from CONTRIBUTING.md
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


LADDER = (
    # bottom first: a module may import its own rung and those below, never above (type-only imports too)
    ("errors", "state_walk", "state_specs", "state", "batch_spec", "chunks", "stats", "graph", "shutdown", "buffers", "_optional",
     "_progress",
     "_command", "examples", "_shipped"),  # the ground floor
    ("sharing", "stage"),  # who reads what; what a recipe is made of
    ("readers",),
    ("tokenizer",),
    ("chat",),
    ("token_cache",),
    ("pipes",),
    ("runtime",),
    ("_build", "_checks", "cache", "checkpoints", "drivers", "loader", "runnable", "stage_chain", "token_stages",
     "batch_stages", "pipeline", "sources", "mix"),  # core
    ("inspection",),
    ("recipes",),  # plain functions that return pipelines (the torchtitan adapter reads corpora through them)
    ("integrations",),
    ("hf", "cli", "demo", "__main__", "__init__"),  # the face
)  # fmt: skip


def _unit(path: pathlib.Path) -> str:
    """A module's rung name: its wing, or its own name for a top-level module."""
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return parts[0]


def _imports(path: pathlib.Path) -> list[tuple[str, int]]:
    """The padpipe modules ``path`` imports (relative imports resolved), with their lines; type-only ones included."""
    tree = ast.parse(path.read_text())
    package = list(path.relative_to(ROOT).with_suffix("").parts)[:-1] if path.is_relative_to(ROOT) else []
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, node.module] if node.module else base) if node.level else node.module or ""
            names = [f"{module}.{a.name}" for a in node.names] if module == "padpipe" else [module]
            out += [(name, node.lineno) for name in names if name.startswith("padpipe.")]
        elif isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names if a.name.startswith("padpipe.")]
    return out


def test_the_wings_form_a_ladder_every_import_points_down():
    rung = {unit: level for level, units in enumerate(LADDER) for unit in units}
    units = {_unit(p) for p in PACKAGE.rglob("*.py") if "data" not in p.relative_to(PACKAGE).parts}
    assert sorted(units - set(rung)) == [], "a module or wing missing from LADDER"
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if "data" in path.relative_to(PACKAGE).parts:
            continue
        source = _unit(path)
        for module, line in _imports(path):
            target = module.split(".")[1]
            if target in rung and rung[target] > rung[source]:
                upward.append(f"{path.relative_to(ROOT)}:{line} ({source}) imports {module} ({target})")
    assert upward == []


def _modules() -> dict[str, pathlib.Path]:
    """Every padpipe module by dotted name (a package by its own name)."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if "data" not in path.relative_to(PACKAGE).parts:
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            out[name.removesuffix(".__init__")] = path
    return out


def _module_graph() -> dict[str, set[str]]:
    """Module -> the padpipe modules it imports (``from padpipe.x import name`` counts as ``padpipe.x``)."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        graph[name] = set()
        for module, _ in _imports(path):
            while module and module not in modules:
                module = module.rpartition(".")[0]
            if module and module != name:
                graph[name].add(module)
    return graph


def _circle(graph: dict[str, set[str]]) -> list[str]:
    """One import circle of ``graph`` (its modules in order, the first again at the end), or ``[]``."""
    done: set[str] = set()
    for start in sorted(graph):
        path, on_path, stack = [start], {start}, [iter(sorted(graph[start]))]
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                stack.pop()
                finished = path.pop()
                on_path.discard(finished)
                done.add(finished)
            elif nxt in on_path:
                return path[path.index(nxt) :] + [nxt]
            elif nxt not in done:
                path.append(nxt)
                on_path.add(nxt)
                stack.append(iter(sorted(graph[nxt])))
    return []


def test_no_import_circle_between_modules_type_only_imports_included():
    assert _circle(_module_graph()) == []


def test_a_circle_through_type_checking_is_found(tmp_path):
    assert _circle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert _circle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == []
    module = tmp_path / "m.py"
    module.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from padpipe.pipeline import Pipeline\n"
    )
    assert ("padpipe.pipeline", 3) in _imports(module)


def test_only_the_framework_adapters_read_call_frames():
    """Who calls padpipe is checked in call frames by integrations/ only (raise or warn); the core asks padpipe.drivers."""
    found = [
        str(path.relative_to(PACKAGE))
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.relative_to(PACKAGE).parts[0] != "integrations"
        and re.search(r"\b_getframe\b|\bf_back\b|\bf_locals\b", path.read_text())
    ]
    assert found == []
