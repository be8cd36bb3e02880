"""The chat templates of the models users fine-tune, with tokenizers that carry their special tokens, conversations
each template accepts (system messages, several turns, reasoning, tool calls), and a reference labelling that
knows each template's own header and end-of-turn strings.

- The originals come from TRL's package (``trl/chat_templates/*.jinja``, byte-identical to the models' own);
  Mistral-7B-Instruct-v0.3, Phi-4 and SmolLM2 ship theirs in their tokenizer configs and are written here.
- A template's tokenizer is the chat fixtures' byte-level BPE with the model's control tokens added as special
  tokens (ids come from the template; the vocabulary only has to hold its control tokens).
- :func:`reference_spans`: for a rendered row, each answer's canonical characters, by the rule of
  ``shared/notes/templates-2026.md``: from the end of the assistant header before it to the end of the first
  end-of-turn token after it.
"""

from __future__ import annotations

import functools
import os
import random
import re
from dataclasses import dataclass
from typing import Any

import pytest
from tokenizers import Tokenizer

from tests import chat_fixtures as fx

MISTRAL_V03 = """{%- if messages[0]["role"] == "system" %}
    {%- set system_message = messages[0]["content"] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}
{%- set user_messages = loop_messages | selectattr("role", "equalto", "user") | list %}
{%- set ns = namespace() %}
{%- set ns.index = 0 %}
{%- for message in loop_messages %}
    {%- if not (message.role == "tool" or message.role == "tool_results" or (message.tool_calls is defined and message.tool_calls is not none)) %}
        {%- if (message["role"] == "user") != (ns.index % 2 == 0) %}
            {{- raise_exception("After the optional system message, conversation roles must alternate user/assistant/user/assistant/...") }}
        {%- endif %}
        {%- set ns.index = ns.index + 1 %}
    {%- endif %}
{%- endfor %}
{{- bos_token }}
{%- for message in loop_messages %}
    {%- if message["role"] == "user" %}
        {%- if tools is not none and (message == user_messages[-1]) %}
            {{- "[AVAILABLE_TOOLS] [" }}
            {%- for tool in tools %}
                {%- set tool = tool.function %}
                {{- '{"type": "function", "function": {' }}
                {%- for key, val in tool.items() if key != "return" %}
                    {%- if val is string %}
                        {{- '"' + key + '": "' + val + '"' }}
                    {%- else %}
                        {{- '"' + key + '": ' + val|tojson }}
                    {%- endif %}
                    {%- if not loop.last %}
                        {{- ", " }}
                    {%- endif %}
                {%- endfor %}
                {{- "}}" }}
                {%- if not loop.last %}
                    {{- ", " }}
                {%- else %}
                    {{- "]" }}
                {%- endif %}
            {%- endfor %}
            {{- "[/AVAILABLE_TOOLS]" }}
            {%- endif %}
        {%- if loop.last and system_message is defined %}
            {{- "[INST] " + system_message + "\\n\\n" + message["content"] + "[/INST]" }}
        {%- else %}
            {{- "[INST] " + message["content"] + "[/INST]" }}
        {%- endif %}
    {%- elif message.tool_calls is defined and message.tool_calls is not none %}
        {{- "[TOOL_CALLS] [" }}
        {%- for tool_call in message.tool_calls %}
            {%- set out = tool_call.function|tojson %}
            {{- out[:-1] }}
            {%- if not tool_call.id is defined or tool_call.id|length != 9 %}
                {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}
            {%- endif %}
            {{- ', "id": "' + tool_call.id + '"}' }}
            {%- if not loop.last %}
                {{- ", " }}
            {%- else %}
                {{- "]" + eos_token }}
            {%- endif %}
        {%- endfor %}
    {%- elif message["role"] == "assistant" %}
        {{- " " + message["content"]|trim + eos_token}}
    {%- elif message["role"] == "tool_results" or message["role"] == "tool" %}
        {%- if message.content is defined and message.content.content is defined %}
            {%- set content = message.content.content %}
        {%- else %}
            {%- set content = message.content %}
        {%- endif %}
        {{- '[TOOL_RESULTS] {"content": ' + content|string + ", " }}
        {%- if not message.tool_call_id is defined or message.tool_call_id|length != 9 %}
            {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}
        {%- endif %}
        {{- '"call_id": "' + message.tool_call_id + '"}[/TOOL_RESULTS]' }}
    {%- else %}
        {{- raise_exception("Only user and assistant roles are supported, with the exception of an initial optional system message!") }}
    {%- endif %}
{%- endfor %}
"""  # noqa: E501

