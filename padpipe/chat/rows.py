"""The columns of conversation rows read into Python values: messages, prompt/completion, tools, template arguments.

Each reader returns one value per row, or a :class:`RowProblem` saying what is wrong with that row;
the stage names the row (file, row, ``idx``/``id``) and raises or counts it.
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa

BAD, TEMPLATE, NOT_PREFIX, CHECK = "bad_messages", "template_error", "not_prefix", "span_check"
"""The reasons a row is refused (``chat.<reason>`` in ``stats().skipped`` under ``on_error="skip"``): a value that is
not a conversation, a template that raised, a rendering whose turns could not be aligned, a span that failed its
check."""
SPECIAL = "special_text"
"""A conversation whose text holds a special token's text (its own policy, ``special_text=``)."""


class RowProblem(Exception):
    """Why one conversation cannot become tokens; ``reason``: :data:`BAD`, :data:`TEMPLATE`, :data:`NOT_PREFIX`,
    :data:`CHECK` or :data:`SPECIAL`.

    Example:
        >>> RowProblem(BAD, "'messages' is None; expected a list of messages").reason
        'bad_messages'
    """

    def __init__(self, reason: str, message: str, at: int | None = None) -> None:
        super().__init__(message)
        self.reason, self.at = reason, at  # at: the message it is about, where one is


def read_messages(column: pa.Array, name: str) -> list[Any]:
    """Each row's list of messages (a list column of structs, or JSON text), or a :class:`RowProblem`.

    Example:
        >>> read_messages(pa.array(['[{"role": "user", "content": "hi"}]', "[]"]), "messages")
        [[{'role': 'user', 'content': 'hi'}], RowProblem("'messages' is an empty list; expected a list of messages (dicts with a 'role' string)")]
    """  # noqa: E501
    return [or_problem(check_messages, value, name) for value in _values(column, name, parse=True)]


def read_prompt_completion(prompt: pa.Array, completion: pa.Array, names: tuple[str, str]) -> list[Any]:
    """Each row's ``(prompt, completion)``: two lists of messages, or two strings; else a :class:`RowProblem`.

    Example:
        >>> read_prompt_completion(pa.array(["2+2="]), pa.array(["4"]), ("prompt", "completion"))
        [('2+2=', '4')]
    """
    pairs = zip(_values(prompt, names[0], parse=False), _values(completion, names[1], parse=False))
    return [or_problem(_pair, pair, names) for pair in pairs]


def read_tools(column: pa.Array | None, name: str) -> list[Any]:
    """Each row's tools (a list of JSON schemas, or ``None``), from JSON text or structs; else a :class:`RowProblem`.

    Structs lose their ``None`` values (a struct column gives every row the keys of all rows).

    Example:
        >>> read_tools(pa.array([['{"type": "function"}'], None]), "tools")
        [[{'type': 'function'}], None]
    """
    if column is None:
        return []
    return [or_problem(_tools, value, name) for value in _values(column, name, parse=True, drop_none=True)]


def read_kwargs(column: pa.Array | None, name: str) -> list[Any]:
    """Each row's template arguments (a dict, from a struct, a map or JSON text); else a :class:`RowProblem`.

    Example:
        >>> read_kwargs(pa.array([{"enable_thinking": False}, None]), "chat_template_kwargs")
        [{'enable_thinking': False}, {}]
    """
    if column is None:
        return []
    return [or_problem(_kwargs, value, name) for value in _values(column, name, parse=True, drop_none=True)]


def check_messages(value: Any, name: str) -> list[dict[str, Any]]:
    """``value`` if it is a non-empty list of dicts with a ``role`` string, else :class:`RowProblem`."""
    expected = "expected a list of messages (dicts with a 'role' string)"
    if not isinstance(value, list):
        raise RowProblem(BAD, f"{name!r} is {_show(value)}; {expected}")
    if not value:
        raise RowProblem(BAD, f"{name!r} is an empty list; {expected}")
    for i, message in enumerate(value):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise RowProblem(BAD, f"message {i} of {name!r} is {_show(message)}; {expected}")
        content, reasoning = message.get("content"), message.get("reasoning_content")
        if not (content is None or isinstance(content, (str, list))):
            raise RowProblem(BAD, f"message {i}'s content is {_show(content)}; expected text, a list of parts or null")
        if not (reasoning is None or isinstance(reasoning, str)):
            raise RowProblem(BAD, f"message {i}'s reasoning_content is {_show(reasoning)}; expected text or null")
    return value


