"""Each trained message's canonical span in a rendered conversation, with any template.

The canonical span of an answer is the text the template writes for it after its header (after the
generation prompt) through its end-of-turn token, never the separator written after that token. A
message of another role (trained by its flag) spans its whole turn, header included (there is no
generation prompt to end its header), through its end-of-turn token.

Two ways to find it, both ending in that span:

- **Markers.** A template with ``{% generation %}`` blocks gives each answer's text; the block is
  moved to the canonical span: its start past the generation prompt when the block holds part of it
  (TRL's Qwen2.5 training template opens the block before the header's newline), its end back to the
  last special token when only whitespace follows it there (a separator inside the block), or on
  through the end-of-turn token when the block holds the content only.
- **Prefixes.** Otherwise, for message ``k``: the conversation up to it rendered with the generation
  prompt (``P``) and the conversation through it (``F``); the span starts at ``len(P)`` and ends
  after ``F``'s last special token. Every row is checked: ``P`` must start the whole conversation's
  text and the span's text must be there as in ``F``; a template that renders earlier turns
  otherwise in a longer conversation (Qwen3 drops the ``<think>`` block of earlier answers) fails
  the check, and the row is refused (:class:`~padpipe.chat.rows.RowProblem`), never given a wrong span.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from padpipe.chat.rows import NOT_PREFIX, TEMPLATE, RowProblem
from padpipe.chat.template import ChatTemplate, Probe

ASSISTANT = "assistant"
TRAIN_ON = ("assistant", "last", "all")


def chosen(messages: Sequence[Mapping[str, Any]], train_on: str, flag: str | None) -> tuple[list[int], list[int]]:
    """``(trained, untrained)``: the messages whose spans are trained, and (``train_on="all"``) those that are not.

    ``"assistant"``: every answer; ``"last"``: the last answer; ``"all"``: everything. A message's
    ``flag`` (``True``/``False``) turns it on or off whatever the mode.

    Example:
        >>> chat = [{"role": "user"}, {"role": "assistant"}, {"role": "user", "training": True}, {"role": "assistant"}]
        >>> chosen(chat, "last", "training"), chosen(chat, "all", "training")
        (([2, 3], []), ([], []))
    """  # noqa: E501
    answers = [k for k, m in enumerate(messages) if m["role"] == ASSISTANT]
    base = set(answers if train_on == "assistant" else answers[-1:] if train_on == "last" else [])
    flags = {k: m.get(flag) for k, m in enumerate(messages)} if flag is not None else {}
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
        spans.update(zip(rest, _prefix_spans(template, messages, rest, full, tools, kwargs)))
    return [spans[k] for k in indices]


def completion_span(
    template: ChatTemplate, prompt: list[dict[str, Any]], full: str, tools: list | None, kwargs: Mapping[str, Any]
) -> tuple[int, int]:
    """The span of a prompt's completion in ``full``: after the prompt's generation prompt, through the last
    end-of-turn token (the final separator left out)."""
    head = _render(template, [prompt], tools, kwargs, generation_prompt=True)[0]
    if not full.startswith(head):
        raise RowProblem(
            NOT_PREFIX,
            "the prompt rendered with the generation prompt does not start the prompt and completion's text, "
            "so where the completion starts is unknown",
        )
    return len(head), trim_end(full, len(head), len(full), template.special_tokens)


def normalise(full: str, start: int, end: int, probe: Probe, specials: re.Pattern[str]) -> tuple[int, int]:
    """A ``{% generation %}`` block ``full[start:end]`` moved to the canonical span (see the module's docstring).

    Example:
        >>> specials = re.compile(re.escape("<|im_end|>"))
        >>> text = "<|im_start|>assistant\\nHello<|im_end|>\\n"
        >>> probe = Probe("<|im_start|>assistant\\n", True, "<|im_end|>")
        >>> s, e = normalise(text, 21, len(text), probe, specials)
        >>> text[s:e]
        'Hello<|im_end|>'
    """
    prompt = probe.generation_prompt or ""
    for shift in range(len(prompt) + 1 if prompt else 0):  # the prompt's end inside the block: the span starts there
        at = start + shift - len(prompt)
        if start + shift > end:
            break
        if at >= 0 and full.startswith(prompt, at):
            start += shift
            break
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


def _prefix_spans(
    template: ChatTemplate,
    messages: list[dict[str, Any]],
    indices: list[int],
    full: str,
    tools: list | None,
    kwargs: Mapping[str, Any],
) -> list[tuple[int, int]]:
    answers = [k for k in indices if messages[k]["role"] == ASSISTANT]
    if answers and not template.probe.honours_generation_prompt:
        raise RowProblem(
            TEMPLATE,
            "the chat template ignores add_generation_prompt and does not mark every answer with {% generation %}, "
            "so where an answer's header ends is unknown",
        )
    heads = dict(zip(answers, _render(template, [messages[:k] for k in answers], tools, kwargs, True)))
    others = [k for k in indices if k not in heads and k > 0]
    heads.update(zip(others, _render(template, [messages[:k] for k in others], tools, kwargs, False)))
    ends = [k for k in indices if k < len(messages) - 1]
    turns = dict(zip(ends, _render(template, [messages[: k + 1] for k in ends], tools, kwargs, False)))
    spans = []
    for k in indices:
        head, turn = heads.get(k, ""), turns.get(k, full)
        if not full.startswith(head) or not turn.startswith(head):
            raise RowProblem(
                NOT_PREFIX,
                f"the chat template renders the messages before message {k} otherwise alone than followed by "
                f"more, so the span of message {k} cannot be found by rendering prefixes",
            )
        end = trim_end(turn, len(head), len(turn), template.special_tokens)
        if not full.startswith(turn[len(head) : end], len(head)):
            raise RowProblem(
                NOT_PREFIX,
                f"the chat template renders message {k} otherwise inside the conversation than as its last message, "
                f"so its span cannot be found by rendering prefixes",
            )
        spans.append((len(head), end))
    return spans


def _render(
    template: ChatTemplate,
    conversations: list[list[dict[str, Any]]],
    tools: list | None,
    kwargs: Mapping[str, Any],
    generation_prompt: bool,
) -> list[str]:
    if not conversations:
        return []
    try:
        return template.render(conversations, tools=tools, kwargs=kwargs, generation_prompt=generation_prompt)[0]
    except Exception as exc:  # a template is user code: anything may come out of it
        raise RowProblem(TEMPLATE, f"the chat template raised {type(exc).__name__}: {exc}") from exc
