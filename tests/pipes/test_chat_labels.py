"""The chat stage's prompt/completion form (lists of messages, and plain text as TRL tokenizes it) and truncation
that never trains on nothing: ids stay a prefix of the whole conversation's, rows left with no trained token are
dropped and counted, and no row with only -100 labels is ever yielded."""

from __future__ import annotations

import random
from typing import Any

import pytest
from tokenizers import Tokenizer, processors

import padpipe as pp
from padpipe.stats import PipelineStats
from tests import chat_fixtures as fx
from tests.pipes.test_chat import answers, expected_labels, rows_of, trained_texts

transformers = pytest.importorskip("transformers")


def split(chat: list[dict[str, Any]]) -> dict[str, Any]:
    """A conversation as a prompt (all but the last answer) and its completion (the last answer)."""
    return {"prompt": chat[:-1], "completion": chat[-1:]}


@pytest.mark.parametrize("name", ["chatml", "llama3", "mistral"])
def test_chat_prompt_completion_lists_train_the_completion(name: str) -> None:
    tok = fx.tokenizer(name=name)
    chats = fx.conversations(16, seed=11)
    eot = {"chatml": "<|im_end|>", "llama3": "<|eot_id|>", "mistral": "</s>"}[name]
    rows = rows_of(pp.from_iterable([split(c) for c in chats]).chat(tok, prompt="prompt", completion="completion"))
    for row, chat in zip(rows, chats):
        assert row["ids"] == fx.reference(tok, chat)
        assert row["labels"] == expected_labels(tok, chat, answers(chat)[-1:], eot)
    for row in rows_of(
        pp.from_iterable([split(c) for c in chats]).chat(tok, prompt="prompt", completion="completion", train_on="all")
    ):
        assert row["labels"] == row["ids"]


def test_chat_prompt_completion_trains_all_of_a_longer_completion_but_the_last_separator() -> None:
    tok = fx.tokenizer(name="qwen25")
    chat = fx.tool_conversation()
    row = {"prompt": chat[:1], "completion": chat[1:], "tools": [fx.WEATHER_TOOL]}
    (out,) = rows_of(pp.from_iterable([row]).chat(tok, prompt="prompt", completion="completion"))
    text = tok.apply_chat_template(chat, tools=[fx.WEATHER_TOOL], tokenize=False)
    head = tok.apply_chat_template(chat[:1], tools=[fx.WEATHER_TOOL], tokenize=False, add_generation_prompt=True)
    assert out["ids"] == fx.reference(tok, chat, tools=[fx.WEATHER_TOOL])
    assert trained_texts(tok, out) == [text[len(head) : -1]]  # through the last <|im_end|>, not the '\n' after it


def test_chat_prompt_completion_strings_are_tokenized_as_trl_does() -> None:
    tok = fx.tokenizer(None)
    rows = [
        {"prompt": "The capital of France is", "completion": " Paris."},
        {"prompt": "Answer: ", "completion": "yes"},  # ' yes' is one token across the boundary: trained
        {"prompt": "", "completion": "Done.<|endoftext|>"},  # already ends with the EOS: not twice
    ]
    out = rows_of(pp.from_iterable(rows).chat(tok, prompt="prompt", completion="completion"))
    for row, source in zip(out, rows):
        completion = source["completion"].removesuffix("<|endoftext|>") + "<|endoftext|>"
        assert row["ids"] == tok(source["prompt"] + completion)["input_ids"]
        assert tok.decode([t for t in row["labels"] if t != -100]) == (" yes" if row is out[1] else "") + (
            completion if row is not out[1] else "<|endoftext|>"
        )


def test_chat_prompt_completion_strings_leave_a_bos_untrained_and_train_an_added_eos() -> None:
    rust = Tokenizer.from_str(fx._trained())
    bos, eos = rust.token_to_id("<|begin_of_text|>"), rust.token_to_id("<|eot_id|>")
    rust.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A <|eot_id|>", special_tokens=[("<|begin_of_text|>", bos), ("<|eot_id|>", eos)]
    )
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=rust, eos_token="<|endoftext|>")
    (row,) = rows_of(pp.from_iterable([{"p": "Say hi.", "c": " Hi!"}]).chat(tok, prompt="p", completion="c"))
    assert row["ids"] == tok("Say hi. Hi!<|endoftext|>")["input_ids"]
    assert row["ids"][0] == bos and row["ids"][-1] == eos
    assert tok.decode([t for t in row["labels"] if t != -100]) == " Hi!<|endoftext|><|eot_id|>"


