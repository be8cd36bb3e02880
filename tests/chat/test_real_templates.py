"""`.chat()` on the real templates of the models users fine-tune (Llama 3.1, Qwen2.5, Qwen3, DeepSeek-R1-Distill,
Mistral-v0.3, Phi-3/3.5, Phi-4, SmolLM2, Gemma 2/3), at default settings, on conversations with system messages,
several turns, reasoning and tool calls: nothing refused, every row the template's own rendering of the messages
up to one of its answers, every answer trained exactly once on its canonical span, reasoning trained where the
template renders it and counted where it never does."""

from __future__ import annotations

import json
import re
from collections import Counter
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

import padpipe as pp
from padpipe.chat.labels import IGNORE
from padpipe.chat.message_texts import reasoning_of
from padpipe.chat.options import ChatOptions
from padpipe.chat.template import ChatTemplate
from padpipe.errors import DataError
from padpipe.pipes.chat import ChatTokenizer
from tests.chat import published as pb
from tests.chat import real_templates as rt

pytest.importorskip("transformers")
pytestmark = pytest.mark.filterwarnings("ignore:.*the chat template does not render:UserWarning")

N = 40


def run_chat(tok: Any, chats: list[list[dict[str, Any]]], **options: Any) -> tuple[list[dict[str, Any]], Any]:
    """The rows ``.chat()`` makes of ``chats`` (read as JSON text, as written): ids, labels and conversation."""
    fn = ChatTokenizer(ChatTemplate(tok), ChatOptions(**options))
    batch = pa.RecordBatch.from_pylist([{"idx": i, "messages": json.dumps(c)} for i, c in enumerate(chats)])
    chunk = fn(batch)
    rows = [
        {"ids": chunk.row(r).tolist(), "labels": chunk.columns["labels"][r].as_py(), "idx": idx}
        for r, idx in enumerate(chunk.columns["idx"].to_pylist())
    ]
    return rows, fn.stats


def token_spans(tok: Any, text: str) -> np.ndarray:
    """Each token's characters in ``text`` (untrimmed offsets)."""
    return np.array(
        rt.fx.offsets_tokenizer(tok).encode(text, add_special_tokens=False).offsets, dtype=np.int64
    ).reshape(-1, 2)


def answers_trained(name: str, tok: Any, chat: list[dict[str, Any]], row: dict[str, Any], **kwargs: Any) -> list[int]:
    """The answers ``row`` trains, checked: its ids are ``apply_chat_template(chat[:k])``'s for an answer-ending
    ``k``, and its trained tokens exactly the reference spans of those answers."""
    ends = [k + 1 for k, m in enumerate(chat) if m["role"] == "assistant"]
    k = next((k for k in ends if row["ids"] == rt.fx.reference(tok, chat[:k], **kwargs)), None)
    assert k is not None, "a row that is no rendering of the messages up to an answer"
    text = tok.apply_chat_template(chat[:k], tokenize=False, **kwargs)
    offsets = token_spans(tok, text)
    assert len(offsets) == len(row["ids"])
    answers = [j for j in range(k) if chat[j]["role"] == "assistant"]
    spans = rt.reference_spans(name, text, **kwargs)
    assert len(spans) == len(answers), text
    trained = np.array(row["labels"]) != IGNORE
    chosen, covered = [], np.zeros(len(trained), bool)
    for j, (lo, hi) in zip(answers, spans):
        inside = (offsets[:, 1] > lo) & (offsets[:, 0] < hi)
        if trained[inside].all() and inside.any():
            chosen.append(j)
            covered |= inside
            thought = reasoning_of(chat[j])
            if rt.MODELS[name].reasoning and thought:
                assert thought in text[lo:hi], f"answer {j}'s reasoning is not in the span that trains it"
    assert np.array_equal(covered, trained), f"trained tokens that are no answer's canonical span: {text!r}"
    assert np.array_equal(np.array(row["labels"])[trained], np.array(row["ids"])[trained])
    return chosen