def _values(column: pa.Array, name: str, *, parse: bool, drop_none: bool = False) -> list[Any]:
    """The column's Python values; JSON text parsed when ``parse`` (a value that is no JSON: a RowProblem)."""
    kind = column.type
    if _has_json(kind):  # JSON text as written (read_jsonl and from_iterable under .chat(), datasets' Json)
        values = [or_problem(_decoded_row, value, (kind, name, drop_none)) for value in column.to_pylist()]
        return [or_problem(_parse, v, name) for v in values] if parse else values
    if pa.types.is_dictionary(kind):
        column, kind = column.dictionary_decode(), kind.value_type
    values = column.to_pylist()
    if pa.types.is_map(kind):
        values = [None if v is None else dict(v) for v in values]
    if drop_none and _has_struct(kind):
        values = [_without_none(v) for v in values]
    if parse and (pa.types.is_string(kind) or pa.types.is_large_string(kind) or _is_text_list(kind)):
        values = [or_problem(_parse, v, name) for v in values]
    return values


def _decoded_row(value: Any, how: tuple[pa.DataType, str, bool]) -> Any:
    kind, name, drop_none = how
    try:
        return _decoded(value, kind, drop_none)
    except json.JSONDecodeError as exc:
        raise RowProblem(BAD, f"{name!r} holds text that is not JSON ({exc})") from None


def _parse(value: Any, name: str) -> Any:
    if isinstance(value, list):
        return [_parse(item, name) for item in value]
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError as exc:
        raise RowProblem(BAD, f"{name!r} holds text that is not JSON ({exc}): {value[:60]!r}") from None


def _pair(pair: tuple[Any, Any], names: tuple[str, str]) -> tuple[Any, Any]:
    prompt, completion = pair
    if isinstance(prompt, str) and isinstance(completion, str):
        return prompt, completion
    if isinstance(prompt, list) and isinstance(completion, list):
        return check_messages(prompt, names[0]), check_messages(completion, names[1])
    raise RowProblem(
        BAD,
        f"{names[0]!r} is {_show(prompt)} and {names[1]!r} is {_show(completion)}; expected two lists of messages "
        "or two strings",
    )


def _tools(value: Any, name: str) -> list[Any] | None:
    if value is None or (isinstance(value, list) and all(isinstance(t, dict) for t in value)):
        return value
    raise RowProblem(BAD, f"{name!r} is {_show(value)}; expected a list of tool schemas (JSON objects)")


def _kwargs(value: Any, name: str) -> dict[str, Any]:
    if value is None:
        return {}
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return value
    raise RowProblem(BAD, f"{name!r} is {_show(value)}; expected template arguments (a JSON object or a struct)")


def or_problem(check: Any, value: Any, *more: Any) -> Any:
    """``check(value, *more)``, or the :class:`RowProblem` that ``value`` is or that ``check`` raises.

    Example:
        >>> or_problem(check_messages, [], "messages").reason
        'bad_messages'
    """
    if isinstance(value, RowProblem):
        return value
    try:
        return check(value, *more)
    except RowProblem as problem:
        return problem


def _show(value: Any) -> str:
    if value is None:
        return "None"
    text = repr(value)
    return f"a {type(value).__name__} ({text[:57] + '...' if len(text) > 60 else text})"


def _has_json(kind: pa.DataType) -> bool:
    """Whether ``kind`` holds an extension type anywhere (``datasets``' ``Json`` feature: ``arrow.json`` text)."""
    if isinstance(kind, pa.BaseExtensionType):
        return True
    if pa.types.is_struct(kind):
        return any(_has_json(field.type) for field in kind)
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return _has_json(kind.value_type)
    return False


def _decoded(value: Any, kind: pa.DataType, drop_none: bool) -> Any:
    """A Python value of type ``kind`` with its JSON-text parts parsed, as written; with ``drop_none``, the
    ``None`` values of its structs dropped (a struct gives every row the keys of all rows), not those inside
    the JSON text."""
    if value is None:
        return None
    if isinstance(kind, pa.BaseExtensionType):
        return json.loads(value) if isinstance(value, (str, bytes)) else value
    if pa.types.is_struct(kind):
        out = {f.name: _decoded(value.get(f.name), f.type, drop_none) for f in kind}
        return {k: v for k, v in out.items() if v is not None} if drop_none else out
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return [_decoded(v, kind.value_type, drop_none) for v in value]
    return value


def _has_struct(kind: pa.DataType) -> bool:
    if pa.types.is_struct(kind):
        return True
    return (pa.types.is_list(kind) or pa.types.is_large_list(kind)) and _has_struct(kind.value_type)


def _is_text_list(kind: pa.DataType) -> bool:
    return (pa.types.is_list(kind) or pa.types.is_large_list(kind)) and (
        pa.types.is_string(kind.value_type) or pa.types.is_large_string(kind.value_type)
    )


def _without_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_none(v) for v in value]
    return value
