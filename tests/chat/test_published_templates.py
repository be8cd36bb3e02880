"""`.chat(...).pack(...)` at its defaults on the chat templates 28 models publish (``tests/chat/published.py``:
GLM-4.6/4.7, gpt-oss, Gemma 4, Functionary, Mistral-Nemo, Granite, SmolLM3, Hermes-3, Command-R7B, Nemotron,
LFM2.5, Apertus, Qwen, DeepSeek, Llama, Mistral, Gemma 2, Phi), each tokenizer loaded from a folder as the model
ships it, on conversations with system messages, several turns, reasoning, tool calls and their results: nothing
refused; every packed row the template's own rendering of the messages up to one of its answers; every answer
trained exactly once, on the span an independent rule of the template's header and end-of-turn strings gives;
reasoning trained wherever a rendering holds it; what no rendering holds counted."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import padpipe as pp
from padpipe.chat.template import ChatTemplate
from tests.chat import published as pb

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.filterwarnings("ignore:.*the chat template does not render:UserWarning")

N = 24


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Any]]:
    """Each model's tokenizer folder, and the tokenizer loaded from it (for the reference)."""
    root = tmp_path_factory.mktemp("published")
    folders = {name: pb.save_tokenizer(name, root / name) for name in pb.MODELS}
    return {name: (f, transformers.AutoTokenizer.from_pretrained(f)) for name, f in folders.items()}


def render(tok: Any, row: dict[str, Any], k: int, **options: Any) -> Any:
    return tok.apply_chat_template(row["messages"][:k], tools=row["tools"], **options)


def check_row(name: str, tok: Any, row: dict[str, Any], packed: dict[str, Any]) -> dict[int, str]:
    """The answers ``packed`` trains, each with the text of its span, checked: ids are ``apply_chat_template`` of
    the messages up to an answer; trained tokens are exactly the reference spans of the answers it trains."""
    chat = row["messages"]
    ends = [k + 1 for k, m in enumerate(chat) if m["role"] == "assistant"]
    k = next((k for k in ends if packed["ids"] == render(tok, row, k, return_dict=True)["input_ids"]), None)
    assert k is not None, "a row that is no rendering of the messages up to an answer"
    text = render(tok, row, k, tokenize=False)
    offsets = np.array(
        pb.fx.offsets_tokenizer(tok).encode(text, add_special_tokens=False).offsets, dtype=np.int64
    ).reshape(-1, 2)
    answers = [j for j in range(k) if chat[j]["role"] == "assistant"]
    spans = pb.reference_spans(name, text)
    assert len(spans) == len(answers), text
    trained = np.array(packed["labels"]) != -100
    found, covered = {}, np.zeros(len(trained), bool)
    for j, (lo, hi) in zip(answers, spans):
        inside = (offsets[:, 1] > lo) & (offsets[:, 0] < hi)
        if inside.any() and trained[inside].all():
            found[j] = text[lo:hi]
            covered |= inside
    assert np.array_equal(covered, trained), f"trained tokens that are no answer's reference span: {text!r}"
    assert np.array_equal(np.array(packed["labels"])[trained], np.array(packed["ids"])[trained])
    return found


