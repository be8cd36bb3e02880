"""A tokenizer's chat template, rendered exactly as ``tokenizer.apply_chat_template`` renders it, and what a
plain conversation shows of it (its generation prompt and its end-of-turn token).

:class:`ChatTemplate` renders with ``transformers``' own renderer (``render_jinja_template``, the function
``apply_chat_template`` calls) with the same inputs: the messages without their ``None`` values, the
tokenizer's named special tokens (``bos_token``, ``eos_token``, ...) overridden by the template arguments,
and the template ``get_chat_template`` picks (a tokenizer may hold a ``tool_use`` one). That is the one
place padpipe meets ``transformers``' chat code; ``tests/chat/test_template.py`` pins it against
``apply_chat_template``.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tokenizers import Tokenizer

from padpipe._optional import require
from padpipe.tokenizer.encoder import _from_path

GENERATION = re.compile(r"\{%-?\s*generation\s*-?%\}")
"""A ``{% generation %}`` marker, as ``transformers`` finds one."""
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
        ends: Every way an answer's turn ends: ``end_of_turn``; how an earlier answer's does where that differs
            (gpt-oss ends the last with ``<|return|>``, the others with ``<|end|>``; GLM-4 writes nothing after the
            last, ``""``, and the next turn's ``<|user|>`` after the others); and the tokens generation stops at
            (the tokenizer's EOS and its generation config's, as GLM-4's ``<|observation|>``, gpt-oss's
            ``<|call|>``): a turn with no end-of-turn token of its own ends with the stop token that follows it.
    """

    generation_prompt: str | None
    honours_generation_prompt: bool
    end_of_turn: str | None
    ends: tuple[str, ...] = ()


def load_chat_tokenizer(tokenizer: Any) -> Any:
    """The ``transformers`` fast tokenizer ``.chat()`` renders with: the object itself, or a pretrained folder loaded.

    Example:
        >>> load_chat_tokenizer(pp.examples.tokenizer())
        Traceback (most recent call last):
        ...
        TypeError: chat() needs a transformers tokenizer (it renders the chat template with the tokenizer's special tokens), but got a tokenizers.Tokenizer; wrap it: transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=...), or pass a pretrained folder.
    """  # noqa: E501
    if isinstance(tokenizer, (str, os.PathLike)):
        tokenizer = _from_path(tokenizer)
    if isinstance(tokenizer, Tokenizer):
        raise TypeError(
            "chat() needs a transformers tokenizer (it renders the chat template with the tokenizer's special "
            "tokens), but got a tokenizers.Tokenizer; wrap it: transformers.PreTrainedTokenizerFast("
            "tokenizer_object=tok, eos_token=...), or pass a pretrained folder."
        )
    if not hasattr(tokenizer, "apply_chat_template"):
        raise TypeError(
            "`tokenizer` must be a transformers tokenizer or a pretrained folder, "
            f"but is {type(tokenizer).__name__} instead."
        )
    if not isinstance(getattr(tokenizer, "backend_tokenizer", None), Tokenizer):
        raise TypeError(
            f"chat() needs a fast (Rust) tokenizer, but {type(tokenizer).__name__} is a slow (Python) one; "
            "load it with AutoTokenizer.from_pretrained(..., use_fast=True)."
        )
    return tokenizer


