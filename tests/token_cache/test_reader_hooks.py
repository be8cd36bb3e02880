"""The token cache reads a reader only through the reader's named hooks (no private fields, no attributes set)."""

from __future__ import annotations

import ast
import pathlib

import padpipe as pp
from padpipe.readers.format import Format
from padpipe.readers.jsonl import JsonlReader
from padpipe.readers.source import UnitSource

PACKAGE = pathlib.Path(pp.__file__).parent
OUTSIDE_READERS = [*sorted((PACKAGE / "token_cache").glob("*.py")), PACKAGE / "_build.py", PACKAGE / "cache.py"]


def test_the_cache_reads_no_private_field_of_another_object_and_sets_no_attribute():
    found = []
    for path in OUTSIDE_READERS:
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Attribute) or isinstance(node.value, ast.Name) and node.value.id == "self":
                continue
            private = node.attr.startswith("_") and not node.attr.startswith("__")
            owner = ast.unparse(node.value)
            if (private and owner not in {"cr", "self"}) or (
                isinstance(node.ctx, ast.Store) and owner in {"node", "reader"}
            ):
                found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    assert found == []


def test_the_reader_base_names_its_cache_hooks_and_only_byte_cut_readers_record_positions(tmp_path):
    hooks = ("use_token_cache", "listed_units", "file_of", "listed_files", "rows")
    assert all(callable(getattr(UnitSource, name)) for name in hooks)
    format_hooks = ("describe", "measure", "piece", "record_row_positions", "drop_position_hint")
    assert all(callable(getattr(Format, name)) for name in format_hooks)
    (tmp_path / "a.jsonl").write_text('{"text": "a"}\n')
    reader = JsonlReader(paths=str(tmp_path / "a.jsonl"))
    fmt = reader.format
    assert fmt.row_positions is False and fmt.record_row_positions() is True and fmt.row_positions
    assert [u.path for u in reader.listed_units()] == list(reader.listed_files())
