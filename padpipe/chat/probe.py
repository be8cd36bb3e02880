"""What a chat template shows on a probe conversation (:func:`read_probe`): the generation prompt an answer
follows, and every way a turn ends, with the tokens generation stops at (:func:`stop_tokens`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from padpipe._optional import require

PROBE_USER = {"role": "user", "content": "Hi"}
PROBE_ANSWER = {"role": "assistant", "content": "Hello"}
PROBE_MORE = [{"role": "user", "content": "Again"}, {"role": "assistant", "content": "Bye"}]
"""A second exchange: how an answer that is not the last one ends (gpt-oss: ``<|end|>``, the last ``<|return|>``)."""
PROBE_OPENINGS: tuple[list[dict[str, str]], ...] = ([], [{"role": "system", "content": "Be brief."}])
"""What the probe conversation opens with: some templates need a system message."""
PROBE_TOOL = {
    "type": "function",
    "function": {
        "name": "f",
        "description": "F.",
        "parameters": {"type": "object", "properties": {"x": {"type": "string", "description": "X."}}},
    },
}
PROBE_TOOLS: tuple[list[dict[str, Any]] | None, ...] = (None, [PROBE_TOOL])
"""The tools the probe renders with: none, or one (a template may need them: Hermes-3's ``tool_use``)."""
PROBE_CALL: list[dict[str, Any]] = [
    {
        "role": "assistant",
        "tool_calls": [{"id": "abcdefghi", "type": "function", "function": {"name": "f", "arguments": {"x": "1"}}}],
    },
    {"role": "tool", "tool_call_id": "abcdefghi", "name": "f", "content": "2"},
]
"""A tool call and its result: how a call's turn ends (gpt-oss: ``<|call|>``; GLM-4: the next ``<|observation|>``)."""


ProbeRender = Callable[[list[dict[str, Any]], Any, bool], str]
"""``render(chat, tools, generation_prompt)``: one conversation rendered."""


@dataclass(frozen=True)
class Probe:
    """What rendering ``[user, assistant]`` shows of a template.

    Attributes:
        generation_prompt: The text the model's answer follows: what ``add_generation_prompt=True`` adds
            (``""``: none, as Mistral's ``[INST]`` templates), or ``None`` when the rendering with it does not
            extend the one without. For a template that ignores ``add_generation_prompt``, what the answer's turn
            opens with that the messages before it do not show: the prompt it writes after every conversation
            (Command-R7B's ``<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>...``), or the header it writes only for an
            answer (a template that writes no prompt).
        honours_generation_prompt: ``False`` for a template that ignores ``add_generation_prompt``.
        end_of_turn: The special tokens the template writes right after the last answer's content, one after
            another (``<|im_end|>``, ``<|eot_id|>``, Phi-3's ``<|end|>``, not the ``<|endoftext|>`` it writes
            after a newline; Cohere2's ``<|END_RESPONSE|><|END_OF_TURN_TOKEN|>``), or ``None`` when it writes
            none there.
        ends: Every way an answer's turn ends: ``end_of_turn``, how an earlier answer's and a tool call's do where
            that differs, and the tokens generation stops at (per template: docs/sft.md, "Where it ends").
    """

    generation_prompt: str | None
    honours_generation_prompt: bool
    end_of_turn: str | None
    ends: tuple[str, ...] = ()


def read_probe(render: ProbeRender, specials: re.Pattern[str], stops: tuple[str, ...]) -> Probe:
    """What a template shows on a probe conversation (``render(chat, tools, generation_prompt)``), given the
    tokenizer's special tokens and the tokens generation stops at.

    Raises:
        ValueError: When it fails on a plain conversation (a user message and an answer), with or without tools.

    Example:
        >>> render = lambda chat, tools, prompt: "".join(f"<{m['role']}>{m.get('content')}<end>" for m in chat) + (
        ...     "<assistant>" if prompt else "")
        >>> read_probe(render, re.compile("<end>"), ("<end>",))
        Probe(generation_prompt='<assistant>', honours_generation_prompt=True, end_of_turn='<end>', ends=('<end>',))
    """
    error: Exception | None = None
    for opening, tools in ((o, t) for t in PROBE_TOOLS for o in PROBE_OPENINGS):
        try:
            plain = render(opening + [PROBE_USER], tools, False)
            prompted = render(opening + [PROBE_USER], tools, True)
            whole = render(opening + [PROBE_USER, PROBE_ANSWER], tools, False)
        except Exception as exc:  # a template is user code: anything may come out of it
            error = exc if error is None else error
            continue
        probe = _read_probe(plain, prompted, whole, specials, stops)
        try:
            longer = render(opening + [PROBE_USER, PROBE_ANSWER, *PROBE_MORE], tools, False)
        except Exception:  # a template may take one exchange only: the last answer's end is all there is
            longer = ""
        earlier = _earlier_end(longer, probe.end_of_turn, specials, stops)
        last = probe.end_of_turn or ("" if earlier else None)  # "": the last answer ends the rendering (GLM)
        ending = (_call_end(render, opening, probe, specials), *stops) if last is not None else ()
        ends = tuple(dict.fromkeys(e for e in (last, earlier, *ending) if e is not None))
        return Probe(probe.generation_prompt, probe.honours_generation_prompt, probe.end_of_turn, ends)
    raise ValueError(
        "chat(): the chat template fails on a plain conversation (a user message and an answer): "
        f"{type(error).__name__}: {error}"
    )


def _read_probe(plain: str, prompted: str, whole: str, specials: re.Pattern[str], stops: tuple[str, ...]) -> Probe:
    honours = True
    if plain == prompted and not whole.startswith(plain):  # a prompt written whatever the flag (Command-R7B):
        at = len(plain) - len(os.path.commonprefix([plain[::-1], whole[::-1]]))  # what both end with,
        at = _token_boundary(plain, at, specials)
        while (stop := next((t for t in stops if plain.startswith(t, at)), None)) is not None:
            at += len(stop)  # less the end of the turn before it
        whole, plain, honours = whole[: len(whole) - len(plain) + at], plain[:at], False
    prompt = prompted[len(plain) :] if prompted.startswith(plain) else None
    if whole.startswith(prompted):
        turn = whole[len(prompted) :]
    elif prompt is not None and whole.startswith(plain):  # the answer repeats only part of the prompt
        turn = whole[len(plain) + len(os.path.commonprefix([prompt, whole[len(plain) :]])) :]
    else:
        return Probe(prompt, True, None)
    at = turn.find(PROBE_ANSWER["content"])
    if prompt == "" and at > 0 and turn[:at].strip():  # no prompt, though an answer opens with a header
        prompt, honours = turn[:at], False
    tail = turn[at + len(PROBE_ANSWER["content"]) :] if at >= 0 else ""
    return Probe(prompt, honours, _specials_run(tail, None, specials, stops))


def _call_end(
    render: ProbeRender, opening: list[dict[str, Any]], probe: Probe, specials: re.Pattern[str]
) -> str | None:
    """The token a tool call's turn ends with: the special token its rendering ends with (gpt-oss's
    ``<|call|>``), or, where it ends with none of its own, the one the tool's turn opens with after it
    (GLM-4's ``<|observation|>``): the token the model stops at there."""
    try:
        alone, more = (render(opening + [PROBE_USER, *PROBE_CALL[:n]], [PROBE_TOOL], False) for n in (1, 2))
    except Exception:  # a template without tool calls
        return None
    prompt = probe.generation_prompt or ""
    if not probe.honours_generation_prompt and alone.endswith(prompt):  # the prompt it writes after any turn
        alone = alone[: len(alone) - len(prompt)]
    turn = alone[: len(os.path.commonprefix([alone, more]))].rstrip()
    own = [m for m in specials.finditer(turn) if m.end() == len(turn)]
    if own:
        return own[0].group()
    following = specials.search(more, len(turn))
    return following.group() if following and not more[len(turn) : following.start()].strip() else None


def _earlier_end(text: str, last: str | None, specials: re.Pattern[str], stops: tuple[str, ...]) -> str | None:
    """How the first answer of a two-exchange rendering ends: its first special token after the content, and
    those right after it that the last answer's end also has (Cohere2's two tokens, not the next header)."""
    at = text.find(PROBE_ANSWER["content"])
    tail = text[at + len(PROBE_ANSWER["content"]) :]
    return _specials_run(tail, last or "", specials, stops) if at >= 0 else None


def _specials_run(tail: str, within: str | None, specials: re.Pattern[str], stops: tuple[str, ...]) -> str | None:
    """The special tokens at the start of ``tail`` (after whitespace), one right after another up to a stop token
    (nothing the model writes follows it); with ``within``, only as long as they begin it (``""``: the first)."""
    first = specials.search(tail)
    if first is None or tail[: first.start()].strip():
        return None
    end, token = first.end(), first.group()
    while token not in stops and (more := specials.match(tail, end)) is not None:
        if within is not None and not within.startswith(tail[first.start() : more.end()]):
            break
        end, token = more.end(), more.group()
    return tail[first.start() : end]


def stop_tokens(tokenizer: Any) -> tuple[str, ...]:
    """The tokens generation stops at: the tokenizer's EOS, and the ``eos_token_id`` of the ``generation_config.json``
    of its folder or of its Hub model in the local cache (never fetched).

    Example:
        >>> stop_tokens(pp.examples.chat_tokenizer())
        ('<|endoftext|>',)
    """
    ids: Any = []
    if getattr(tokenizer, "name_or_path", ""):
        generation = require("transformers", "chat()").GenerationConfig
        try:
            ids = generation.from_pretrained(tokenizer.name_or_path, local_files_only=True).eos_token_id
        except (OSError, ValueError):  # no generation config there: the EOS alone
            pass
    ids = [ids] if isinstance(ids, int) else list(ids or [])
    return tuple(dict.fromkeys(t for t in (tokenizer.eos_token, *tokenizer.convert_ids_to_tokens(ids)) if t))


def _token_boundary(text: str, at: int, specials: re.Pattern[str]) -> int:
    """``at``, or the end of the special token of ``text`` that ``at`` falls inside."""
    return next((m.end() for m in specials.finditer(text) if m.start() < at < m.end()), at)
