"""Conversations reach the chat template exactly as the data holds them, through every reader: tool-call arguments
whose keys differ between rows gain no null keys and keep their order, a tool schema's ``"default": null`` stays,
content is a string in some rows and a list of parts in others (``read_jsonl``, ``from_iterable``, ``from_hf``, and
``read_parquet`` of a file ``datasets`` wrote with its ``Json`` feature)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import padpipe as pp
from tests.chat import real_templates as rt

pytest.importorskip("transformers")


def call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


SCHEMA = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the weather.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "default": None}}},
    },
}
ROWS = [
    {
        "id": 0,
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [call("get_weather", {"unit": "C", "city": "Paris"})]},
            {"role": "tool", "content": '{"temperature": 21}'},
            {"role": "assistant", "content": "21 degrees."},
        ],
        "tools": [SCHEMA],
    },
    {
        "id": 1,
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Count the words."}]},
            {"role": "assistant", "content": "", "tool_calls": [call("count", {"count": 2, "text": None})]},
            {"role": "tool", "content": "2"},
            {"role": "assistant", "content": "Two."},
        ],
        "tools": [{**SCHEMA, "function": {**SCHEMA["function"], "name": "count", "strict": True}}],
    },
]
"""Two rows whose nested values Arrow would unify: other argument keys in another order, a null argument, a
null default, an extra key in one schema, a content string in one row and a list of parts in the other."""


def rendered(pipe: pp.Pipeline, tok: Any) -> list[str]:
    return [tok.decode(b["input_ids"][0]) for b in pipe.chat(tok).batch(1).pad().loader()]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    datasets = pytest.importorskip("datasets")
    folder = tmp_path_factory.mktemp("as_written")
    jsonl = folder / "chats.jsonl"
    jsonl.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    dataset = datasets.load_dataset("json", data_files=str(jsonl), split="train")
    dataset.to_parquet(str(folder / "chats.parquet"))
    return {"jsonl": jsonl, "parquet": folder / "chats.parquet"}


@pytest.mark.parametrize("reader", ["read_jsonl", "from_iterable", "from_hf", "read_parquet"])
def test_chat_renders_conversations_and_tools_as_written(reader: str, files: dict[str, Path]) -> None:
    tok = rt.tokenizer("qwen3")
    expected = [tok.apply_chat_template(row["messages"], tools=row["tools"], tokenize=False) for row in ROWS]
    assert '"unit": "C", "city": "Paris"' in expected[0] and '"default": null' in expected[0]
    assert '"count": 2, "text": null' in expected[1] and '"unit"' not in expected[1]
    if reader == "from_hf":
        datasets = pytest.importorskip("datasets")
        pipe = pp.from_hf(datasets.load_dataset("json", data_files=str(files["jsonl"]), split="train"))
    else:
        source = {"read_jsonl": files["jsonl"], "from_iterable": ROWS, "read_parquet": files["parquet"]}[reader]
        pipe = getattr(pp, reader)(source if reader == "from_iterable" else str(source))
    assert rendered(pipe, tok) == expected


def test_read_jsonl_json_columns_name_a_bad_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n" + '{"id": 1, "messages": [}\n')
    tok = rt.tokenizer("qwen3")
    with pytest.raises(pp.DataError, match=r"^" + str(path) + r" line 2: invalid JSON: Expecting value \(column 24\)"):
        list(pp.read_jsonl(str(path)).chat(tok).batch(1).pad().loader())
