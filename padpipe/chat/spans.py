"""Each trained message's canonical span in a rendered conversation, with any template.

The canonical span of an answer is the text the template writes for it after its header (after the
generation prompt) through its end-of-turn token, never the separator written after that token; a message
of another role (trained by its flag) spans its whole turn, header included. It comes from ``{% generation
%}`` markers (:func:`normalise`) or is found in the rendering itself (:mod:`padpipe.chat.locate`); the
rules, and the templates they were tried on: docs/sft.md.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from padpipe.chat.answer_start import Render, output_start
from padpipe.chat.locate import locate
from padpipe.chat.message_texts import ASSISTANT
from padpipe.chat.rows import BAD, TEMPLATE, RowProblem
from padpipe.chat.template import ChatTemplate, Probe

TRAIN_ON = ("assistant", "last", "all")


def chosen(messages: Sequence[Mapping[str, Any]], train_on: str, flag: str | None) -> tuple[list[int], list[int]]:
    """``(trained, untrained)``: the messages whose spans are trained, and (``train_on="all"``) those that are not.

    ``"assistant"``: every answer; ``"last"``: the last answer; ``"all"``: everything. A message's
    ``flag`` (``True``/``False``) turns it on or off whatever the mode; any other value than a bool or
    ``None`` is a :class:`RowProblem` (``"false"`` and ``0`` are not read as false).

    Example:
        >>> chat = [{"role": "user"}, {"role": "assistant"}, {"role": "user", "training": True}, {"role": "assistant"}]
        >>> chosen(chat, "last", "training"), chosen(chat, "all", "training")
        (([2, 3], []), ([], []))
    """  # noqa: E501
    answers = [k for k, m in enumerate(messages) if m["role"] == ASSISTANT]
    base = set(answers if train_on == "assistant" else answers[-1:] if train_on == "last" else [])
    flags = {k: m.get(flag) for k, m in enumerate(messages)} if flag is not None else {}
    for k, value in flags.items():
        if value is not None and not isinstance(value, bool):
            raise RowProblem(BAD, f"message {k}'s {flag!r} is {value!r}; expected true, false or null")
    if train_on == "all":
        return [], [k for k, value in flags.items() if value is False]
    on = base | {k for k, value in flags.items() if value is True}
    return sorted(k for k in on if flags.get(k) is not False), []


def message_spans(
    template: ChatTemplate,
    messages: list[dict[str, Any]],
    indices: Sequence[int],
    *,
    full: str,
    blocks: list[tuple[int, int]] | None,
    tools: list | None,
    kwargs: Mapping[str, Any],
) -> list[tuple[int, int]]:
    """The canonical character spans of ``messages[indices]`` in ``full`` (the whole conversation's text).

    ``blocks``: the ``{% generation %}`` spans of ``full``, used when there is one per answer.
    """
    answers = [k for k, m in enumerate(messages) if m["role"] == ASSISTANT]
    marked = dict(zip(answers, blocks)) if blocks is not None and len(blocks) == len(answers) else {}
    spans = {k: normalise(full, *marked[k], template.probe, template.special_tokens) for k in indices if k in marked}
    rest = [k for k in indices if k not in marked]
    if rest:
        render = _prefixes(template, messages, tools, kwargs)
        spans.update(zip(rest, locate(full, messages, rest, render, template.probe.ends, template.special_tokens)))
    return [spans[k] for k in indices]


def completion_span(
    template: ChatTemplate,
    prompt: list[dict[str, Any]],
    completion: list[dict[str, Any]],
    full: str,
    tools: list | None,
    kwargs: Mapping[str, Any],
) -> tuple[int, int]:
    """The span of a prompt's completion in ``full``: from where the model's output starts after the prompt
    (as an answer's, :func:`padpipe.chat.answer_start.output_start`) through the last end-of-turn token (the final
    separator, and an EOS the template writes after that token, left out)."""
    messages = prompt + completion
    render = _prefixes(template, messages, tools, kwargs)
    start = output_start(full, 0, messages, len(prompt), render, specials=template.special_tokens)
    eot = template.probe.end_of_turn
    end = full.rfind(eot) + len(eot) if eot else -1
    return start, end if end > start else trim_end(full, start, len(full), template.special_tokens)


def normalise(full: str, start: int, end: int, probe: Probe, specials: re.Pattern[str]) -> tuple[int, int]:
    """A ``{% generation %}`` block ``full[start:end]`` moved to the canonical span: its start past the generation
    prompt where the block holds part of it (TRL's Qwen2.5 training template opens the block before the header's
    newline; its DeepSeek-R1 one holds the ``<｜Assistant｜>`` header), its end back to the last special token where
    only whitespace follows it (a separator inside the block), or on through the end-of-turn token where the block
    holds the content only.

    Example:
        >>> specials = re.compile(re.escape("<|im_end|>"))
        >>> text = "<|im_start|>assistant\\nHello<|im_end|>\\n"
        >>> probe = Probe("<|im_start|>assistant\\n", True, "<|im_end|>")
        >>> s, e = normalise(text, 21, len(text), probe, specials)
        >>> text[s:e]
        'Hello<|im_end|>'
    """
    start = _after_prompt(full, start, end, probe.generation_prompt or "", specials)
    eot = probe.end_of_turn
    if eot and specials.search(full, start, end) is None and full.startswith(eot, end):
        return start, end + len(eot)
    return start, trim_end(full, start, end, specials)


def trim_end(text: str, start: int, end: int, specials: re.Pattern[str]) -> int:
    """``end``, or the end of the last special token in ``text[start:end]`` when only whitespace follows it.

    Example:
        >>> trim_end("Hi<|im_end|>\\n", 0, 13, re.compile(re.escape("<|im_end|>")))
        12
    """
    stop = None
    for match in specials.finditer(text, start, end):
        stop = match.end()
    return stop if stop is not None and not text[stop:end].strip() else end


def _after_prompt(full: str, start: int, end: int, prompt: str, specials: re.Pattern[str]) -> int:
    """``start`` moved past the generation prompt's end inside the block ``full[start:end]``; where the block
    repeats only the prompt's first special tokens (DeepSeek-R1's ``<｜Assistant｜>`` without ``<think>\\n``),
    past those."""
    heads = [prompt] + [prompt[: m.end()] for m in reversed(list(specials.finditer(prompt))) if m.end() < len(prompt)]
    for head in filter(None, heads):
        for shift in range(len(head) + 1):  # the head's end inside the block: the span starts there
            at = start + shift - len(head)
            if start + shift > end:
                break
            if at >= 0 and full.startswith(head, at):
                return start + shift
    return start


def _prefixes(
    template: ChatTemplate, messages: list[dict[str, Any]], tools: list | None, kwargs: Mapping[str, Any]
) -> Render:
    """Render prefixes of ``messages`` as the model sees them before an answer (each at most once per row)."""
    seen: dict[tuple[int, bool], str] = {}

    def render(prefix: list[dict[str, Any]], generation_prompt: bool) -> str:
        key = (len(prefix), generation_prompt)
        if key not in seen:
            try:
                seen[key] = template.render_prefix(prefix, generation_prompt, tools=tools, kwargs=kwargs)
            except Exception as exc:  # a template is user code: anything may come out of it
                raise RowProblem(TEMPLATE, f"the chat template raised {type(exc).__name__}: {exc}") from exc
        return seen[key]

    return render