PHI4 = (
    "{% for message in messages %}{% if (message['role'] == 'system') %}"
    "{{'<|im_start|>system<|im_sep|>' + message['content'] + '<|im_end|>'}}"
    "{% elif (message['role'] == 'user') %}{{'<|im_start|>user<|im_sep|>' + message['content'] + '<|im_end|>'}}"
    "{% elif (message['role'] == 'assistant') %}"
    "{{'<|im_start|>assistant<|im_sep|>' + message['content'] + '<|im_end|>'}}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant<|im_sep|>' }}{% endif %}"
)

SMOLLM2 = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

QWEN_SPECIAL = ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]
QWEN_TEXT = ["<tool_call>", "</tool_call>", "<think>", "</think>", "<tool_response>", "</tool_response>"]
DEEPSEEK_SPECIAL = [
    "<｜begin▁of▁sentence｜>",
    "<｜end▁of▁sentence｜>",
    "<｜User｜>",
    "<｜Assistant｜>",
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁calls▁end｜>",
    "<｜tool▁call▁begin｜>",
    "<｜tool▁call▁end｜>",
    "<｜tool▁sep｜>",
    "<｜tool▁outputs▁begin｜>",
    "<｜tool▁outputs▁end｜>",
    "<｜tool▁output▁begin｜>",
    "<｜tool▁output▁end｜>",
]
MISTRAL_SPECIAL = [
    "<s>",
    "</s>",
    "[INST]",
    "[/INST]",
    "[TOOL_CALLS]",
    "[AVAILABLE_TOOLS]",
    "[/AVAILABLE_TOOLS]",
    "[TOOL_RESULTS]",
    "[/TOOL_RESULTS]",
]
PHI3_SPECIAL = ["<s>", "<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
LLAMA_SPECIAL = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>"]
GEMMA_SPECIAL = ["<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>"]


@dataclass(frozen=True)
class Model:
    """A model's chat template and tokenizer settings, what its conversations may hold, and its reference rule."""

    name: str
    template: str  # a file of trl/chat_templates (``trl:NAME``) or the Jinja text
    special: tuple[str, ...]
    tokens: dict[str, str]  # bos_token, eos_token, pad_token
    header: str  # a regex: the assistant header an answer's output follows
    end_of_turn: str
    system: bool = True
    tools: bool = False
    reasoning: bool = False  # the template renders reasoning (in some turns)
    text: tuple[str, ...] = ()  # added tokens that are not special


MODELS = {
    m.name: m
    for m in [
        Model(
            "llama3_1",
            "trl:llama3_1",
            tuple(LLAMA_SPECIAL),
            {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>", "pad_token": "<|eom_id|>"},
            re.escape("<|start_header_id|>assistant<|end_header_id|>\n\n"),
            "<|eot_id|>",
            tools=True,
        ),
        Model(
            "qwen2_5",
            "trl:qwen2_5",
            tuple(QWEN_SPECIAL),
            {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
            re.escape("<|im_start|>assistant\n"),
            "<|im_end|>",
            tools=True,
            text=tuple(QWEN_TEXT),
        ),
        Model(
            "qwen3",
            "trl:qwen3",
            tuple(QWEN_SPECIAL),
            {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
            re.escape("<|im_start|>assistant\n"),
            "<|im_end|>",
            tools=True,
            reasoning=True,
            text=tuple(QWEN_TEXT),
        ),
        Model(
            "deepseek_r1_distill",
            "trl:deepseek_r1_distill",
            tuple(DEEPSEEK_SPECIAL),
            {"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>"},
            re.escape("<｜Assistant｜>"),
            "<｜end▁of▁sentence｜>",
            text=("<think>", "</think>"),
        ),
        Model(
            "mistral_v0_3",
            MISTRAL_V03,
            tuple(MISTRAL_SPECIAL),
            {"bos_token": "<s>", "eos_token": "</s>"},
            r"\[/INST\]|\[/TOOL_RESULTS\]",
            "</s>",
            tools=True,
        ),
        Model(
            "phi3",
            "trl:phi3",
            tuple(PHI3_SPECIAL),
            {"bos_token": "<s>", "eos_token": "<|endoftext|>"},
            re.escape("<|assistant|>\n"),
            "<|end|>",
        ),
        Model(
            "phi3_5",
            "trl:phi3_5",
            tuple(PHI3_SPECIAL),
            {"bos_token": "<s>", "eos_token": "<|endoftext|>"},
            re.escape("<|assistant|>\n"),
            "<|end|>",
        ),
        Model(
            "phi4",
            PHI4,
            ("<|im_start|>", "<|im_end|>", "<|im_sep|>", "<|endoftext|>"),
            {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
            re.escape("<|im_start|>assistant<|im_sep|>"),
            "<|im_end|>",
        ),
        Model(
            "smollm2",
            SMOLLM2,
            tuple(QWEN_SPECIAL),
            {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
            re.escape("<|im_start|>assistant\n"),
            "<|im_end|>",
        ),
        Model(
            "gemma",
            "trl:gemma",
            tuple(GEMMA_SPECIAL),
            {"bos_token": "<bos>", "eos_token": "<eos>"},
            re.escape("<start_of_turn>model\n"),
            "<end_of_turn>",
            system=False,
        ),
        Model(
            "gemma3",
            "trl:gemma3",
            tuple(GEMMA_SPECIAL),
            {"bos_token": "<bos>", "eos_token": "<eos>"},
            re.escape("<start_of_turn>model\n"),
            "<end_of_turn>",
        ),
    ]
}
"""The templates tried, by name."""


def template_text(name: str) -> str:
    """The Jinja text of a template: a file of TRL's package (skipped without TRL), or the text itself."""
    if not name.startswith("trl:"):
        return name
    trl = pytest.importorskip("trl")
    with open(os.path.join(os.path.dirname(trl.__file__), "chat_templates", name[4:] + ".jinja")) as f:
        return f.read()


@functools.cache
def _vocabulary(special: tuple[str, ...], text: tuple[str, ...]) -> str:
    tok = Tokenizer.from_str(fx._trained())
    tok.add_special_tokens(list(special))
    tok.add_tokens(list(text))
    return tok.to_str()


def tokenizer(name: str, template: str | None = None) -> Any:
    """A ``PreTrainedTokenizerFast`` for model ``name``: its control tokens special, its chat template (or
    ``template``), its BOS/EOS/pad names."""
    from transformers import PreTrainedTokenizerFast

    model = MODELS[name]
    tok = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_vocabulary(model.special, model.text)), **model.tokens
    )
    tok.chat_template = template_text(template or model.template)
    return tok


CONTROL = re.compile(r"<\|[A-Za-z_]{1,40}\|>|<｜[^｜]{1,40}｜>|<\|[a-z_]{2,20}>|<[a-z_]{2,20}\|>")
"""Control tokens in a template's text (``<|im_end|>``, ``<｜Assistant｜>``, Gemma-4's ``<|turn>``/``<turn|>``)."""


def trl_tokenizer(name: str, bos: str | None = None, eos: str | None = None) -> Any:
    """A tokenizer for any of TRL's templates: the control tokens its text names made special."""
    from transformers import PreTrainedTokenizerFast

    text = template_text("trl:" + name)
    special = tuple(sorted(set(CONTROL.findall(text)) | {t for t in (bos, eos) if t}))
    names = {k: v for k, v in {"bos_token": bos, "eos_token": eos}.items() if v}
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(_vocabulary(special, ())), **names)
    tok.chat_template = text
    return tok


def conversations(name: str, n: int, *, seed: int = 0) -> list[list[dict[str, Any]]]:
    """``n`` conversations model ``name``'s template accepts: 1-3 exchanges, a system message in some, reasoning in
    some answers (as ``reasoning_content`` or a ``<think>`` block), a tool call and its result in some."""
    model, rng = MODELS[name], random.Random(seed)
    chats = fx.conversations(n, seed=seed, turns=(1, 3), system=0.4 if model.system else 0.0)
    out = []
    for i, chat in enumerate(chats):
        chat = [dict(m) for m in chat]
        for m in chat:
            if m["role"] == "assistant" and rng.random() < 0.5:
                thought = " ".join(rng.choice(fx.sentences()) for _ in range(2))
                if rng.random() < 0.5:
                    m["reasoning_content"] = thought
                else:
                    m["content"] = f"<think>\n{thought}\n</think>\n\n{m['content']}"
        if model.tools and i % 3 == 0:
            at = next(k for k, m in enumerate(chat) if m["role"] == "user") + 1
            chat[at:at] = tool_turns(name, city=rng.choice(["Paris", "Oslo", "Lima"]))
        out.append(chat)
    return out


def tool_turns(name: str, city: str) -> list[dict[str, Any]]:
    """An answer that calls a tool (no content) and the tool's result, as model ``name``'s template takes them."""
    call: dict[str, Any] = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": city}}}
    result: dict[str, Any] = {"role": "tool", "content": '{"temperature": 21}'}
    if name == "mistral_v0_3":
        call["id"], result["tool_call_id"] = "abc123def", "abc123def"
    return [{"role": "assistant", "content": None, "tool_calls": [call]}, result]


def reference_spans(name: str, text: str, **kwargs: Any) -> list[tuple[int, int]]:
    """Every answer's canonical characters in a rendered row: after its assistant header (and, for Qwen3 under
    ``enable_thinking=False``, the empty think block its generation prompt adds) through the first end-of-turn
    token after it."""
    model = MODELS[name]
    spans = []
    for match in re.finditer(model.header, text):
        start = match.end()
        if kwargs.get("enable_thinking") is False and text.startswith("<think>\n\n</think>\n\n", start):
            start += len("<think>\n\n</think>\n\n")
        end = text.find(model.end_of_turn, start)
        spans.append((start, end + len(model.end_of_turn)))
    return spans
