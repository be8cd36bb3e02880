"""The epoch protocol: every node that keeps an epoch declares it (EpochAware), and the walk reaches them all."""

from __future__ import annotations

import ast
import pathlib

import padpipe as pp
from padpipe.graph import EpochAware, start_at_epoch
from padpipe.pipes.bucket import Bucketizer
from padpipe.pipes.shuffle import ShuffleBuffer
from padpipe.readers.iterable import IterableReader

PACKAGE = pathlib.Path(pp.__file__).parent


def _graph_nodes(root):
    seen, stack, out = set(), [root], []
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        out.append(node)
        stack.extend(getattr(node, "source_nodes", {}).values())
        stack.extend(getattr(node, n) for n in ("source", "root", "_it") if hasattr(node, n))
    return out


def test_start_at_epoch_reaches_every_epoch_aware_node_of_a_built_graph():
    rows = [{"text": f"row {i}"} for i in range(20)]
    pipe = pp.from_iterable(rows).shuffle(8, seed=1).tokenize(pp.examples.tokenizer()).bucket(4).pad()
    loader = pipe.loader()
    start_at_epoch(loader.root, 7)
    aware = [n for n in _graph_nodes(loader.root) if isinstance(n, EpochAware)]
    assert {type(n) for n in aware} >= {IterableReader, ShuffleBuffer, Bucketizer}
    assert all(n._epoch == 6 for n in aware)


def test_every_class_that_keeps_an_epoch_declares_the_protocol():
    """A node that keeps ``_epoch`` without ``EpochAware`` would silently not be moved by ``set_epoch``."""
    undeclared = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for cls in (n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.ClassDef)):
            keeps = any(
                isinstance(n, ast.Attribute) and n.attr == "_epoch" and isinstance(n.ctx, ast.Store)
                for n in ast.walk(cls)
            )
            bases = {ast.unparse(b) for b in cls.bases}
            is_node = any("BaseNode" in b for b in bases)
            if keeps and is_node and "EpochAware" not in bases:
                undeclared.append(f"{path.relative_to(PACKAGE)}:{cls.name}")
    assert undeclared == []
