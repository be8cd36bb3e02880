"""Each trained message's canonical span in one rendering, found in that rendering itself: templates that render
a conversation's turns otherwise when more follows (Qwen3, DeepSeek-R1, Mistral, Phi-3) included.

An answer's span starts where the model's own output starts (:func:`output_start`) and ends with the end-of-turn
token that first follows its content; a message of another role turned on by its flag spans its whole turn. The
rules, with the templates that need each: docs/sft.md. Every span is checked (:func:`check`); a row that fails is
refused naming the message and the text, never given a wrong span.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from padpipe.chat.rows import CHECK, NOT_PREFIX, RowProblem

ASSISTANT = "assistant"
NO_SPECIALS = re.compile(r"(?!)")
"""A pattern that matches nothing: a tokenizer without special tokens."""
Render = Callable[[list[dict[str, Any]], bool], str]
"""``render(messages, generation_prompt)``: a prefix of the conversation rendered with the row's tools and
arguments."""


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


def locate(
    text: str,
    messages: Sequence[dict[str, Any]],
    indices: Sequence[int],
    render: Render,
    ends: Sequence[str],
    specials: re.Pattern[str] = NO_SPECIALS,
) -> list[tuple[int, int]]:
    """The canonical spans of ``messages[indices]`` (ascending) in ``text``, their rendering (module docstring).

    Args:
        text: The row's rendering of ``messages``.
        messages: The messages the row renders.
        indices: The trained messages, ascending.
        render: Renders a prefix of ``messages`` (with or without the generation prompt).
        ends: The template's end-of-turn strings (``""``: the end of the rendering, for a template that ends
            only earlier answers; ``()``: none, the span then ends where the message's own turn rendered last
            ends, the final separator left out).
        specials: The tokenizer's special tokens' text.

    Example:
        >>> chat = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
        >>> def render(ms, prompt):
        ...     return "".join(f"<{m['role']}>{m['content']}<end>" for m in ms) + ("<assistant>" if prompt else "")
        >>> text = render(chat, False)
        >>> [text[s:e] for s, e in locate(text, chat, [1], render, ["<end>"])]
        ['Hello<end>']
    """
    spans: list[tuple[int, int]] = []
    cursor, previous = 0, -1
    for k in indices:
        answer = messages[k]["role"] == ASSISTANT
        lower = spans[-1][0] if spans and previous == k - 1 else cursor
        for j in range(max(previous + 1, 1), k):  # past the messages since the last trained one (two may read alike)
            lower = max(lower, _message_start(text, lower, messages, j, render, specials)[0])
        if answer:
            start = output_start(text, cursor, messages, k, render, lower=lower, specials=specials)
        elif k and (found := _message_start(text, lower, messages, k, render, specials)[0]) >= 0:
            start = max(cursor, found)  # (the previous answer's turn may end with its header: GLM's <|user|>)
        else:
            start = _turn_start(text, messages, k, render)
        if answer and not text[start:].strip():  # a last answer it drops (empty, or its reasoning alone)
            spans.append((start, start))
            continue
        bound = _turn_bound(text, start, messages, k, render, ends, specials)
        end = _turn_end(text, start, bound, messages, k, render, ends)
        check(text, messages[k], k, start, end, cursor, ends, bound[0])
        spans.append((start, end))
        cursor, previous = end, k
    return spans


def check(
    text: str, message: Mapping[str, Any], k: int, start: int, end: int, cursor: int, ends: Sequence[str], bound: int
) -> None:
    """Raise :class:`RowProblem` (``span_check``) unless ``text[start:end]`` is a span message ``k`` can have:
    after the previous span, ending in the end-of-turn token (or where the next message starts, ``bound``), holding
    the message's content where its turn renders it."""
    span = text[start:end]
    content = visible_content(message)
    problem = None
    if start < cursor or end <= start:
        problem = f"its span [{start}:{end}] is not after the previous trained message's (which ends at {cursor})"
    elif ends and not any(span.endswith(e) for e in ends) and text[end:bound].strip():
        problem = f"its span does not end in an end-of-turn token ({' or '.join(map(repr, ends))})"
    elif content and content not in span and _find(text[:bound], content, start)[0] >= 0:  # (or may not render it)
        problem = "its span does not hold its content"
    if problem is not None:
        raise RowProblem(CHECK, f"message {k}: {problem}; the rendered text there is {_show(span)}")