def test_chat_keep_start_truncation_keeps_a_prefix_and_drops_rows_left_untrained() -> None:
    tok = fx.tokenizer(name="chatml")
    chats = fx.conversations(60, seed=12, system=0.5, words=(1, 4))
    stats = PipelineStats()
    source = pp.from_iterable([{"messages": c, "idx": i} for i, c in enumerate(chats)])
    rows = rows_of(source.chat(tok, max_length=96), stats)
    full = {i: expected_labels(tok, c, answers(c), "<|im_end|>") for i, c in enumerate(chats)}
    untrained = [i for i, labels in full.items() if all(x == -100 for x in labels[:96])]
    assert untrained and [r["idx"] for r in rows] == [i for i in range(len(chats)) if i not in untrained]
    for row in rows:
        assert row["ids"] == fx.reference(tok, chats[row["idx"]])[:96]
        assert row["labels"] == full[row["idx"]][:96]
    snap = stats.snapshot()
    assert snap.skipped == {"chat.no_trained_tokens": len(untrained)}
    assert snap.counters["chat.truncated"] == sum(len(fx.reference(tok, c)) > 96 for c in chats) - len(untrained)


def test_chat_turns_truncation_cuts_after_the_last_whole_answer() -> None:
    tok = fx.tokenizer(name="llama3")
    chats = fx.conversations(60, seed=13, turns=(2, 4))
    stats = PipelineStats()
    rows = rows_of(
        pp.from_iterable([{"messages": c, "idx": i} for i, c in enumerate(chats)]).chat(
            tok, max_length=160, truncation="turns"
        ),
        stats,
    )
    eot = tok.convert_tokens_to_ids("<|eot_id|>")
    kept = {r["idx"] for r in rows}
    for row in rows:
        chat = chats[row["idx"]]
        whole, labels = fx.reference(tok, chat), expected_labels(tok, chat, answers(chat), "<|eot_id|>")
        assert row["ids"] == whole[: len(row["ids"])] and len(row["ids"]) <= 160
        assert row["labels"] == labels[: len(row["ids"])]
        if len(whole) > 160:  # cut right after an answer's end-of-turn token: no answer is trained in part
            assert row["labels"][-1] == eot
    for i, chat in enumerate(chats):
        if i not in kept:  # no whole answer fits
            labels = expected_labels(tok, chat, answers(chat), "<|eot_id|>")
            first_end = next(j for j, t in enumerate(labels) if t == eot) + 1
            assert first_end > 160
    assert stats.snapshot().skipped.get("chat.no_trained_tokens", 0) == len(chats) - len(kept)


def test_chat_never_yields_a_row_without_a_trained_token() -> None:
    tok = fx.tokenizer(name="gemma")
    rng = random.Random(14)
    chats = fx.conversations(60, seed=14, system=0.0, words=(1, 3))
    for chat in chats:
        for message in chat:
            if rng.random() < 0.3:
                message["training"] = rng.random() < 0.3
    chats.append([{"role": "user", "content": "Nobody answers."}])
    stats = PipelineStats()
    source = pp.from_iterable([{"messages": c, "idx": i} for i, c in enumerate(chats)])
    for train_on, max_length, truncation in [
        ("assistant", None, "keep_start"),
        ("last", 64, "keep_start"),
        ("assistant", 64, "turns"),
        ("last", 128, "turns"),
    ]:
        rows = rows_of(source.chat(tok, train_on=train_on, max_length=max_length, truncation=truncation), stats)
        assert rows and all(any(x != -100 for x in row["labels"]) for row in rows)
        assert all(max_length is None or len(row["ids"]) <= max_length for row in rows)
    assert stats.snapshot().skipped["chat.no_trained_tokens"] > 0
