"""Where the model's own output for an answer starts in a conversation's rendering: after the generation prompt the
messages before it end with, as far as the rendering repeats it (:func:`output_start`)."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from padpipe.chat.message_texts import ASSISTANT, as_json, find, rendered_texts, visible_content
from padpipe.chat.rows import NOT_PREFIX, RowProblem

NO_SPECIALS = re.compile(r"(?!)")
"""A pattern that matches nothing: a tokenizer without special tokens."""
Render = Callable[[list[dict[str, Any]], bool], str]
"""``render(messages, generation_prompt)``: a prefix of the conversation rendered with the row's tools and
arguments."""


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
        prompted = plain + generation_prompt(messages, asked, render)
    if text.startswith(prompted) and len(prompted) >= cursor:
        return len(prompted)
    prompt = prompted[len(plain) :] if prompted.startswith(plain) else prompted
    dropped = k > asked and plain == render(list(messages[: k - 1]), False)  # an empty last answer it drops (Nemotron)
    if prompt and text.startswith(plain) and len(plain) >= cursor and not dropped:  # the messages before, alike
        return len(plain) + _header(prompt, common_prefix(prompt, text, len(plain)), specials)
    content = visible_content(messages[k - 1]) if k > 0 else ""
    forms = [a for a in (content, as_json(content)) if a and a in prompted]  # as written, or in JSON: its last
    anchor = max(forms, key=prompted.rfind, default="")  # place (an earlier message may hold it the other way)
    at = prompted.rfind(anchor) if anchor else -1
    tail = prompted[at + len(anchor) :]  # the previous turn's end, then the generation prompt
    needed = len(tail) - len(prompt)  # the previous turn's end must be there whole
    found = text.find(anchor, cursor if lower is None else lower) if at >= 0 else -1
    while found >= 0:
        after = found + len(anchor)
        matched = common_prefix(tail, text, after)
        if matched == len(tail):
            return after + matched
        head = _header(prompt, matched - needed, specials) if matched >= needed else -1
        if head > 0 or (head == 0 and not prompt):  # the turn before it, then its header (or no prompt)
            return after + needed + head
        found = text.find(anchor, found + 1)
    own = render(list(messages[: k + 1]), False)
    start = own_start(prompted, own, prompt, messages[k], specials)
    past = dropped or bool(content) and find(own[:start], content, 0)[0] >= 0  # past the message before it (or
    if start >= cursor and text.startswith(own[:start]) and past:  # that one is an empty last answer it drops)
        return start
    raise unaligned(text, prompted, k, f"message {k - 1}" if anchor else "the messages before it")


def own_start(prompted: str, own: str, prompt: str, message: Mapping[str, Any], specials: re.Pattern[str]) -> int:
    """Where ``message``'s output starts in ``own``, the messages up to it rendered with it: where ``prompted`` (the
    messages before it with the generation prompt) and ``own`` part, back at the start of a special token they
    part in; past the generation ``prompt`` where ``own`` writes it next, before the message's own text.

    Example:
        >>> own_start("<u>Hi<e>\\n<a>", "<u>Hi\\n<e>\\n<a>Yes", "<a>", {"content": "Yes"}, NO_SPECIALS)
        13
    """
    at = len(os.path.commonprefix([prompted, own]))
    at = token_start(own, at, specials)
    texts = rendered_texts(message)
    first = find(own, texts[0], at)[0] if texts else -1
    header = own.find(prompt, max(0, at - len(prompt) + 1)) if prompt else -1
    return header + len(prompt) if header >= 0 and (first < 0 or header + len(prompt) <= first) else at


def generation_prompt(messages: Sequence[dict[str, Any]], n: int, render: Render) -> str:
    """What the generation prompt adds to the rendering of ``messages[:n]`` (its assistant header).

    Example:
        >>> generation_prompt([{"role": "user", "content": "Hi"}], 1, lambda ms, prompt: "<u>Hi" + "<a>" * prompt)
        '<a>'
    """
    return render(list(messages[:n]), True)[len(render(list(messages[:n]), False)) :]


def token_start(text: str, at: int, specials: re.Pattern[str]) -> int:
    """``at``, or the start of the special token of ``text`` that ``at`` falls inside.

    Example:
        >>> token_start("ab<|end|>", 5, re.compile(re.escape("<|end|>")))
        2
    """
    return next((m.start() for m in specials.finditer(text) if m.start() < at < m.end()), at)


def common_prefix(tail: str, text: str, at: int) -> int:
    """How many characters of ``tail`` ``text`` writes from ``at``.

    Example:
        >>> common_prefix("<a>\\n", "Hi<a>Yes", 2)
        3
    """
    return len(os.path.commonprefix([tail, text[at : at + len(tail)]]))


def unaligned(text: str, prompted: str, k: int, what: str) -> RowProblem:
    """The problem of a row whose rendering does not start with ``prompted``, the messages before message ``k``.

    Example:
        >>> unaligned("<u>Hi<a>", "<u>Ho", 1, "the messages before it").reason
        'not_prefix'
    """
    n = common_prefix(prompted, text, 0)
    return RowProblem(
        NOT_PREFIX,
        f"message {k}: the template renders {what} otherwise alone than in the whole conversation, from character "
        f"{n}: {show(prompted[n:])} alone against {show(text[n:])}",
        k,
    )


def show(text: str) -> str:
    """``text`` quoted for a message, cut at 60 characters.

    Example:
        >>> show("ab" * 40)[-8:], show("ab")
        ("abab...'", "'ab'")
    """
    return repr(text[:60] + "..." if len(text) > 60 else text)


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