def output_start(
    text: str,
    cursor: int,
    messages: Sequence[dict[str, Any]],
    k: int,
    render: Render,
    *,
    lower: int | None = None,
    specials: re.Pattern[str] = NO_SPECIALS,
) -> int:
    """Where the model's own output for message ``k`` starts in ``text``, at or after ``cursor``; the previous
    message's content is looked for from ``lower`` (default ``cursor``).

    Where the turn repeats the generation prompt only in part (DeepSeek-R1's ``<｜Assistant｜><think>\\n``
    before an answer without reasoning), the span starts after the prompt's header: its first line, or its
    special tokens, as far as the turn repeats them. Where the turn before it ends otherwise than when it is
    the last (Hermes-3 writes a newline after a tool's result only when more follows; Apertus's answers go on
    after a tool's result), the span starts where the messages up to it, rendered with the generation prompt and
    with message ``k``, part (:func:`own_start`), if ``text`` renders them alike.

    Example:
        >>> chat = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
        >>> render = lambda ms, prompt: "".join(f"<{m['role']}>{m['content']}" for m in ms) + "<assistant>" * prompt
        >>> output_start("<user>Hi<assistant>Hello", 0, chat, 1, render)
        19
    """
    prompted, plain = render(list(messages[:k]), True), render(list(messages[:k]), False)
    asked = max((i + 1 for i in range(k) if messages[i]["role"] != ASSISTANT), default=0)
    if plain.startswith(prompted) and asked:  # it goes on with a last answer (Nemotron v2): the prompt after another
        prompted = plain + _generation_prompt(messages, asked, render)
    if text.startswith(prompted) and len(prompted) >= cursor:
        return len(prompted)
    prompt = prompted[len(plain) :] if prompted.startswith(plain) else prompted
    dropped = k > asked and plain == render(list(messages[: k - 1]), False)  # an empty last answer it drops (Nemotron)
    if prompt and text.startswith(plain) and len(plain) >= cursor and not dropped:  # the messages before, alike
        return len(plain) + _header(prompt, _common_prefix(prompt, text, len(plain)), specials)
    content = visible_content(messages[k - 1]) if k > 0 else ""
    forms = [a for a in (content, _as_json(content)) if a and a in prompted]  # as written, or in JSON: its last
    anchor = max(forms, key=prompted.rfind, default="")  # place (an earlier message may hold it the other way)
    at = prompted.rfind(anchor) if anchor else -1
    tail = prompted[at + len(anchor) :]  # the previous turn's end, then the generation prompt
    needed = len(tail) - len(prompt)  # the previous turn's end must be there whole
    found = text.find(anchor, cursor if lower is None else lower) if at >= 0 else -1
    while found >= 0:
        after = found + len(anchor)
        matched = _common_prefix(tail, text, after)
        if matched == len(tail):
            return after + matched
        head = _header(prompt, matched - needed, specials) if matched >= needed else -1
        if head > 0 or (head == 0 and not prompt):  # the turn before it, then its header (or no prompt)
            return after + needed + head
        found = text.find(anchor, found + 1)
    own = render(list(messages[: k + 1]), False)
    start = own_start(prompted, own, prompt, messages[k], specials)
    past = dropped or bool(content) and _find(own[:start], content, 0)[0] >= 0  # past the message before it (or
    if start >= cursor and text.startswith(own[:start]) and past:  # that one is an empty last answer it drops)
        return start
    raise _unaligned(text, prompted, k, f"message {k - 1}" if anchor else "the messages before it")


def own_start(prompted: str, own: str, prompt: str, message: Mapping[str, Any], specials: re.Pattern[str]) -> int:
    """Where ``message``'s output starts in ``own``, the messages up to it rendered with it: where ``prompted`` (the
    messages before it with the generation prompt) and ``own`` part, back at the start of a special token they
    part in; past the generation ``prompt`` where ``own`` writes it next, before the message's own text.

    Example:
        >>> own_start("<u>Hi<e>\\n<a>", "<u>Hi\\n<e>\\n<a>Yes", "<a>", {"content": "Yes"}, NO_SPECIALS)
        13
    """
    at = len(os.path.commonprefix([prompted, own]))
    at = _token_start(own, at, specials)
    texts = _rendered_texts(message)
    first = _find(own, texts[0], at)[0] if texts else -1
    header = own.find(prompt, max(0, at - len(prompt) + 1)) if prompt else -1
    return header + len(prompt) if header >= 0 and (first < 0 or header + len(prompt) <= first) else at


