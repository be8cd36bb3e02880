"""Chat fixtures shared by the chat, packing and recipe tests: a byte-level BPE chat tokenizer trained here,
chat templates of the shapes models ship (as Jinja strings), and conversations made from the shipped text.

- :func:`tokenizer` returns a ``transformers.PreTrainedTokenizerFast`` over a byte-level BPE trained in
  about half a second on ``padpipe/data/corpus.jsonl.gz``, with the special tokens of every template below
  (``<|endoftext|>`` is its EOS, ``<|pad|>`` its pad) and a chat template (ChatML unless told).
- The templates: :data:`CHATML` (no markers), :data:`CHATML_MARKED` (``{% generation %}`` around
  ``'\\n' + content + '<|im_end|>\\n'``, the header's newline and the separator included, as TRL's Qwen2.5
  training template marks), :data:`QWEN25` (a default system message, tools and tool calls),
  :data:`LLAMA3` (a default system header with dates, ``<|eot_id|>``), :data:`LLAMA3_MARKED` (markers around
  ``content + '<|eot_id|>'``), :data:`MISTRAL` (``[INST]``, no generation prompt, ``eos_token`` after each
  answer), :data:`GEMMA` (``<start_of_turn>model``, ``<end_of_turn>``, no system role) and
  :data:`GEMMA_MARKED` (markers around content only), and :data:`QWEN3` (drops the ``<think>`` block of
  earlier answers, so a conversation's prefix renders otherwise than in the whole: not prefix-preserving).
- :func:`conversations` makes deterministic multi-turn conversations from real sentences.
"""

from __future__ import annotations

import functools
import gzip
import json
import random
import re
from typing import Any

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from padpipe import examples

SPECIAL = [
    "<|endoftext|>",
    "<|pad|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|begin_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<s>",
    "</s>",
    "[INST]",
    "[/INST]",
    "<bos>",
    "<start_of_turn>",
    "<end_of_turn>",
]
"""Special tokens (``special=True``): every template's control tokens."""
ADDED = ["<tool_call>", "</tool_call>", "<think>", "</think>"]
"""Added tokens that are not special (as Qwen's): one token each, but text to ``skip_special_tokens``."""

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}{{ part['text'] }}{% endfor %}{% endif %}"
    "{{ '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

CHATML_MARKED = (
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}"
    "{{ '<|im_start|>assistant' }}{% generation %}{{ '\\n' + message['content'] + '<|im_end|>\\n' }}{% endgeneration %}"
    "{% else %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