@pytest.mark.parametrize("name", list(pb.MODELS))
def test_chat_packs_every_answer_once_on_its_reference_span_under_the_published_template(
    name: str, tokenizers: dict[str, tuple[Path, Any]]
) -> None:
    folder, tok = tokenizers[name]
    rows = pb.conversations(name, N, seed=1)
    loader = (
        pp.from_iterable([{"idx": i, **row} for i, row in enumerate(rows)])
        .chat(str(folder))
        .pack(8192, batch_size=2, keep=("idx",))
        .loader()
    )
    packed = pb.packed_rows(loader)
    stats = loader.stats()
    assert not stats.skipped, stats.skipped
    spans: dict[tuple[int, int], str] = {}
    times: Counter[tuple[int, int]] = Counter()
    for each in packed:
        for j, span in check_row(name, tok, rows[each["idx"]], each).items():
            spans[(each["idx"], j)] = span
            times[(each["idx"], j)] += 1
    answers = {(i, j) for i, row in enumerate(rows) for j, m in enumerate(row["messages"]) if m["role"] == "assistant"}
    assert set(times) == answers and set(times.values()) == {1}, "an answer not trained exactly once"
    dropped: Counter[str] = Counter()
    for (i, j), span in spans.items():
        message = rows[i]["messages"][j]
        if pb.thought(message) and not pb.held(span, pb.thought(message)):  # no row of the data renders it?
            for k in (j + 1, len(rows[i]["messages"])):
                text = render(tok, rows[i], k, tokenize=False)
                shown = [text[lo:hi] for lo, hi in pb.reference_spans(name, text)]
                assert not any(pb.held(s, pb.thought(message)) for s in shown), f"answer {j}'s reasoning untrained"
            dropped["reasoning"] += 1
        content = str(message.get("content") or "").split("</think>")[-1].strip()
        dropped["answer_content"] += bool(content) and not pb.held(span, content)
        dropped["tool_calls"] += sum(not pb.held(span, c["function"]["name"]) for c in message.get("tool_calls", []))
    counters = stats.counters
    assert {w: counters.get(f"chat.dropped_{w}", 0) for w in dropped} == dict(dropped)
    extra = counters.get("chat.reasoning_rows", 0) + counters.get("chat.split_rows", 0)
    assert len(packed) == len(rows) + extra