def _header(prompt: str, matched: int, specials: re.Pattern[str]) -> int:
    """How much of a generation prompt the turn repeats only ``matched`` characters of is its header: its first
    line (through the newline), else its special tokens, as far as they are repeated.

    Example:
        >>> _header("<|im_start|>assistant\\n<think>\\n", 29, re.compile(re.escape("<|im_start|>")))
        22
    """
    if matched >= len(prompt):
        return len(prompt)
    line = prompt.find("\n") + 1
    if 0 < line <= matched:
        return line
    return max((m.end() for m in specials.finditer(prompt) if m.end() <= matched), default=0)


def _generation_prompt(messages: Sequence[dict[str, Any]], n: int, render: Render) -> str:
    """What the generation prompt adds to the rendering of ``messages[:n]`` (its assistant header)."""
    return render(list(messages[:n]), True)[len(render(list(messages[:n]), False)) :]


def _turn_start(text: str, messages: Sequence[dict[str, Any]], k: int, render: Render) -> int:
    before = render(list(messages[:k]), False) if k else ""
    if not text.startswith(before):
        raise _unaligned(text, before, k, "the messages before it")
    return len(before)


def _turn_end(
    text: str,
    start: int,
    bound: tuple[int, int],
    messages: Sequence[dict[str, Any]],
    k: int,
    render: Render,
    ends: Sequence[str],
) -> int:
    after = start
    for part in _parts(messages[k]):  # past its reasoning, content and tool calls (they may hold end-of-turn text)
        at, size = _find(text, part, after)
        if 0 <= at and at + size <= bound[0]:  # (a template may not render it)
            after = at + size
    if ends:
        rest = len(text.rstrip())  # "": the last answer's turn ends with the rendering (GLM writes no end)
        found = [(at, len(e)) for e in ends if (at := text.find(e, after) if e else rest) >= after]
        if not found:
            raise RowProblem(CHECK, f"message {k}: no end-of-turn token ({' or '.join(map(repr, ends))}) follows it")
        at, size = min(found)  # the first; of two at one place the shorter (never an EOS after the end of turn)
        if after > start and k and not visible_content(messages[k]):  # (gpt-oss: its empty final answer, header
            header = _generation_prompt(messages, k, render)  # and end, after its reasoning's end)
            if header and text.startswith(header, at + size):
                return _turn_end(text, at + size + len(header), bound, messages, k, render, ends)
        if at <= max(bound):
            return at + size
        if bound[1] >= 0:  # no end-of-turn token before the next message (GLM's <|assistant|>, <|system|>): ends there
            return trim_separator(text[: bound[0]], start)
        raise RowProblem(
            CHECK,
            f"message {k}: the end-of-turn token that follows it comes after message {k + 1}'s text (the template "
            "ends this turn otherwise, as some do a tool call's)",
        )
    alone = render(list(messages[: k + 1]), False)  # no end-of-turn token: the turn as the last one ends
    head = render(list(messages[:k]), messages[k]["role"] == ASSISTANT) if k else ""
    if not alone.startswith(head):
        raise _unaligned(text, head, k, "the messages before it")
    turn = alone[len(head) : trim_separator(alone, len(head))]
    if not text.startswith(turn, start):
        raise RowProblem(
            NOT_PREFIX,
            f"message {k}: the template renders it otherwise inside the conversation ({_show(text[start:])}) than "
            f"as its last message ({_show(turn)}), and writes no end-of-turn token to end it",
        )
    return start + len(turn)


def _as_json(text: str) -> str:
    """``text`` as a JSON string writes it, without the quotes."""
    return json.dumps(text, ensure_ascii=False)[1:-1]


def _find(text: str, part: str, start: int) -> tuple[int, int]:
    """Where ``part`` first is in ``text`` from ``start``, as written or in JSON (-1: nowhere), and its size there."""
    found = [(at, len(form)) for form in (part, _as_json(part)) if (at := text.find(form, start)) >= 0]
    return min(found, default=(-1, 0))