QWEN25 = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}
    {%- else %}{{- 'You are a helpful assistant.' }}{%- endif %}
    {{- "\\n\\n# Tools\\n\\n<tools>" }}
    {%- for tool in tools %}{{- "\\n" }}{{- tool | tojson }}{%- endfor %}
    {{- "\\n</tools><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == "user" or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>assistant' }}
        {%- if message.content %}{{- '\\n' + message.content }}{%- endif %}
        {%- for tool_call in message.tool_calls or [] %}
            {%- set call = tool_call.function if tool_call.function is defined else tool_call %}
            {{- '\\n<tool_call>\\n{"name": "' + call.name + '", "arguments": ' + call.arguments | tojson + '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {{- '<|im_start|>user\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}
"""

LLAMA3 = """{{- bos_token }}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] | trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{{- "Cutting Knowledge Date: December 2023\\nToday Date: " + (date_string or "26 Jul 2024") + "\\n\\n" }}
{{- system_message + "<|eot_id|>" }}
{%- for message in messages %}
    {%- if message.role == 'assistant' and message.tool_calls %}
        {%- set call = message.tool_calls[0].function %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
        {{- '{"name": "' + call.name + '", "parameters": ' + call.arguments | tojson + '}<|eot_id|>' }}
    {%- elif message.role == 'tool' %}
        {{- '<|start_header_id|>ipython<|end_header_id|>\\n\\n' + message.content | trim + '<|eot_id|>' }}
    {%- else %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}
"""

LLAMA3_MARKED = """{{- bos_token }}
{%- for message in messages %}
    {%- if message['role'] == 'assistant' %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
        {%- generation %}{{- message['content'] | trim + '<|eot_id|>' }}{%- endgeneration %}
    {%- else %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}
"""

MISTRAL = """{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}
{{- bos_token }}
{%- for message in loop_messages %}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}
    {%- endif %}
    {%- if message['role'] == 'user' %}
        {%- if loop.first and system_message is defined %}
            {{- '[INST] ' + system_message + '\\n\\n' + message['content'] + '[/INST]' }}
        {%- else %}
            {{- '[INST] ' + message['content'] + '[/INST]' }}
        {%- endif %}
    {%- elif message['role'] == 'assistant' %}
        {{- ' ' + message['content'] | trim + eos_token }}
    {%- else %}
        {{- raise_exception('Only user and assistant roles are supported!') }}
    {%- endif %}
{%- endfor %}
"""

GEMMA = """{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}
{%- for message in messages -%}
{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}
{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}{{ '<start_of_turn>model\\n' }}{%- endif -%}
"""

GEMMA_MARKED = """{{ bos_token }}
{%- for message in messages -%}
{%- if message['role'] == 'assistant' -%}
{{ '<start_of_turn>model\\n' }}{% generation %}{{ message['content'] | trim }}{% endgeneration %}{{ '<end_of_turn>\\n' }}
{%- else -%}
{{ '<start_of_turn>' + message['role'] + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{ '<start_of_turn>model\\n' }}{%- endif -%}
"""

QWEN3 = """{%- set ns = namespace(last_query=-1) %}
{%- for message in messages %}{%- if message.role == 'user' %}{%- set ns.last_query = loop.index0 %}{%- endif %}{%- endfor %}
{%- for message in messages %}
    {%- if message.role == 'assistant' %}
        {%- set content = message.content %}
        {%- set reasoning = '' %}
        {%- if '</think>' in content %}
            {%- set reasoning = content.split('</think>')[0].split('<think>')[-1].strip('\\n') %}
            {%- set content = content.split('</think>')[-1].lstrip('\\n') %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query %}
            {{- '<|im_start|>assistant\\n<think>\\n' + reasoning + '\\n</think>\\n\\n' + content + '<|im_end|>\\n' }}
        {%- else %}
            {{- '<|im_start|>assistant\\n' + content + '<|im_end|>\\n' }}
        {%- endif %}
    {%- else %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}
{%- endif %}
"""

TEMPLATES = {
    "chatml": CHATML,
    "chatml_marked": CHATML_MARKED,
    "qwen25": QWEN25,
    "llama3": LLAMA3,
    "llama3_marked": LLAMA3_MARKED,
    "mistral": MISTRAL,
    "gemma": GEMMA,
    "gemma_marked": GEMMA_MARKED,
}
"""The prefix-preserving templates by name (QWEN3 is not one)."""
BOS = {"llama3": "<|begin_of_text|>", "llama3_marked": "<|begin_of_text|>", "mistral": "<s>", "gemma": "<bos>"}
BOS["gemma_marked"] = "<bos>"
EOS = {"mistral": "</s>"}
"""The BOS/EOS tokens a template's model has, where not the default (no BOS, ``<|endoftext|>``)."""


@functools.lru_cache(maxsize=1)
def sentences() -> tuple[str, ...]:
    """About 20,000 sentences of the shipped corpus (real English text, Python's docstrings)."""
    with gzip.open(examples.SAMPLE_JSONL, "rt") as f:
        docs = [json.loads(line)["text"] for line, _ in zip(f, range(600))]
    found = (s.strip() for doc in docs for s in re.split(r"(?<=[.!?])\s+", doc))
    return tuple(s for s in found if 3 <= len(s) <= 400)


@functools.lru_cache(maxsize=1)
def _trained() -> str:
    """The byte-level BPE (vocabulary 2,000) trained on the corpus, as JSON (about half a second)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=True)
    trainer = trainers.BpeTrainer(
        vocab_size=2000,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    with gzip.open(examples.SAMPLE_JSONL, "rt") as f:
        tok.train_from_iterator((json.loads(line)["text"] for line, _ in zip(f, range(800))), trainer)
    tok.add_tokens(ADDED)
    return tok.to_str()


def tokenizer(template: str | None = CHATML, *, name: str | None = None, **options: Any) -> Any:
    """A ``PreTrainedTokenizerFast`` over the trained BPE with ``template`` as its chat template.

    Args:
        template: The chat template (``None``: none).
        name: A key of :data:`TEMPLATES` (or ``"qwen3"``): its template, and its model's BOS/EOS tokens.
        options: More ``PreTrainedTokenizerFast`` arguments (``bos_token=...``).
    """
    from transformers import PreTrainedTokenizerFast

    if name is not None:
        template = {**TEMPLATES, "qwen3": QWEN3}[name]
        options = {"bos_token": BOS.get(name), "eos_token": EOS.get(name, "<|endoftext|>"), **options}
    settings = {"eos_token": "<|endoftext|>", "pad_token": "<|pad|>", **options}
    settings = {k: v for k, v in settings.items() if v is not None}
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(_trained()), **settings)
    tok.chat_template = template
    return tok


def conversations(
    n: int,
    *,
    seed: int = 0,
    turns: tuple[int, int] = (1, 3),
    system: float = 0.3,
    words: tuple[int, int] = (1, 3),
) -> list[list[dict[str, Any]]]:
    """``n`` conversations of alternating user/assistant turns (each ending with an answer) from real sentences.

    Args:
        n: How many.
        seed: Same seed, same conversations.
        turns: The least and most user/assistant exchanges.
        system: The share of conversations that open with a system message.
        words: The least and most sentences in a message.
    """
    rng = random.Random(seed)
    pool = sentences()

    def text() -> str:
        return " ".join(rng.choice(pool) for _ in range(rng.randint(*words)))

    out = []
    for _ in range(n):
        chat: list[dict[str, Any]] = [{"role": "system", "content": text()}] if rng.random() < system else []
        for _ in range(rng.randint(*turns)):
            chat += [{"role": "user", "content": text()}, {"role": "assistant", "content": text()}]
        out.append(chat)
    return out


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the weather of a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def tool_conversation(city: str = "Paris") -> list[dict[str, Any]]:
    """A conversation with an assistant tool call (no content), a tool result and an answer."""
    call = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": city}}}
    return [
        {"role": "user", "content": f"What is the weather in {city}?"},
        {"role": "assistant", "tool_calls": [call]},
        {"role": "tool", "content": '{"temperature": 21}'},
        {"role": "assistant", "content": f"It is 21 degrees in {city}."},
    ]


def reference(tok: Any, messages: list[dict[str, Any]], **kwargs: Any) -> list[int]:
    """``tok.apply_chat_template(messages, tokenize=True)``'s ids: what ``.chat()`` must emit."""
    return list(tok.apply_chat_template(messages, tokenize=True, return_dict=True, **kwargs)["input_ids"])


@functools.cache
def offsets_tokenizer(tok: Any) -> Tokenizer:
    """``tok``'s own tokenizer without its post-processor (no special tokens added, offsets untrimmed), parsed once
    per tokenizer: the reference spans are read from its offsets."""
    raw = Tokenizer.from_str(tok.backend_tokenizer.to_str())
    raw.post_processor = None
    return raw