class ChatTemplate:
    """A tokenizer's chat template (or ``chat_template``), rendered as ``apply_chat_template(..., tokenize=False)``.

    Args:
        tokenizer: A ``transformers`` fast tokenizer or a pretrained folder.
        chat_template: A Jinja template (or the name of one of the tokenizer's) to use instead of its own.
        required: Whether having no template is an error at once (else :meth:`render` raises it).

    Raises:
        ValueError: When there is no template to use (and ``required``), or it fails on a plain
            ``[user, assistant]`` conversation.

    Example:
        >>> template = ChatTemplate(pp.examples.hf_tokenizer(), "{% for m in messages %}{{ m.content }} [SEP]{% endfor %}")
        >>> template.render([[{"role": "user", "content": "hi"}]])
        (['hi [SEP]'], None)
    """  # noqa: E501

    def __init__(self, tokenizer: Any, chat_template: str | None = None, *, required: bool = True) -> None:
        self.tokenizer = load_chat_tokenizer(tokenizer)
        if chat_template is not None and not isinstance(chat_template, str):
            raise TypeError(f"`chat_template` must be a Jinja template string, but is {chat_template!r} instead.")
        self._chosen = chat_template
        self._render = require("transformers.utils.chat_template_utils", "chat()").render_jinja_template
        self.special_tokens = _special_tokens(self.tokenizer)
        self.stop_tokens = stop_tokens(self.tokenizer)
        self._special_tokens_map = dict(self.tokenizer.special_tokens_map)  # what apply_chat_template passes
        self._templates: dict[bool, str] | None = None
        self.probe = Probe(None, True, None)
        if chat_template is None and not self.tokenizer.chat_template:
            if required:
                raise ValueError(self._missing())
            return
        self._templates = {
            False: self.tokenizer.get_chat_template(chat_template, None),
            True: self.tokenizer.get_chat_template(chat_template, []),
        }
        self.probe = self._probe()

    def marked(self, tools: bool = False) -> bool:
        """Whether the template (the ``tool_use`` one when ``tools``) has ``{% generation %}`` markers."""
        return self._templates is not None and bool(GENERATION.search(self._templates[tools]))

    def token_id(self, name: str) -> int | None:
        """The tokenizer's ``"pad_id"`` or ``"eos_id"`` (``None`` when it has no such token)."""
        return {"pad_id": self.tokenizer.pad_token_id, "eos_id": self.tokenizer.eos_token_id}[name]

    def render(
        self,
        conversations: Sequence[Sequence[Mapping[str, Any]]],
        *,
        tools: list | None = None,
        kwargs: Mapping[str, Any] | None = None,
        generation_prompt: bool = False,
        markers: bool = False,
    ) -> tuple[list[str], list[list[tuple[int, int]]] | None]:
        """Render conversations that share ``tools`` and template arguments ``kwargs``.

        Returns:
            The texts, and with ``markers`` the character spans each ``{% generation %}`` block
            wrote, per conversation (else ``None``). Whatever the template raises propagates.
        """
        if self._templates is None:
            raise ValueError(self._missing())
        template = self._templates[tools is not None]
        conversations = [[{k: v for k, v in m.items() if v is not None} for m in chat] for chat in conversations]
        texts, indices = self._render(
            conversations=conversations,
            tools=tools,
            documents=None,
            chat_template=template,
            return_assistant_tokens_mask=markers,
            add_generation_prompt=generation_prompt,
            **{**self._special_tokens_map, **(kwargs or {})},
        )
        return texts, indices if markers else None

    def fingerprint(self) -> str:
        """A digest of the templates and special tokens, checked on resume (with the tokenizer's own).

        Example:
            >>> ChatTemplate(pp.examples.hf_tokenizer(), "{{ messages[0].content }}").fingerprint()
            'template sha1=...'
        """
        text = repr((self._templates, sorted(self._special_tokens_map.items()), self.stop_tokens))
        return f"template sha1={hashlib.sha1(text.encode()).hexdigest()[:16]}"

    def _missing(self) -> str:
        return (
            f"chat() needs a chat template, but the tokenizer ({type(self.tokenizer).__name__}) has none and no "
            "`chat_template=` was given: pass chat_template= a Jinja template string."
        )

    def render_prefix(self, messages: list[dict[str, Any]], generation_prompt: bool, **options: Any) -> str:
        """``messages`` rendered (with ``render``'s ``options``) as the model sees them before its answer: for a
        template that ignores ``add_generation_prompt``, without the prompt it writes after every conversation,
        and with :attr:`Probe.generation_prompt` when ``generation_prompt``.

        Example:
            >>> template = ChatTemplate(pp.examples.chat_tokenizer(), "{% for m in messages %}<{{ m.role }}>"
            ...                         "{{ m.content }}{% endfor %}")
            >>> template.probe.generation_prompt, template.render_prefix([{"role": "user", "content": "Hi"}], True)
            ('<assistant>', '<user>Hi<assistant>')
        """
        text = self.render([messages], generation_prompt=generation_prompt, **options)[0][0]
        prompt = self.probe.generation_prompt or ""
        if self.probe.honours_generation_prompt:
            return text
        text = text[: len(text) - len(prompt)] if text.endswith(prompt) else text
        return text + prompt if generation_prompt else text

    def _probe(self) -> Probe:
        error: Exception | None = None
        for opening, tools in ((o, t) for t in PROBE_TOOLS for o in PROBE_OPENINGS):
            try:
                plain, prompted, whole = (
                    self.render([opening + chat], tools=tools, generation_prompt=prompt)[0][0]
                    for chat, prompt in (
                        ([PROBE_USER], False),
                        ([PROBE_USER], True),
                        ([PROBE_USER, PROBE_ANSWER], False),
                    )
                )
            except Exception as exc:  # a template is user code: anything may come out of it
                error = exc if error is None else error
                continue
            probe = self._read_probe(plain, prompted, whole)
            try:
                longer = self.render([opening + [PROBE_USER, PROBE_ANSWER, *PROBE_MORE]], tools=tools)[0][0]
            except Exception:  # a template may take one exchange only: the last answer's end is all there is
                longer = ""
            earlier = self._earlier_end(longer, probe.end_of_turn)
            last = probe.end_of_turn or ("" if earlier else None)  # "": the last answer ends the rendering (GLM)
            stops = (self._call_end(opening, probe), *self.stop_tokens) if last is not None else ()
            ends = tuple(dict.fromkeys(e for e in (last, earlier, *stops) if e is not None))
            return Probe(probe.generation_prompt, probe.honours_generation_prompt, probe.end_of_turn, ends)
        raise ValueError(
            "chat(): the chat template fails on a plain conversation (a user message and an answer): "
            f"{type(error).__name__}: {error}"
        )

    def _read_probe(self, plain: str, prompted: str, whole: str) -> Probe:
        honours = True
        if plain == prompted and not whole.startswith(plain):  # a prompt written whatever the flag (Command-R7B):
            at = len(plain) - len(os.path.commonprefix([plain[::-1], whole[::-1]]))  # what both end with,
            at = _token_boundary(plain, at, self.special_tokens)
            while (stop := next((t for t in self.stop_tokens if plain.startswith(t, at)), None)) is not None:
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
        return Probe(prompt, honours, self._specials_run(tail, None))

    def _call_end(self, opening: list[dict[str, Any]], probe: Probe) -> str | None:
        """The token a tool call's turn ends with: the special token its rendering ends with (gpt-oss's
        ``<|call|>``), or, where it ends with none of its own, the one the tool's turn opens with after it
        (GLM-4's ``<|observation|>``): the token the model stops at there."""
        try:
            alone, more = (
                self.render([opening + [PROBE_USER, *PROBE_CALL[:n]]], tools=[PROBE_TOOL])[0][0] for n in (1, 2)
            )
        except Exception:  # a template without tool calls
            return None
        prompt = probe.generation_prompt or ""
        if not probe.honours_generation_prompt and alone.endswith(prompt):  # the prompt it writes after any turn
            alone = alone[: len(alone) - len(prompt)]
        turn = alone[: len(os.path.commonprefix([alone, more]))].rstrip()
        own = [m for m in self.special_tokens.finditer(turn) if m.end() == len(turn)]
        if own:
            return own[0].group()
        following = self.special_tokens.search(more, len(turn))
        return following.group() if following and not more[len(turn) : following.start()].strip() else None

    def _earlier_end(self, text: str, last: str | None) -> str | None:
        """How the first answer of a two-exchange rendering ends: its first special token after the content, and
        those right after it that the last answer's end also has (Cohere2's two tokens, not the next header)."""
        at = text.find(PROBE_ANSWER["content"])
        return self._specials_run(text[at + len(PROBE_ANSWER["content"]) :], last or "") if at >= 0 else None

    def _specials_run(self, tail: str, within: str | None) -> str | None:
        """The special tokens at the start of ``tail`` (after whitespace), one right after another up to a stop token
        (nothing the model writes follows it); with ``within``, only as long as they begin it (``""``: the first)."""
        first = self.special_tokens.search(tail)
        if first is None or tail[: first.start()].strip():
            return None
        end, token = first.end(), first.group()
        while token not in self.stop_tokens and (more := self.special_tokens.match(tail, end)) is not None:
            if within is not None and not within.startswith(tail[first.start() : more.end()]):
                break
            end, token = more.end(), more.group()
        return tail[first.start() : end]

    def __repr__(self) -> str:
        return f"ChatTemplate({type(self.tokenizer).__name__}, chat_template={'given' if self._chosen else 'own'})"


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


def _special_tokens(tokenizer: Any) -> re.Pattern[str]:
    """A pattern matching the text of the tokenizer's special added tokens (never matches when it has none or
    when ``split_special_tokens`` makes them text)."""
    names = (
        []
        if getattr(tokenizer, "split_special_tokens", False)
        else [token.content for token in tokenizer.added_tokens_decoder.values() if token.special]
    )
    names = sorted(set(names), key=len, reverse=True)
    return re.compile("|".join(map(re.escape, names)) if names else r"(?!)")