def _turn_bound(
    text: str,
    start: int,
    messages: Sequence[dict[str, Any]],
    k: int,
    render: Render,
    ends: Sequence[str],
    specials: re.Pattern[str],
) -> tuple[int, int]:
    """Where the turn of message ``k`` from ``start`` ends at the latest (a part found after it is not its own), and
    where the next message's first text is (its end-of-turn token comes before it): the next message's start; or,
    where the template renders that otherwise here, the first text of the messages following it or its first
    end-of-turn token, whichever is later (the turn may hold either), and -1."""
    if k + 1 < len(messages) and (found := _message_start(text, start, messages, k + 1, render, specials))[0] >= 0:
        return found
    end = min((at for e in ends if e and (at := text.find(e, start)) >= 0), default=-1)
    for message in messages[k + 1 :]:
        texts = _rendered_texts(message)
        if texts and (at := _find(text, texts[0], start)[0]) >= 0:
            return max(at, end), -1
    return len(text), -1


def _message_start(
    text: str, at: int, messages: Sequence[dict[str, Any]], j: int, render: Render, specials: re.Pattern[str]
) -> tuple[int, int]:
    """Where message ``j`` starts in ``text`` at or after ``at``, and where its first text is (-1: not found there):
    where the text the template writes for it after the messages before it, through its first text, is. That text
    starts where the messages up to it, rendered without and with it, part; where they render message ``j - 1``
    otherwise once it follows (Qwen3 drops its reasoning), where they part after its last text ``before`` writes."""
    texts = _rendered_texts(messages[j])
    try:
        before, upto = render(list(messages[:j]), False), render(list(messages[: j + 1]), False)
    except RowProblem:  # a template may not render a conversation that ends there (Llama 3.1: the system alone)
        return -1, -1
    first, size = _last(upto, texts[0], len(upto)) if texts else (-1, 0)  # its rendering is the last
    part = len(os.path.commonprefix([before, upto]))
    both = [  # the ends of the texts of message j - 1 both write after the parting, in each
        (sum(was), sum(now))
        for piece in _parts(messages[j - 1])
        if min(now := _last(upto, piece, first), was := _last(before, piece, len(before)))[0] >= part
    ]
    if both:
        here, there = max(both)  # its last text as ``before`` writes it
        part = there + len(os.path.commonprefix([before[here:], upto[there:first]]))
    part = _token_start(upto, part, specials)
    found = text.find(upto[part : first + size], at) if 0 <= part <= first else -1
    return found, found + first - part if found >= 0 else -1


def _token_start(text: str, at: int, specials: re.Pattern[str]) -> int:
    """``at``, or the start of the special token of ``text`` that ``at`` falls inside."""
    return next((m.start() for m in specials.finditer(text) if m.start() < at < m.end()), at)


def _last(text: str, part: str, end: int) -> tuple[int, int]:
    """Where ``part`` last is in ``text[:end]``, as written or in JSON (-1: nowhere), and its size there."""
    found = [(at, len(form)) for form in (part, _as_json(part)) if (at := text.rfind(form, 0, end)) >= 0]
    return max(found, default=(-1, 0))


def _parts(message: Mapping[str, Any]) -> list[str]:
    """The texts of a message a template writes as given, its reasoning first."""
    return [t for t in (reasoning_of(message), *_rendered_texts(message)) if t]


def _rendered_texts(message: Mapping[str, Any]) -> list[str]:
    """The texts of a message a template writes as given, in order: its content, then each tool call's name and
    the values of its arguments."""
    texts = [visible_content(message)]
    for call in message.get("tool_calls") or []:
        function = call.get("function", call) if isinstance(call, dict) else {}
        if not isinstance(function, dict):
            continue
        texts.append(name if isinstance(name := function.get("name"), str) else "")
        arguments = function.get("arguments")
        texts.extend(_strings(arguments) if not isinstance(arguments, str) else [arguments])
    return [t for t in texts if t]


def _strings(value: Any) -> list[str]:
    """The leaves of JSON arguments as a template writes them: strings as they are, the others as JSON."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return [json.dumps(value)]


def trim_separator(text: str, start: int) -> int:
    """``len(text)`` without trailing whitespace after ``start`` (the separator a turn ends with)."""
    return start + len(text[start:].rstrip())


def _common_prefix(tail: str, text: str, at: int) -> int:
    return len(os.path.commonprefix([tail, text[at : at + len(tail)]]))


def _unaligned(text: str, prompted: str, k: int, what: str) -> RowProblem:
    n = _common_prefix(prompted, text, 0)
    return RowProblem(
        NOT_PREFIX,
        f"message {k}: the template renders {what} otherwise alone than in the whole conversation, from character "
        f"{n}: {_show(prompted[n:])} alone against {_show(text[n:])}",
        k,
    )


def _show(text: str) -> str:
    return repr(text[:60] + "..." if len(text) > 60 else text)
