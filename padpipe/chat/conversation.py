"""The rows one conversation becomes: each the template's own rendering of the messages up to one of its answers,
every trained message in exactly one of them, and what the template left out of them counted.

Most templates give one row, the whole conversation. An answer whose reasoning (or content) the whole
conversation does not render (Qwen3 drops the ``<think>`` blocks before the last user message) is trained in a
row that ends with it (``reasoning="every_turn"``), and so is an answer the whole conversation renders otherwise
(``split_rows``); what no row renders is counted as dropped. Why, and per template: docs/sft.md ("Reasoning",
"Templates tried").
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from padpipe.chat.message_texts import ASSISTANT, reasoning_of, visible_content
from padpipe.chat.rows import NOT_PREFIX, RowProblem

REASONING = ("every_turn", "as_rendered")
"""The ``reasoning=`` modes of ``.chat()``."""
Spans = Callable[[list[dict[str, Any]], Sequence[int], str, Any], list[tuple[int, int]]]
"""``spans(messages, indices, text, blocks)``: the canonical spans of ``messages[indices]`` in ``text``."""
Rendering = Callable[[list[dict[str, Any]]], tuple[str, Any]]
"""``render(messages)``: their text (no generation prompt) and their ``{% generation %}`` blocks."""


@dataclass
class Rows:
    """A conversation's rows: each a text and its trained spans, in the order of their last message; and what the
    template did not render (``dropped``: ``{"reasoning": n, "system": n, ...}``).

    Example:
        >>> Rows([("<u>Hi<a>Yes", [(7, 10)])]).dropped
        {}
    """

    texts: list[tuple[str, list[tuple[int, int]]]]
    dropped: dict[str, int] = field(default_factory=dict)
    kinds: list[str | None] = field(default_factory=list)  # per text: a row besides the conversation's own
    # ("reasoning_rows", "split_rows"), or None; empty: every row the conversation's own


def conversation_rows(
    messages: list[dict[str, Any]],
    trained: Sequence[int],
    *,
    full: str,
    blocks: Any,
    spans: Spans,
    render: Rendering,
    reasoning: str = "every_turn",
) -> Rows:
    """The rows ``messages`` becomes with ``trained`` messages trained (module docstring).

    Args:
        messages: The conversation.
        trained: The trained messages, ascending.
        full: Its whole rendering; ``blocks`` its ``{% generation %}`` blocks (or ``None``).
        spans: Finds spans in a rendering.
        render: Renders a prefix of the conversation.
        reasoning: ``"every_turn"`` or ``"as_rendered"``.

    Example:
        >>> chat = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yes"}]
        >>> text = "<user>Hi<assistant>Yes<end>"
        >>> rows = conversation_rows(chat, [1], full=text, blocks=None, spans=lambda ms, ks, t, b: [(19, 27)],
        ...                          render=lambda ms: (text, None))
        >>> rows.texts, rows.dropped
        ([('<user>Hi<assistant>Yes<end>', [(19, 27)])], {})
    """  # noqa: E501
    base, split = _placed(spans, messages, trained, full, blocks)
    rows: list[tuple[int, str, dict[int, tuple[int, int]]]] = []
    hidden = [k for k in base if _missing(messages[k], full, base[k])] if reasoning == "every_turn" else []
    pending = sorted([*split, *hidden])
    while pending:
        last = pending[-1]
        text, marks = render(messages[: last + 1])
        found, problems = _placed(spans, messages[: last + 1], pending, text, marks)
        if last in problems:  # even as its last message: not well-formed for the template
            raise problems[last]
        shown = [k for k in found if k in split or not _missing(messages[k], text, found[k])]
        if last not in shown:  # not even as the last answer: trained where the whole conversation has it
            pending.remove(last)
            continue
        rows.append((last, text, {k: found[k] for k in shown}))
        for k in shown:
            pending.remove(k)
            base.pop(k, None)
    dropped: dict[str, int] = {}
    for _, text, trained_spans in rows + [(len(messages), full, base)]:
        for k, span in trained_spans.items():
            for what, n in _missing(messages[k], text, span).items():
                dropped[what] = dropped.get(what, 0) + n
    for message in messages:
        content = visible_content(message)
        if message["role"] != ASSISTANT and content and not _rendered(content, full):
            dropped[message["role"]] = dropped.get(message["role"], 0) + 1
    rows.sort(key=lambda row: row[0])
    texts = [(text, [found[k] for k in sorted(found)]) for _, text, found in rows]
    kinds: list[str | None] = ["split_rows" if last in split else "reasoning_rows" for last, _, _ in rows]
    if base or not rows:
        texts.append((full, [base[k] for k in sorted(base)]))
        kinds.append(None)
    kinds[-1] = None  # the conversation's own row: its whole rendering, or else its last row
    return Rows(texts, dropped, kinds)


def _placed(
    spans: Spans, messages: list[dict[str, Any]], indices: Sequence[int], text: str, blocks: Any
) -> tuple[dict[int, tuple[int, int]], dict[int, RowProblem]]:
    """The spans of ``messages[indices]`` in ``text``, and the problem of each that ``text`` renders otherwise than
    the messages up to it do (``not_prefix``; any other problem raises)."""
    todo, problems = list(indices), dict[int, RowProblem]()
    while True:
        try:
            return dict(zip(todo, spans(messages, todo, text, blocks))), problems
        except RowProblem as problem:
            if problem.reason != NOT_PREFIX or problem.at not in todo:
                raise
            problems[problem.at] = problem
            todo.remove(problem.at)


def _rendered(content: str, text: str) -> bool:
    """Whether ``text`` holds ``content``, as it is or as a JSON string (Llama 3.1 writes a tool's result so)."""
    return content in text or json.dumps(content, ensure_ascii=False)[1:-1] in text


def _missing(message: Mapping[str, Any], text: str, span: tuple[int, int]) -> dict[str, int]:
    """What of answer ``message`` its span in ``text`` does not hold: its ``reasoning``, its ``answer_content``
    (gpt-oss writes a tool call's words only while no final answer follows), its ``tool_calls`` (how many)."""
    if message["role"] != ASSISTANT:
        return {}
    held = text[span[0] : span[1]]
    thought, content = reasoning_of(message), visible_content(message)
    calls = [call.get("function", call) for call in message.get("tool_calls") or [] if isinstance(call, dict)]
    names = [str(f["name"]) for f in calls if isinstance(f, dict) and isinstance(f.get("name"), str)]
    missing = {
        "reasoning": int(bool(thought) and not _rendered(thought, held)),
        "answer_content": int(bool(content) and not _rendered(content, held)),
        "tool_calls": sum(not _rendered(name, held) for name in names),
    }
    return {what: n for what, n in missing.items() if n}