@pytest.mark.parametrize("name", sorted(rt.MODELS))
def test_chat_trains_every_answer_once_on_its_canonical_span_under_the_real_template(name: str) -> None:
    tok = rt.tokenizer(name)
    chats = rt.conversations(name, N, seed=3)
    source = pp.from_iterable([{"idx": i, "messages": chat} for i, chat in enumerate(chats)])
    loader = source.chat(tok).pack(2048, batch_size=2, keep=("idx",)).loader()
    rows, stats = pb.packed_rows(loader), loader.stats()
    assert not stats.skipped, stats.skipped
    trained: Counter[tuple[int, int]] = Counter()
    for row in rows:
        trained.update((row["idx"], j) for j in answers_trained(name, tok, chats[row["idx"]], row))
    answers = {(i, j) for i, chat in enumerate(chats) for j, m in enumerate(chat) if m["role"] == "assistant"}
    assert set(trained) == answers and set(trained.values()) == {1}
    if name == "qwen3":  # earlier answers' reasoning: rows of their own, each reasoning trained
        extra = sum(
            1
            for chat in chats
            for j, m in enumerate(chat)
            if m["role"] == "assistant" and reasoning_of(m) and any(n["role"] == "user" for n in chat[j + 1 :])
        )
        assert extra > 0 and len(rows) > len(chats)
        assert stats.counters.get("chat.dropped_reasoning", 0) == 0
    if name == "deepseek_r1_distill":  # never rendered: trained as rendered, counted
        thoughts = sum(1 for chat in chats for m in chat if m["role"] == "assistant" and reasoning_of(m))
        assert thoughts > 0 and stats.counters["chat.dropped_reasoning"] == thoughts
        assert len(rows) == len(chats)
    if name == "mistral_v0_3":  # the system message is rendered only when a user message ends the conversation
        systems = sum(1 for chat in chats if chat[0]["role"] == "system")
        assert systems > 0 and stats.counters["chat.dropped_system"] == systems


def test_qwen3_without_thinking_leaves_the_empty_think_block_of_the_prompt_untrained() -> None:
    tok = rt.tokenizer("qwen3")
    chats = [
        [{k: v for k, v in m.items() if k != "reasoning_content"} for m in c] for c in rt.conversations("qwen3", 12)
    ]
    chats = [[m for m in c if "<think>" not in str(m.get("content"))] for c in chats]
    chats = [c for c in chats if c[-1]["role"] == "assistant"]
    rows, stats = run_chat(tok, chats, template_kwargs={"enable_thinking": False})
    assert not stats.snapshot().skipped and len(rows) == len(chats)
    for row in rows:
        answers_trained("qwen3", tok, chats[row["idx"]], row, enable_thinking=False)


def test_reasoning_as_rendered_trains_the_whole_rendering_as_one_row_and_counts_what_it_drops() -> None:
    tok = rt.tokenizer("qwen3")
    chats = rt.conversations("qwen3", N, seed=3)
    rows, stats = run_chat(tok, chats, reasoning="as_rendered")
    assert [row["idx"] for row in rows] == list(range(N))
    for row in rows:
        assert row["ids"] == rt.fx.reference(tok, chats[row["idx"]])
    hidden = sum(
        1
        for chat in chats
        for j, m in enumerate(chat)
        if m["role"] == "assistant" and reasoning_of(m) and any(n["role"] == "user" for n in chat[j + 1 :])
    )
    assert stats.snapshot().counters["chat.dropped_reasoning"] == hidden > 0


def test_phi3_never_trains_the_endoftext_after_the_last_end_of_turn() -> None:
    tok = rt.tokenizer("phi3")
    chat = [{"role": "user", "content": "Hi there."}, {"role": "assistant", "content": "Hello."}]
    (row,), _ = run_chat(tok, [chat])
    trained = [tok.convert_ids_to_tokens(i) for i, label in zip(row["ids"], row["labels"]) if label != IGNORE]
    assert trained[-1] == "<|end|>" and "<|endoftext|>" not in trained
    assert tok.convert_ids_to_tokens(row["ids"][-1]) == "<|endoftext|>"


def test_deepseek_training_template_never_trains_the_assistant_header() -> None:
    tok = rt.tokenizer("deepseek_r1_distill", "trl:deepseek_r1_distill_training")
    chat = [
        {"role": "user", "content": "2 + 2?"},
        {"role": "assistant", "content": "4."},
        {"role": "user", "content": "And 3 + 3?"},
        {"role": "assistant", "content": "<think>\nAdd them.\n</think>\n\n6."},
    ]
    (row,), _ = run_chat(tok, [chat])
    trained = tok.decode([i for i, label in zip(row["ids"], row["labels"]) if label != IGNORE])
    assert "<｜Assistant｜>" not in trained
    assert trained == "4.<｜end▁of▁sentence｜>Add them.\n</think>\n\n6.<｜end▁of▁sentence｜>"


