"""The shipped conversations are pp.examples.conversations' own, and the shipped chat tokenizer renders ChatML."""

from __future__ import annotations

import gzip
import json

import pytest

import padpipe as pp

pytest.importorskip("transformers")


def test_shipped_conversations_are_what_the_generator_makes() -> None:
    with gzip.open(pp.examples.CHATS_JSONL, "rt", encoding="utf-8") as f:
        shipped = [json.loads(line) for line in f]
    assert shipped == pp.examples.conversations(1000, seed=0)
    assert pp.examples.conversations(3, seed=5) == pp.examples.conversations(3, seed=5) != pp.examples.conversations(3)
    roles = [[m["role"] for m in row["messages"] if m["role"] != "system"] for row in shipped]
    assert all(r[::2] == ["user"] * (len(r) // 2) and r[1::2] == ["assistant"] * (len(r) // 2) for r in roles)


def test_shipped_chat_tokenizer_renders_chatml_with_its_control_tokens_whole() -> None:
    tok = pp.examples.chat_tokenizer()
    chat = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
    text = tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=False)
    assert text == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello<|im_end|>\n"
    assert (tok.eos_token, tok.pad_token, len(tok)) == ("<|endoftext|>", "<|pad|>", 4100)
    for token in ("<|im_start|>", "<|eot_id|>", "<start_of_turn>", "[INST]", "</s>"):
        assert tok.tokenize(f"a{token}b")[1] == token
