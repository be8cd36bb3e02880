"""The texts a template writes for a message as given (its reasoning, content, tool calls' names and arguments), and
where such a text is in a rendering: as written, or as a JSON string writes it (tool calls' arguments)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

ASSISTANT = "assistant"


def visible_content(message: Mapping[str, Any]) -> str:
    """The text of a message a template shows as its content: a string's, after any ``</think>``, stripped (of a
    list of parts, the last text part's).

    Example:
        >>> visible_content({"role": "assistant", "content": "<think>\\nhm\\n</think>\\n\\n Yes. "})
        'Yes.'
    """
    content = message.get("content")
    if isinstance(content, list):  # parts: the last text part (what the previous turn's end follows)
        texts = [p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)]
        return texts[-1].strip() if texts else ""
    return content.split("</think>")[-1].strip() if isinstance(content, str) else ""


def reasoning_of(message: Mapping[str, Any]) -> str:
    """A message's reasoning: its ``reasoning_content`` (or ``reasoning``, or gpt-oss's ``thinking``), else the
    ``<think>`` block of its content; stripped (``""``: none).

    Example:
        >>> reasoning_of({"content": "<think>\\nSum them.\\n</think>\\n\\n4"}), reasoning_of({"content": "4"})
        ('Sum them.', '')
    """
    for key in ("reasoning_content", "reasoning", "thinking"):
        value = message.get(key)
        if isinstance(value, str) and value.strip():
            return value.strip()
    content = message.get("content")
    if isinstance(content, str) and "</think>" in content:
        return content.split("</think>")[0].split("<think>")[-1].strip()
    return ""


def parts(message: Mapping[str, Any]) -> list[str]:
    """The texts of a message a template writes as given, its reasoning first.

    Example:
        >>> parts({"content": "<think>Add.</think>4", "tool_calls": [{"name": "sum", "arguments": {"a": 1}}]})
        ['Add.', '4', 'sum', '1']
    """
    return [t for t in (reasoning_of(message), *rendered_texts(message)) if t]


def rendered_texts(message: Mapping[str, Any]) -> list[str]:
    """The texts of a message a template writes as given, in order: its content, then each tool call's name and
    the values of its arguments.

    Example:
        >>> rendered_texts({"content": "", "tool_calls": [{"function": {"name": "f", "arguments": {"q": "x"}}}]})
        ['f', 'x']
    """
    texts = [visible_content(message)]
    for call in message.get("tool_calls") or []:
        function = call.get("function", call) if isinstance(call, dict) else {}
        if not isinstance(function, dict):
            continue
        texts.append(name if isinstance(name := function.get("name"), str) else "")
        arguments = function.get("arguments")
        texts.extend(_strings(arguments) if not isinstance(arguments, str) else [arguments])
    return [t for t in texts if t]


def find(text: str, part: str, start: int) -> tuple[int, int]:
    """Where ``part`` first is in ``text`` from ``start``, as written or in JSON (-1: nowhere), and its size there.

    Example:
        >>> find('{"q": "a\\\\nb"}', "a\\nb", 0)
        (7, 4)
    """
    found = [(at, len(form)) for form in (part, as_json(part)) if (at := text.find(form, start)) >= 0]
    return min(found, default=(-1, 0))


def last(text: str, part: str, end: int) -> tuple[int, int]:
    """Where ``part`` last is in ``text[:end]``, as written or in JSON (-1: nowhere), and its size there.

    Example:
        >>> last("a b a", "a", 5), last("a b a", "a", 4)
        ((4, 1), (0, 1))
    """
    found = [(at, len(form)) for form in (part, as_json(part)) if (at := text.rfind(form, 0, end)) >= 0]
    return max(found, default=(-1, 0))


def as_json(text: str) -> str:
    """``text`` as a JSON string writes it, without the quotes.

    Example:
        >>> as_json('say "hi"')
        'say \\\\"hi\\\\"'
    """
    return json.dumps(text, ensure_ascii=False)[1:-1]


def _strings(value: Any) -> list[str]:
    """The leaves of JSON arguments as a template writes them: strings as they are, the others as JSON."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return [json.dumps(value)]
