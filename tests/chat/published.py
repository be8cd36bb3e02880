"""The chat templates of 28 models users fine-tune in 2025-2026, as the models publish them (llama.cpp's copies in
``models/templates/``, shipped byte-identical in ``tests/chat/templates/``; origins and licences in its README),
with tokenizers that carry each model's control tokens and stop tokens, conversations each template renders, and a
reference labelling written from each template's own header and end-of-turn strings.

- A model's tokenizer is the chat fixtures' byte-level BPE with its control tokens added (special, or plain added
  tokens where the model's are), saved with a ``generation_config.json`` that lists its stop tokens as the
  model's does, and loaded from that folder as a user loads a model's.
- :func:`conversations`: system messages, one to three exchanges, reasoning in some answers (in the fields the
  template reads: ``reasoning_content``, ``reasoning``, ``thinking`` or a ``<think>`` block), tool calls and their
  results in some, the tools in the row's ``tools``.
- :func:`reference_spans`: by the rule of ``shared/notes/templates-2026.md``: each answer's characters from the
  end of its assistant header (and of the part of the generation prompt its turn repeats) through the first
  end-of-turn or stop token after it.
"""

from __future__ import annotations

import functools
import json
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from tests import chat_fixtures as fx

TEMPLATES = Path(__file__).parent / "templates"
LLAMA = ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>")
LLAMA_STOPS = ("<|end_of_text|>", "<|eom_id|>", "<|eot_id|>")
CHATML = ("<|im_start|>", "<|im_end|>", "<|endoftext|>")
QWEN_TEXT = ("<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
DEEPSEEK = (
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
)
GLM = ("[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>", "<|endoftext|>")
GLM_TEXT = (*QWEN_TEXT, "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>")


@dataclass(frozen=True)
class Published:
    """A model's published template, its tokenizer's tokens, what its conversations may hold, its reference rule."""

    file: str
    special: tuple[str, ...]
    eos: str
    header: str  # regex: the assistant header (and the generation prompt's part its turn repeats)
    end: str  # regex: what ends an answer's turn (its end-of-turn token, or the stop token that follows it)
    bos: str | None = None
    stops: tuple[str, ...] = ()  # generation_config.json's eos_token_id, as tokens
    text: tuple[str, ...] = ()  # added tokens that are not special
    system: bool = True
    tools: bool = True  # takes tools and tool calls (rendered or not)
    needs_tools: bool = False  # every row must carry tools (Hermes-3's tool_use template)
    parallel: bool = True  # takes two tool calls in one answer
    call_words: bool = True  # takes words with a tool call (Gemma 4 writes them after the call's result)
    reasoning: tuple[str, ...] = ("reasoning_content", "think")  # how its answers carry reasoning, in turn
    call_content: str | None = None  # the content of an answer that calls a tool


MODELS = {
    "glm4_6": Published(
        "GLM-4.6",
        GLM,
        "<|endoftext|>",
        re.escape("<|assistant|>"),
        r"<\|user\|>|<\|observation\|>|<\|endoftext\|>|\Z",  # the last answer: the rendering's end
        stops=("<|endoftext|>", "<|user|>", "<|observation|>"),
        text=GLM_TEXT,
    ),
    "glm4_7_flash": Published(
        "GLM-4.7-Flash",
        GLM,
        "<|endoftext|>",
        re.escape("<|assistant|>") + "(?:<think>)?",  # its prompt's <think> stays prompt
        r"<\|user\|>|<\|observation\|>|<\|endoftext\|>|\Z",  # the last answer: the rendering's end
        stops=("<|endoftext|>", "<|user|>", "<|observation|>"),
        text=GLM_TEXT,
    ),
    "gpt_oss": Published(
        "openai-gpt-oss-120b",
        ("<|startoftext|>", "<|endoftext|>", "<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>")
        + ("<|return|>", "<|call|>"),
        "<|return|>",
        re.escape("<|start|>assistant"),
        r"<\|return\|>|<\|call\|>|<\|end\|>(?!<\|start\|>assistant)",  # an analysis message goes on
        stops=("<|return|>", "<|endoftext|>", "<|call|>"),
        reasoning=("thinking",),
        parallel=False,
    ),
    "gemma4": Published(
        "google-gemma-4-31B-it",
        ("<bos>", "<eos>", "<|turn>", "<turn|>", "<|think|>", "<|channel>", "<channel|>", "<|tool>", "<tool|>")
        + ("<|tool_call>", "<tool_call|>", "<|tool_response>", "<tool_response|>", '<|"|>', "<|image|>"),
        "<turn|>",
        r"<\|turn>model\n|<tool_response\|>(?!<\|tool_response>)",  # a tool's result goes on the model's turn
        r"<turn\|>|<\|tool_response>",
        bos="<bos>",
        stops=("<eos>", "<turn|>", "<|tool_response>"),
        reasoning=("reasoning", "reasoning_content"),
        call_words=False,
    ),
    "functionary_v3_1": Published(
        "meetkai-functionary-medium-v3.1",
        (*LLAMA, "<|python_tag|>"),
        "<|eot_id|>",
        re.escape("<|start_header_id|>assistant<|end_header_id|>\n\n"),
        r"<\|eot_id\|>|<\|eom_id\|>",
        bos="<|begin_of_text|>",
        stops=LLAMA_STOPS,
    ),
    "mistral_nemo": Published(
        "mistralai-Mistral-Nemo-Instruct-2407",
        ("<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]")
        + ("[TOOL_RESULTS]", "[/TOOL_RESULTS]"),
        "</s>",
        r"\[/INST\]|\[/TOOL_RESULTS\](?!\[TOOL_RESULTS\])",  # after the last of the results
        re.escape("</s>"),
        bos="<s>",
    ),
    "granite3_3": Published(
        "ibm-granite-granite-3.3-2B-Instruct",
        ("<|start_of_role|>", "<|end_of_role|>", "<|end_of_text|>", "<|tool_call|>"),
        "<|end_of_text|>",
        re.escape("<|start_of_role|>assistant<|end_of_role|>"),
        re.escape("<|end_of_text|>"),
        text=("<think>", "</think>", "<response>", "</response>"),
        call_content="",
    ),
    "smollm3": Published(
        "HuggingFaceTB-SmolLM3-3B",
        CHATML,
        "<|im_end|>",
        re.escape("<|im_start|>assistant\n"),
        re.escape("<|im_end|>"),
        text=QWEN_TEXT,
        call_content="",
    ),
    "hermes3_tool_use": Published(
        "NousResearch-Hermes-3-Llama-3.1-8B-tool_use",
        (*LLAMA, "<|im_start|>", "<|im_end|>"),
        "<|im_end|>",
        re.escape("<|im_start|>assistant") + r"\n?",
        re.escape("<|im_end|>"),
        bos="<|begin_of_text|>",
        stops=("<|im_end|>", "<|end_of_text|>"),
        text=QWEN_TEXT,
        needs_tools=True,
    ),
    "command_r7b": Published(
        "CohereForAI-c4ai-command-r7b-12-2024-tool_use",
        ("<BOS_TOKEN>", "<|END_OF_TURN_TOKEN|>", "<|START_OF_TURN_TOKEN|>", "<|SYSTEM_TOKEN|>", "<|USER_TOKEN|>")
        + ("<|CHATBOT_TOKEN|>", "<|START_THINKING|>", "<|END_THINKING|>", "<|START_RESPONSE|>", "<|END_RESPONSE|>")
        + ("<|START_ACTION|>", "<|END_ACTION|>", "<|START_TOOL_RESULT|>", "<|END_TOOL_RESULT|>"),
        "<|END_OF_TURN_TOKEN|>",
        # the prompt it always writes (<|START_THINKING|><|END_THINKING|>) stays prompt as far as the turn repeats it
        re.escape("<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>") + r"(?:<\|START_THINKING\|>(?:<\|END_THINKING\|>)?)?",
        re.escape("<|END_OF_TURN_TOKEN|>"),
        bos="<BOS_TOKEN>",
    ),
    "nemotron_nano_v2": Published(
        "NVIDIA-Nemotron-Nano-v2",
        ("<SPECIAL_10>", "<SPECIAL_11>", "<SPECIAL_12>"),
        "<SPECIAL_12>",
        re.escape("<SPECIAL_11>Assistant\n") + "(?:<think>\n)?",
        re.escape("<SPECIAL_12>"),
        text=("<think>", "</think>", "<TOOLCALL>", "</TOOLCALL>", "<AVAILABLE_TOOLS>", "</AVAILABLE_TOOLS>"),
    ),
    "lfm2_5": Published(
        "LFM2.5-Instruct",
        ("<|startoftext|>", "<|im_start|>", "<|im_end|>", "<|tool_call_start|>", "<|tool_call_end|>"),
        "<|im_end|>",
        re.escape("<|im_start|>assistant\n"),
        re.escape("<|im_end|>"),
        bos="<|startoftext|>",
        text=("<think>", "</think>"),
        call_content="",
    ),
    "apertus": Published(
        "Apertus-8B-Instruct",
        ("<s>", "</s>", "<|system_start|>", "<|system_end|>", "<|developer_start|>", "<|developer_end|>")
        + ("<|user_start|>", "<|user_end|>", "<|assistant_start|>", "<|assistant_end|>", "<|inner_prefix|>")
        + ("<|inner_suffix|>", "<|tools_prefix|>", "<|tools_suffix|>"),
        "<|assistant_end|>",
        # an answer after a tool's result goes on the same turn, right after the result (and the "]" closing results)
        re.escape("<|assistant_start|>") + r'|\{"temperature": 2\d\}\]?(?!, )',
        r"<\|assistant_end\|>|<\|tools_suffix\|>|\Z",
        bos="<s>",
        stops=("<|assistant_end|>", "<|tools_suffix|>"),
    ),
    "qwen3": Published(
        "Qwen-Qwen3-0.6B",
        CHATML,
        "<|im_end|>",
        re.escape("<|im_start|>assistant\n"),
        re.escape("<|im_end|>"),
        text=QWEN_TEXT,
        call_content="",
    ),
    "qwen3_5": Published(
        "Qwen3.5-4B",
        CHATML,
        "<|im_end|>",
        re.escape("<|im_start|>assistant\n") + "(?:<think>\n)?",
        re.escape("<|im_end|>"),
        text=QWEN_TEXT,
    ),
    "qwq": Published(
        "Qwen-QwQ-32B",
        CHATML,
        "<|im_end|>",
        re.escape("<|im_start|>assistant\n"),  # its prompt <think>\n</think> repeated only in part
        re.escape("<|im_end|>"),
        text=QWEN_TEXT,
        call_content="",
    ),
    "qwen2_5": Published(
        "Qwen-Qwen2.5-7B-Instruct",
        CHATML,
        "<|im_end|>",
        re.escape("<|im_start|>assistant\n"),
        re.escape("<|im_end|>"),
        text=QWEN_TEXT,
    ),
    "deepseek_r1_llama": Published(
        "deepseek-ai-DeepSeek-R1-Distill-Llama-8B",
        DEEPSEEK,
        "<｜end▁of▁sentence｜>",
        re.escape("<｜Assistant｜>") + "|" + re.escape("<｜tool▁outputs▁end｜>"),  # an answer after a result: no header
        re.escape("<｜end▁of▁sentence｜>"),
        bos="<｜begin▁of▁sentence｜>",
        text=("<think>", "</think>"),
        call_content="",
    ),
    "deepseek_v3_1": Published(
        "deepseek-ai-DeepSeek-V3.1",
        DEEPSEEK,
        "<｜end▁of▁sentence｜>",
        re.escape("<｜Assistant｜><think></think>")
        + "|"
        + re.escape("<｜tool▁output▁end｜>")
        + "(?!<｜tool▁output▁begin｜>)",
        re.escape("<｜end▁of▁sentence｜>"),
        bos="<｜begin▁of▁sentence｜>",
        text=("<think>", "</think>"),
    ),
    "llama3_1": Published(
        "meta-llama-Llama-3.1-8B-Instruct",
        (*LLAMA, "<|python_tag|>"),
        "<|eot_id|>",
        re.escape("<|start_header_id|>assistant<|end_header_id|>\n\n"),
        r"<\|eot_id\|>|<\|eom_id\|>",
        bos="<|begin_of_text|>",
        stops=LLAMA_STOPS,
        parallel=False,
    ),
    "llama3_2": Published(
        "meta-llama-Llama-3.2-3B-Instruct",
        (*LLAMA, "<|python_tag|>"),
        "<|eot_id|>",
        re.escape("<|start_header_id|>assistant<|end_header_id|>\n\n"),
        r"<\|eot_id\|>|<\|eom_id\|>",
        bos="<|begin_of_text|>",
        stops=LLAMA_STOPS,
        parallel=False,
    ),
    "mistral_small_3_2": Published(
        "Mistral-Small-3.2-24B-Instruct-2506",
        ("<s>", "</s>", "[INST]", "[/INST]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[TOOL_CALLS]", "[ARGS]")
        + ("[CALL_ID]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]"),
        "</s>",
        r"\[/INST\]|\[/TOOL_RESULTS\](?!\[TOOL_RESULTS\])",  # after the last of the results
        re.escape("</s>"),
        bos="<s>",
    ),
    "gemma2": Published(
        "google-gemma-2-2b-it",
        ("<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>"),
        "<eos>",
        re.escape("<start_of_turn>model\n"),
        re.escape("<end_of_turn>"),
        bos="<bos>",
        stops=("<eos>", "<end_of_turn>"),
        system=False,
        tools=False,
    ),
    "phi3_5": Published(
        "microsoft-Phi-3.5-mini-instruct",
        ("<s>", "<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"),
        "<|endoftext|>",
        re.escape("<|assistant|>\n"),
        re.escape("<|end|>"),
        bos="<s>",
        stops=("<|endoftext|>", "<|end|>"),
        tools=False,
    ),
    "granite4": Published(
        "ibm-granite-granite-4.0",
        ("<|start_of_role|>", "<|end_of_role|>", "<|end_of_text|>"),
        "<|end_of_text|>",
        re.escape("<|start_of_role|>assistant<|end_of_role|>"),
        re.escape("<|end_of_text|>"),
        text=QWEN_TEXT,
    ),
    "nemotron3_nano": Published(
        "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16",
        CHATML,
        "<|im_end|>",
        re.escape("<|im_start|>assistant\n") + "(?:<think>\n)?",
        re.escape("<|im_end|>"),
        text=QWEN_TEXT,
    ),
    "qwen3_coder": Published(
        "Qwen3-Coder",
        CHATML,
        "<|im_end|>",
        re.escape("<|im_start|>assistant\n"),
        re.escape("<|im_end|>"),
        text=QWEN_TEXT,
    ),
    "ministral3_reasoning": Published(
        "mistralai-Ministral-3-14B-Reasoning-2512",
        ("<s>", "</s>", "[INST]", "[/INST]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[TOOL_CALLS]", "[ARGS]")
        + ("[THINK]", "[/THINK]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]"),
        "</s>",
        r"\[/INST\]|\[/TOOL_RESULTS\](?!\[TOOL_RESULTS\])",  # after the last of the results
        re.escape("</s>"),
        bos="<s>",
    ),
}
"""The published templates tried, by name (the first 13 are those the last round refused or mislabelled)."""


def template_text(name: str) -> str:
    """The Jinja text of model ``name``'s template, as published."""
    return (TEMPLATES / f"{MODELS[name].file}.jinja").read_text()


@functools.cache
def _vocabulary(special: tuple[str, ...], text: tuple[str, ...]) -> str:
    tok = Tokenizer.from_str(fx._trained())
    tok.add_special_tokens(list(special))
    tok.add_tokens(list(text))
    return tok.to_str()


def save_tokenizer(name: str, folder: Path) -> Path:
    """Model ``name``'s tokenizer saved in ``folder`` as a model ships it: its control tokens, its template, its
    BOS/EOS, and a ``generation_config.json`` with its stop tokens."""
    from transformers import PreTrainedTokenizerFast

    model = MODELS[name]
    names = {"bos_token": model.bos, "eos_token": model.eos}
    tok = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_vocabulary(model.special, model.text)),
        **{k: v for k, v in names.items() if v},
    )
    tok.chat_template = template_text(name)
    tok.save_pretrained(folder)
    stops = [tok.convert_tokens_to_ids(t) for t in model.stops or (model.eos,)]
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": stops}))
    return folder


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the weather of a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "The city."}},
            "required": ["city"],
        },
    },
}