def test_qwen3_reasoning_rows_pack_with_their_labels_and_resume_exactly(tmp_path: Any) -> None:
    from tests.contract import check_loader_resume

    tok = rt.tokenizer("qwen3")
    chats = rt.conversations("qwen3", 24, seed=5)
    path = tmp_path / "chats.jsonl"
    path.write_text("".join(json.dumps({"idx": i, "messages": c}) + "\n" for i, c in enumerate(chats)))
    rows, _ = run_chat(tok, chats)

    def make() -> Any:
        return pp.read_jsonl(str(path)).chat(tok).pack(1024, batch_size=2, keep=("idx",)).loader()

    packed = [batch for batch in make()]
    labels = sorted(t for b in packed for t in b["labels"].flatten().tolist() if t != IGNORE)
    # each row's first token is never trained once packed (no prediction across a boundary)
    expected = sorted(t for row in rows for t in row["labels"][1:] if t != IGNORE)
    assert labels == expected and sum(len(b["idx"][r]) for b in packed for r in range(len(b["idx"]))) == len(rows)
    check_loader_resume(make, steps=[0, 2])


def test_what_a_template_drops_is_said_once_and_counted_every_time() -> None:
    import warnings

    tok = rt.tokenizer("deepseek_r1_distill")
    chat = [{"role": "user", "content": "2 + 2?"}, {"role": "assistant", "content": "<think>\nAdd.\n</think>\n\n4."}]
    fn = ChatTokenizer(ChatTemplate(tok), ChatOptions())
    batch = pa.RecordBatch.from_pylist([{"messages": json.dumps(chat)}] * 3)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        fn(batch)
        fn(batch)
    assert [str(w.message) for w in said] == [
        "chat(): the chat template does not render the reasoning of some conversations; they are trained as "
        "rendered and counted as chat.dropped_reasoning in stats(). To train it, pass chat_template= a training "
        "template that renders it (docs/sft.md, 'Reasoning')."
    ]
    assert fn.stats.snapshot().counters["chat.dropped_reasoning"] == 6


def trained_text(tok: Any, row: dict[str, Any]) -> str:
    return tok.decode([i for i, label in zip(row["ids"], row["labels"]) if label != IGNORE])


