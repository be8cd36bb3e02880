"""Canonical spans: which messages are trained, a marked block moved to the span, the end after the end-of-turn
token, and the prefix method's checks."""

from __future__ import annotations

import re

import pytest

from padpipe.chat.rows import NOT_PREFIX, TEMPLATE, RowProblem
from padpipe.chat.spans import chosen, message_spans, normalise, trim_end
from padpipe.chat.template import ChatTemplate, Probe
from tests import chat_fixtures as fx

pytest.importorskip("transformers")

END = re.compile(re.escape("<|im_end|>") + "|" + re.escape("<|eot_id|>") + "|" + re.escape("<end_of_turn>"))
CHATML = Probe("<|im_start|>assistant\n", True, "<|im_end|>")


def span(text: str, probe: Probe, start: int, end: int) -> str:
    s, e = normalise(text, start, end, probe, END)
    return text[s:e]


def test_chosen_picks_answers_last_all_and_flags() -> None:
    chat = [{"role": "system"}, {"role": "user"}, {"role": "assistant"}, {"role": "user"}, {"role": "assistant"}]
    assert chosen(chat, "assistant", "training") == ([2, 4], [])
    assert chosen(chat, "last", "training") == ([4], [])
    assert chosen(chat, "all", "training") == ([], [])
    flagged = [dict(m) for m in chat]
    flagged[2]["training"], flagged[1]["training"], flagged[4]["training"] = False, True, None
    assert chosen(flagged, "assistant", "training") == ([1, 4], [])
    assert chosen(flagged, "last", "training") == ([1, 4], [])
    assert chosen(flagged, "all", "training") == ([], [2])
    assert chosen(flagged, "assistant", None) == ([2, 4], [])
    flagged[4]["training"] = False
    assert chosen(flagged, "last", "training") == ([1], [])


def test_normalise_moves_a_block_holding_the_headers_newline_and_the_separator() -> None:
    text = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello there<|im_end|>\n"
    start = text.index("assistant") + len("assistant")  # TRL's Qwen2.5 block: '\n' + content + '<|im_end|>\n'
    assert span(text, CHATML, start, len(text)) == "Hello there<|im_end|>"


def test_normalise_moves_a_block_holding_the_whole_header() -> None:
    text = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello<|im_end|>\n"
    assert span(text, CHATML, text.index("<|im_start|>assistant"), len(text)) == "Hello<|im_end|>"


def test_normalise_extends_a_block_of_the_content_only_through_the_end_of_turn_token() -> None:
    text = "<start_of_turn>model\nHello<end_of_turn>\n"
    probe = Probe("<start_of_turn>model\n", True, "<end_of_turn>")
    assert span(text, probe, text.index("Hello"), text.index("<end_of_turn>")) == "Hello<end_of_turn>"


def test_normalise_keeps_a_canonical_block_and_content_that_starts_like_the_prompt() -> None:
    text = "<|start_header_id|>assistant<|end_header_id|>\n\n\n\nHi<|eot_id|>"
    probe = Probe("<|start_header_id|>assistant<|end_header_id|>\n\n", True, "<|eot_id|>")
    start = text.index("\n\n\n\nHi") + 2  # the content itself opens with two newlines
    assert span(text, probe, start, len(text)) == "\n\nHi<|eot_id|>"


def test_trim_end_stops_after_the_last_special_token_only_before_whitespace() -> None:
    assert trim_end("Hi<|im_end|>\n", 0, 13, END) == 12
    assert trim_end("Hi<|im_end|> and more", 0, 21, END) == 21  # text after it: no end-of-turn token to stop at
    assert trim_end("Hi\n\n", 0, 4, END) == 4  # a template without special tokens: the whole turn


def test_message_spans_by_prefixes_equal_the_marked_ones() -> None:
    marked, plain = (
        ChatTemplate(fx.tokenizer(name="llama3_marked")),
        ChatTemplate(fx.tokenizer(fx.LLAMA3_MARKED, bos_token="<|begin_of_text|>")),
    )
    for chat in fx.conversations(10, seed=4):
        answers = [k for k, m in enumerate(chat) if m["role"] == "assistant"]
        (full,), (blocks,) = marked.render([chat], markers=True)
        by_markers = message_spans(marked, chat, answers, full=full, blocks=blocks, tools=None, kwargs={})
        by_prefixes = message_spans(plain, chat, answers, full=full, blocks=None, tools=None, kwargs={})
        assert by_markers == by_prefixes
        assert all(full[e - len("<|eot_id|>") : e] == "<|eot_id|>" for _, e in by_markers)


def test_message_spans_find_every_answer_where_a_prefix_renders_otherwise() -> None:
    template = ChatTemplate(fx.tokenizer(name="qwen3"))  # earlier answers lose the think block the last one has
    chat = fx.conversations(1, seed=1, turns=(2, 2), system=0.0)[0]
    (full,), _ = template.render([chat])
    first, last = message_spans(template, chat, [1, 3], full=full, blocks=None, tools=None, kwargs={})
    assert full[first[0] : first[1]] == chat[1]["content"] + "<|im_end|>"
    assert full[last[0] : last[1]] == "<think>\n\n</think>\n\n" + chat[3]["content"] + "<|im_end|>"


UPPER = (
    "{% for m in messages %}<{{ m.role }}>{{ m.content if loop.revindex <= 2 else m.content | upper }}[SEP]"
    "{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)
"""Messages before the last two upper-cased: no rendering of a prefix shows where an earlier answer starts."""


def test_message_spans_name_the_message_and_the_text_a_prefix_renders_otherwise() -> None:
    template = ChatTemplate(fx.tokenizer(UPPER, eos_token="[SEP]"))
    chat = [
        {"role": "user", "content": t} if i % 2 == 0 else {"role": "assistant", "content": t}
        for i, t in enumerate(["hi", "yes", "ok", "no"])
    ]
    (full,), _ = template.render([chat])
    with pytest.raises(RowProblem) as caught:
        message_spans(template, chat, [1, 3], full=full, blocks=None, tools=None, kwargs={})
    assert caught.value.reason == NOT_PREFIX
    assert str(caught.value) == (
        "message 1: the template renders message 0 otherwise alone than in the whole conversation, from "
        "character 6: 'hi[SEP]<assistant>' alone against 'HI[SEP]<assistant>YES[SEP]<user>ok[SEP]<assistant>no[SEP]'"
    )


def test_message_spans_raise_a_row_problem_when_a_prefix_fails_to_render() -> None:
    template = ChatTemplate(fx.tokenizer(name="mistral"))
    chat = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}, {"role": "assistant", "content": "c"}]
    with pytest.raises(RowProblem) as caught:
        message_spans(template, chat, [2], full="", blocks=None, tools=None, kwargs={})
    assert caught.value.reason == TEMPLATE
    assert str(caught.value) == (
        "the chat template raised TemplateError: Conversation roles must alternate user/assistant/user/assistant/..."
    )
