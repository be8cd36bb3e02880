"""A tokenizer's chat template, rendered exactly as ``tokenizer.apply_chat_template`` renders it (what a probe
conversation shows of it: :mod:`padpipe.chat.probe`).

:class:`ChatTemplate` calls ``transformers``' own renderer (``render_jinja_template``, what ``apply_chat_template``
calls) with the same inputs: the messages without their ``None`` values, the tokenizer's named special tokens
overridden by the template arguments, and the template ``get_chat_template`` picks. That is the one place padpipe
meets ``transformers``' chat code; ``tests/chat/test_template.py`` pins it against ``apply_chat_template``.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

from tokenizers import Tokenizer

from padpipe._optional import require
from padpipe.chat.probe import Probe, read_probe, stop_tokens
from padpipe.tokenizer.encoder import _from_path

GENERATION = re.compile(r"\{%-?\s*generation\s*-?%\}")
"""A ``{% generation %}`` marker, as ``transformers`` finds one."""


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
        self.probe = read_probe(self._render_one, self.special_tokens, self.stop_tokens)

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

    def _render_one(self, chat: list[dict[str, Any]], tools: list | None, generation_prompt: bool) -> str:
        return self.render([chat], tools=tools, generation_prompt=generation_prompt)[0][0]

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

    def __repr__(self) -> str:
        return f"ChatTemplate({type(self.tokenizer).__name__}, chat_template={'given' if self._chosen else 'own'})"


def _special_tokens(tokenizer: Any) -> re.Pattern[str]:
    """A pattern matching the text of the tokenizer's special added tokens (never matches when it has none or
    when ``split_special_tokens`` makes them text)."""
    added = [] if getattr(tokenizer, "split_special_tokens", False) else tokenizer.added_tokens_decoder.values()
    names = sorted({token.content for token in added if token.special}, key=len, reverse=True)
    return re.compile("|".join(map(re.escape, names)) if names else r"(?!)")