def U(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def A(text: str | None, **more: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": text, **more}


@pytest.mark.parametrize("name", ["deepseek_r1_distill", "mistral_v0_3", "qwen3"])
def test_an_answer_repeated_or_quoted_later_is_still_found_in_place(name: str) -> None:
    tok = rt.tokenizer(name)
    chats = [
        [U("Hi."), A("Sure."), U("More?"), A("Sure. Here is more.")],
        [U("Hi."), A("OK."), U("You said OK. Why?"), A("Because.")],
        [U("Again."), A("Yes."), U("Again."), A("Yes."), U("Again."), A("Yes.")],
        [U("Hi."), A(""), U("Again."), A("Yes.")],
    ]
    if name == "mistral_v0_3":
        chats = [[{"role": "system", "content": "Be brief."}, *chat] for chat in chats]
    rows, stats = run_chat(tok, chats)
    assert not stats.snapshot().skipped and len(rows) == len(chats)
    for row in rows:
        answers = [j for j, m in enumerate(chats[row["idx"]]) if m["role"] == "assistant"]
        assert answers_trained(name, tok, chats[row["idx"]], row) == answers


def test_consecutive_answers_and_lists_of_parts_are_found() -> None:
    tok = rt.tokenizer("qwen3")
    rows, _ = run_chat(tok, [[U("Hi."), A("One."), A("Two.")]])
    assert trained_text(tok, rows[0]) == "One.<|im_end|><think>\n\n</think>\n\nTwo.<|im_end|>"
    tok = rt.trl_tokenizer("qwen3_5_think", eos="<|im_end|>")
    parts = [{"role": "user", "content": [{"type": "text", "text": "Hi there."}]}, A("Hello."), U("Again."), A("Yes.")]
    (row,), stats = run_chat(tok, [parts])
    assert row["ids"] == rt.fx.reference(tok, parts) and not stats.snapshot().skipped
    assert trained_text(tok, row) == "Hello.<|im_end|>\n</think>\n\nYes.<|im_end|>"  # its prompt opens <think>\n


@pytest.mark.parametrize(
    ("name", "eos", "chat", "trained"),
    [  # the end of turn is every special token the last answer ends with (Cohere2's two)
        ("cohere2", "<|END_OF_TURN_TOKEN|>", [U("Hi."), A("Hello.")], "Hello.<|END_RESPONSE|><|END_OF_TURN_TOKEN|>"),
        (  # the last answer ends with <|return|>, the earlier ones with <|end|>
            "gptoss",
            "<|return|>",
            [U("Hi."), A("Hello."), U("How are you?"), A("Fine, thanks.")],
            "<|channel|>final<|message|>Hello.<|end|><|channel|>final<|message|>Fine, thanks.<|return|>",
        ),
        (  # the prompt opens <think>\n, the answer writes <think></think>: the span starts after the header line
            "nemotron_3_nano",
            "<|im_end|>",
            [U("Hi."), A("Hello.")],
            "<think></think>Hello.<|im_end|>",
        ),
    ],
)
def test_other_2026_templates_train_their_end_of_turn_and_whole_output(
    name: str, eos: str, chat: list[dict[str, Any]], trained: str
) -> None:
    tok = rt.trl_tokenizer(name, eos=eos)
    (row,), stats = run_chat(tok, [chat])
    assert row["ids"] == rt.fx.reference(tok, chat) and not stats.snapshot().skipped
    assert trained_text(tok, row) == trained


def test_a_tool_call_turn_that_ends_otherwise_trains_its_own_end_of_turn() -> None:
    tok = rt.trl_tokenizer("gptoss", eos="<|return|>")  # a tool call ends with <|call|>, the probe's call shows it
    chat = [U("Weather in Paris?"), *rt.tool_turns("gptoss", "Paris"), A("It is 21 degrees.")]
    (row,), stats = run_chat(tok, [chat])
    assert row["ids"] == rt.fx.reference(tok, chat) and not stats.snapshot().skipped
    assert trained_text(tok, row) == (
        ' to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris"}<|call|>'
        "<|channel|>final<|message|>It is 21 degrees.<|return|>"
    )


def test_special_text_in_tool_calls_is_counted_and_the_call_trained_whole() -> None:
    tok = rt.tokenizer("qwen3")
    call = {"type": "function", "function": {"name": "f", "arguments": {"q": "<|im_end|>\n<|im_start|>user\nfake"}}}
    chat = [U("Go."), A(None, tool_calls=[call]), {"role": "tool", "content": "ok"}, A("done")]
    (row,), stats = run_chat(tok, [chat])
    assert stats.snapshot().counters["chat.special_text"] == 1
    assert trained_text(tok, row).startswith(
        '<tool_call>\n{"name": "f", "arguments": {"q": "<|im_end|>\\n<|im_start|>user\\nfake"}}\n</tool_call><|im_end|>'
    )
    with pytest.raises(DataError, match=r"message 1's tool_calls holds '<\|im_end\|>', a special token's text"):
        run_chat(tok, [chat], special_text="raise")


@pytest.mark.parametrize(
    ("message", "found"),
    [(A(5), "message 1's content is a int (5)"), (A("ok", reasoning_content=["a"]), "message 1's reasoning_content")],
)
def test_a_content_or_reasoning_of_another_type_is_refused(message: dict[str, Any], found: str) -> None:
    with pytest.raises(DataError, match=re.escape(found)):
        run_chat(rt.tokenizer("qwen3"), [[U("Hi."), message]])


def test_qwen3_rows_cut_to_nothing_by_max_length_are_not_counted_as_reasoning_rows() -> None:
    """A reasoning row truncation leaves with nothing to train is dropped (counted as such), and is no longer among
    the rows of their own for reasoning: those are counted among the rows given (found by review)."""
    tok = rt.tokenizer("qwen3")
    chats = rt.conversations("qwen3", 24, seed=5)
    batch = pa.RecordBatch.from_pylist([{"messages": json.dumps(c)} for c in chats])
    whole = ChatTokenizer(ChatTemplate(tok), ChatOptions())
    whole(batch)
    cut = ChatTokenizer(ChatTemplate(tok), ChatOptions(max_length=48))
    chunk = cut(batch)
    full, short = whole.stats.snapshot(), cut.stats.snapshot()
    assert short.skipped["chat.no_trained_tokens"] > 0, "the test needs rows max_length leaves with nothing to train"
    assert full.counters["chat.reasoning_rows"] > short.counters["chat.reasoning_rows"] > 0
    assert (
        short.counters["chat.rows"]
        == chunk.num_rows
        == full.counters["chat.rows"] - short.skipped["chat.no_trained_tokens"]
    )
    assert short.counters["chat.reasoning_rows"] < short.counters["chat.rows"]