def conversations(name: str, n: int, *, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` rows (``messages``, and ``tools`` where they call one) model ``name``'s template renders."""
    model, rng = MODELS[name], random.Random(seed)
    chats = fx.conversations(n, seed=seed, turns=(1, 3), system=0.4 if model.system else 0.0)
    rows = []
    for i, chat in enumerate(chats):
        chat = [dict(m) for m in chat]
        for k, m in enumerate(chat):
            if m["role"] == "assistant" and rng.random() < 0.5:
                give_reasoning(m, model.reasoning[k % len(model.reasoning)], rng)
        calls = model.tools and i % 3 == 0
        if calls:  # after some user message: calls, their results, and an answer that quotes them
            at = rng.choice([k for k, m in enumerate(chat) if m["role"] == "user"]) + 1
            cities = rng.sample(["Paris", "Oslo", "Lima"], 1 + (model.parallel and i % 9 == 3))  # two at once
            chat[at - 1] = {**chat[at - 1], "content": f"{chat[at - 1]['content']} Weather in {' and '.join(cities)}?"}
            for round_ in range(1 + (i % 6 == 0)):  # two rounds of calls in some
                said = model.call_words and rng.random() < 0.5  # the call with some words in some
                turns = tool_turns(name, cities, round_, "Let me check the weather." if said else model.call_content)
                if rng.random() < 0.5 and not (said and model.reasoning == ("thinking",)):  # gpt-oss: one or other
                    give_reasoning(turns[0], model.reasoning[0], rng)
                chat[at:at] = turns
                at += len(turns)
            answer = chat[at]
            answer["content"] = answer["content"].replace("</think>\n\n", f"</think>\n\nIt is 21 in {cities[-1]}. ")
            if not answer["content"].startswith("<think>"):
                answer["content"] = f"It is 21 degrees in {cities[-1]}. {answer['content']}"
        rows.append({"messages": chat, "tools": [WEATHER] if calls or model.needs_tools else None})
    return rows


def give_reasoning(message: dict[str, Any], how: str, rng: random.Random) -> None:
    """Reasoning for an answer, in the field ``how`` names (``"think"``: a ``<think>`` block in its content)."""
    thought = " ".join(rng.choice(fx.sentences()) for _ in range(2))
    if how == "think":
        message["content"] = f"<think>\n{thought}\n</think>\n\n{message['content'] or ''}"
    else:
        message[how] = thought


def tool_turns(name: str, cities: list[str], round_: int, content: str | None) -> list[dict[str, Any]]:
    """An answer that calls a tool for each city, and the tool's results, as model ``name``'s template takes them."""
    ids = [f"call{round_}{j}abcdefghi"[:9] for j in range(len(cities))]  # Mistral's ids are 9 characters
    calls = [
        {"id": id_, "type": "function", "function": {"name": "get_weather", "arguments": {"city": city}}}
        for id_, city in zip(ids, cities)
    ]
    results = [
        {"role": "tool", "tool_call_id": id_, "name": "get_weather", "content": f'{{"temperature": {21 + j}}}'}
        for j, id_ in enumerate(ids)
    ]
    return [{"role": "assistant", "content": content, "tool_calls": calls}, *results]


def reference_spans(name: str, text: str) -> list[tuple[int, int]]:
    """Every answer's canonical characters in a rendered row: from the end of its header through the first
    end-of-turn (or stop) token after it."""
    model = MODELS[name]
    spans, at = [], 0
    while (header := re.compile(model.header).search(text, at)) is not None and header.end() < len(text):
        end = re.compile(model.end).search(text, header.end())
        assert end is not None, f"no end of turn after {header.end()} in {text!r}"
        spans.append((header.end(), end.end()))
        at = max(end.end(), header.end() + 1)
    return spans


def packed_rows(loader: Any) -> list[dict[str, Any]]:
    """The token rows a ``.chat(...).pack(..., keep=("idx",))`` loader packed, cut back out of its batches: each
    row's ``ids``, ``labels`` and the ``idx`` of its conversation, in the order packed."""
    rows = []
    for batch in loader:
        for b, kept in enumerate(batch["idx"]):
            seq = batch["seq_idx"][b].tolist()
            starts = [i for i in range(len(seq)) if i == 0 or seq[i] != seq[i - 1]] + [len(seq)]
            for idx, lo, hi in zip(kept, starts, starts[1:]):  # the padding after them is a segment of its own
                ids, labels = batch["input_ids"][b, lo:hi].tolist(), batch["labels"][b, lo:hi].tolist()
                rows.append({"idx": idx, "ids": ids, "labels": labels})
    return rows


def held(text: str, part: str) -> bool:
    """Whether ``text`` holds ``part`` as written or as a JSON string writes it (a template may JSON-encode it)."""
    return part in text or json.dumps(part, ensure_ascii=False)[1:-1] in text


def thought(message: dict[str, Any]) -> str:
    """An answer's reasoning, wherever the data holds it (``reasoning_content``, ``reasoning``, ``thinking``, a
    ``<think>`` block), stripped."""
    for key in ("reasoning_content", "reasoning", "thinking"):
        if isinstance(message.get(key), str) and message[key].strip():
            return message[key].strip()
    content = message.get("content")
    return content.split("</think>")[0].split("<think>")[-1].strip() if "</think>" in str(content) else ""