CALL = {"id": "abcdefghi", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
TOOL = {"role": "tool", "tool_call_id": "abcdefghi", "name": "get_weather", "content": '{"temperature": 21}'}
ASK, ANSWER = {"role": "user", "content": "Weather in Paris?"}, {"role": "assistant", "content": "It is 21 in Paris."}
HI = [{"role": "user", "content": "Hi."}, {"role": "assistant", "content": "Hello."}]


def calling(content: str | None = None, **more: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": content, "tool_calls": [CALL], **more}


@pytest.mark.parametrize(
    ("name", "chat", "trained"),
    [
        (  # no end-of-turn token of its own: the next role token, where the model stops (a stop token)
            "glm4_6",
            [ASK, calling(), TOOL, ANSWER],
            [
                "\n<think></think>\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
                "</tool_call><|observation|>\n<think></think>\nIt is 21 in Paris."
            ],
        ),
        (  # a call ends with <|call|>; its `thinking` rendered only while no final answer follows: a row of its own
            "gpt_oss",
            [ASK, calling(thinking="Ask the tool."), TOOL, ANSWER],
            [
                "<|channel|>analysis<|message|>Ask the tool.<|end|><|start|>assistant to=functions.get_weather"
                '<|channel|>commentary json<|message|>{"city": "Paris"}<|call|>',
                "<|channel|>final<|message|>It is 21 in Paris.<|return|>",
            ],
        ),
        (  # the call's turn ends with <|tool_response>; the answer goes on after the result, on the same turn
            "gemma4",
            [ASK, calling(), TOOL, ANSWER],
            ['<|tool_call>call:get_weather{city:<|"|>Paris<|"|>}<tool_call|><|tool_response>It is 21 in Paris.<turn|>'],
        ),
        (
            "functionary_v3_1",
            [ASK, calling(), TOOL, ANSWER],
            ['<function=get_weather>{"city": "Paris"}</function><|eom_id|>It is 21 in Paris.<|eot_id|>'],
        ),
        (  # ignores add_generation_prompt: the header its renderings share stays prompt, and its empty thinking
            "command_r7b",
            [*HI, ASK, calling(), TOOL, ANSWER],
            [
                "<|START_RESPONSE|>Hello.<|END_RESPONSE|><|END_OF_TURN_TOKEN|><|START_ACTION|>[\n    "
                '{"tool_call_id": "0", "tool_name": "get_weather", "parameters": {"city": "Paris"}}\n]<|END_ACTION|>'
                "<|END_OF_TURN_TOKEN|><|START_RESPONSE|>It is 21 in Paris.<|END_RESPONSE|><|END_OF_TURN_TOKEN|>"
            ],
        ),
        (  # an earlier answer ends with <|assistant_end|>, never the next <|user_start|>
            "apertus",
            [*HI, ASK, calling(), TOOL, ANSWER],
            [
                'Hello.<|assistant_end|><|tools_prefix|>[{"get_weather": {"city": "Paris"}}]<|tools_suffix|>'
                "It is 21 in Paris."
            ],
        ),
        (  # renders no tool call: the call's turn is its end-of-turn token, the call counted, never searched for
            "smollm3",
            [ASK, calling(""), TOOL, ANSWER],
            ["<|im_end|>It is 21 in Paris.<|im_end|>"],
        ),
        (  # needs `tools`: rendered with the row's
            "hermes3_tool_use",
            [ASK, calling(), TOOL, ANSWER],
            [
                '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>'
                "It is 21 in Paris.<|im_end|>"
            ],
        ),
    ],
)
def test_each_turn_trains_the_token_that_ends_it_for_the_model(
    name: str, chat: list[dict[str, Any]], trained: list[str], tokenizers: dict[str, tuple[Path, Any]]
) -> None:
    folder, tok = tokenizers[name]
    loader = (
        pp.from_iterable([{"idx": 0, "messages": chat, "tools": [pb.WEATHER]}])
        .chat(str(folder))
        .pack(4096, batch_size=1, keep=("idx",))
        .loader()
    )
    rows = pb.packed_rows(loader)  # (in the order packed)
    assert sorted(tok.decode([i for i, x in zip(r["ids"], r["labels"]) if x != -100]) for r in rows) == sorted(trained)
    assert loader.stats().counters.get("chat.dropped_tool_calls", 0) == (name == "smollm3")


@pytest.mark.parametrize(
    ("name", "prompt", "honours", "ends"),
    [
        ("glm4_6", "<|assistant|>", True, ("", "<|user|>", "<|observation|>", "<|endoftext|>")),
        ("gpt_oss", "<|start|>assistant", True, ("<|return|>", "<|end|>", "<|call|>", "<|endoftext|>")),
        ("gemma4", "<|turn>model\n<|channel>thought\n<channel|>", True, ("<turn|>", "<|tool_response>", "<eos>")),
        ("apertus", "<|assistant_start|>", True, ("", "<|assistant_end|>", "<|tools_suffix|>")),
        (  # written after every conversation, whatever add_generation_prompt says
            "command_r7b",
            "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|><|START_THINKING|><|END_THINKING|>",
            False,
            ("<|END_RESPONSE|><|END_OF_TURN_TOKEN|>", "<|END_OF_TURN_TOKEN|>"),
        ),
        ("hermes3_tool_use", "<|im_start|>assistant\n", True, ("<|im_end|>", "<|end_of_text|>")),  # with tools
    ],
)
def test_the_probe_reads_each_templates_prompt_and_every_way_a_turn_ends(
    name: str, prompt: str, honours: bool, ends: tuple[str, ...], tokenizers: dict[str, tuple[Path, Any]]
) -> None:
    probe = ChatTemplate(str(tokenizers[name][0])).probe
    assert (probe.generation_prompt, probe.honours_generation_prompt, probe.ends) == (prompt, honours, ends)


@pytest.mark.parametrize("name", ["smollm3", "granite3_3", "lfm2_5"])
def test_a_tool_call_the_template_does_not_render_is_not_found_in_the_result_that_echoes_its_argument(
    name: str, tokenizers: dict[str, tuple[Path, Any]]
) -> None:
    folder, tok = tokenizers[name]
    echo = {**TOOL, "content": "Paris: 21 degrees."}  # a result that opens with the call's argument
    loader = (
        pp.from_iterable([{"idx": 0, "messages": [ASK, calling(""), echo, ANSWER], "tools": [pb.WEATHER]}])
        .chat(str(folder))
        .pack(4096, batch_size=1, keep=("idx",))
        .loader()
    )
    (row,) = pb.packed_rows(loader)
    eot = tok.eos_token
    assert tok.decode([i for i, x in zip(row["ids"], row["labels"]) if x != -100]) == f"{eot}It is 21 in Paris.{eot}"


def test_an_answer_after_a_result_starts_after_the_result_written_in_json_that_an_earlier_message_holds_as_is(
    tokenizers: dict[str, tuple[Path, Any]],
) -> None:
    """gpt-oss writes a tool's result as a JSON string; the user's message holds the same text as it is."""
    folder, tok = tokenizers["gpt_oss"]
    second = {**CALL, "id": "bcdefghij", "function": {"name": "get_weather", "arguments": {"city": "Lima"}}}
    chat = [
        {"role": "user", "content": TOOL["content"]},
        calling(thinking="Ask the tool."),
        {**TOOL, "content": "Cold."},
        {"role": "assistant", "content": None, "tool_calls": [second]},
        {**TOOL, "tool_call_id": "bcdefghij"},  # the user's text, written in JSON here
        ANSWER,
    ]
    row = {"messages": chat, "tools": [pb.WEATHER]}
    loader = pp.from_iterable([{"idx": 0, **row}]).chat(str(folder)).pack(4096, keep=("idx",)).loader()
    times: Counter[int] = Counter()
    for packed in pb.packed_rows(loader):
        times.update(check_row("gpt_oss", tok, row, packed).keys())
    assert times == {1: 1, 3: 1, 5: 1}


@pytest.mark.parametrize("name", list(pb.MODELS))
def test_an_answer_its_reasoning_holds_is_trained_on_its_reference_span(
    name: str, tokenizers: dict[str, tuple[Path, Any]]
) -> None:
    """The answer "4." is in its reasoning "2+2 makes 4." too: its span ends after it (gpt-oss ends it after the
    analysis, and its final "4.<|return|>" is never trained)."""
    folder, tok = tokenizers[name]
    how = pb.MODELS[name].reasoning[0]
    answer = {"role": "assistant", "content": "<think>\n2+2 makes 4.\n</think>\n\n4."} if how == "think" else {
        "role": "assistant", "content": "4.", how: "2+2 makes 4."}  # fmt: skip
    row = {"messages": [{"role": "user", "content": "2+2?"}, answer], "tools": [pb.WEATHER]}
    loader = pp.from_iterable([{"idx": 0, **row}]).chat(str(folder)).pack(8192, keep=("idx",)).loader()
    (packed,) = pb.packed_rows(loader)
    assert set(check_row(name, tok, row, packed)) == {1}


def test_a_message_written_in_json_bounds_the_turn_before_it_where_a_later_message_holds_its_text_as_is(
    tokenizers: dict[str, tuple[Path, Any]],
) -> None:
    """Llama 3.1 writes a tool's result in JSON; the user quotes it as is later: the call's turn ends at the result."""
    folder, tok = tokenizers["llama3_1"]
    chat = [ASK, calling("Paris"), TOOL, ANSWER, {"role": "user", "content": f"{TOOL['content']}?"}, HI[1]]
    row = {"messages": chat, "tools": [pb.WEATHER]}
    loader = pp.from_iterable([{"idx": 0, **row}]).chat(str(folder)).pack(4096, keep=("idx",)).loader()
    times: Counter[int] = Counter()
    for packed in pb.packed_rows(loader):
        times.update(check_row("llama3_1", tok, row, packed).keys())
    assert times == {1: 1, 3: 1, 5: 1}
