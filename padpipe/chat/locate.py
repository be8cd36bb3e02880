"""Each trained message's canonical span in one rendering, found in that rendering itself: templates that render
a conversation's turns otherwise when more follows (Qwen3, DeepSeek-R1, Mistral, Phi-3) included.

An answer's span starts where the model's own output starts (:func:`padpipe.chat.answer_start.output_start`) and
ends with the end-of-turn token that first follows its content; a message of another role turned on by its flag
spans its whole turn. The rules, with the templates that need each: docs/sft.md. Every span is checked
(:func:`check`); a row that fails is refused naming the message and the text, never given a wrong span.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

from padpipe.chat.answer_start import (
    NO_SPECIALS,
    Render,
    generation_prompt,
    output_start,
    show,
    token_start,
    unaligned,
)
from padpipe.chat.message_texts import ASSISTANT, find, last, parts, rendered_texts, visible_content
from padpipe.chat.rows import CHECK, NOT_PREFIX, RowProblem


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
    elif content and content not in span and find(text[:bound], content, start)[0] >= 0:  # (or may not render it)
        problem = "its span does not hold its content"
    if problem is not None:
        raise RowProblem(CHECK, f"message {k}: {problem}; the rendered text there is {show(span)}")


def _turn_start(text: str, messages: Sequence[dict[str, Any]], k: int, render: Render) -> int:
    before = render(list(messages[:k]), False) if k else ""
    if not text.startswith(before):
        raise unaligned(text, before, k, "the messages before it")
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
    for part in parts(messages[k]):  # past its reasoning, content and tool calls (they may hold end-of-turn text)
        at, size = find(text, part, after)
        if 0 <= at and at + size <= bound[0]:  # (a template may not render it)
            after = at + size
    if ends:
        rest = len(text.rstrip())  # "": the last answer's turn ends with the rendering (GLM writes no end)
        found = [(at, len(e)) for e in ends if (at := text.find(e, after) if e else rest) >= after]
        if not found:
            raise RowProblem(CHECK, f"message {k}: no end-of-turn token ({' or '.join(map(repr, ends))}) follows it")
        at, size = min(found)  # the first; of two at one place the shorter (never an EOS after the end of turn)
        if after > start and k and not visible_content(messages[k]):  # (gpt-oss: its empty final answer, header
            header = generation_prompt(messages, k, render)  # and end, after its reasoning's end)
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
        raise unaligned(text, head, k, "the messages before it")
    turn = alone[len(head) : trim_separator(alone, len(head))]
    if not text.startswith(turn, start):
        raise RowProblem(
            NOT_PREFIX,
            f"message {k}: the template renders it otherwise inside the conversation ({show(text[start:])}) than "
            f"as its last message ({show(turn)}), and writes no end-of-turn token to end it",
        )
    return start + len(turn)


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
        texts = rendered_texts(message)
        if texts and (at := find(text, texts[0], start)[0]) >= 0:
            return max(at, end), -1
    return len(text), -1


def _message_start(
    text: str, at: int, messages: Sequence[dict[str, Any]], j: int, render: Render, specials: re.Pattern[str]
) -> tuple[int, int]:
    """Where message ``j`` starts in ``text`` at or after ``at``, and where its first text is (-1: not found there):
    where the text the template writes for it after the messages before it, through its first text, is. That text
    starts where the messages up to it, rendered without and with it, part; where they render message ``j - 1``
    otherwise once it follows (Qwen3 drops its reasoning), where they part after its last text ``before`` writes."""
    texts = rendered_texts(messages[j])
    try:
        before, upto = render(list(messages[:j]), False), render(list(messages[: j + 1]), False)
    except RowProblem:  # a template may not render a conversation that ends there (Llama 3.1: the system alone)
        return -1, -1
    first, size = last(upto, texts[0], len(upto)) if texts else (-1, 0)  # its rendering is the last
    part = len(os.path.commonprefix([before, upto]))
    both = [  # the ends of the texts of message j - 1 both write after the parting, in each
        (sum(was), sum(now))
        for piece in parts(messages[j - 1])
        if min(now := last(upto, piece, first), was := last(before, piece, len(before)))[0] >= part
    ]
    if both:
        here, there = max(both)  # its last text as ``before`` writes it
        part = there + len(os.path.commonprefix([before[here:], upto[there:first]]))
    part = token_start(upto, part, specials)
    found = text.find(upto[part : first + size], at) if 0 <= part <= first else -1
    return found, found + first - part if found >= 0 else -1


def trim_separator(text: str, start: int) -> int:
    """``len(text)`` without trailing whitespace after ``start`` (the separator a turn ends with)."""
    return start + len(text[start:].rstrip())
