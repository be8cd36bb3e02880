"""``pp.inspect`` / ``padpipe inspect`` on conversations: read and rendered as ``.chat()`` does, its figures equal a
real ``.chat()`` pass (rows, conversations, trained tokens, reasoning rows, what ``max_length`` cuts and drops), and
the strategies equal real passes of the ``sft`` stages."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

import padpipe as pp
from padpipe.cli import main
from tests import chat_fixtures as fx
from tests.inspection.test_inspect import check_equals_real_passes, real_pass

pytestmark = pytest.mark.filterwarnings("ignore:.*the chat template does not render:UserWarning")


def qwen3() -> Any:
    """A tokenizer with Qwen3's own template (TRL's copy) and control tokens."""
    from tests.chat import real_templates as rt

    return rt.tokenizer("qwen3")


def _call(arguments: Any) -> dict[str, Any]:
    return {
        "role": "assistant",
        "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": arguments}}],
    }


def tool_chats(n: int) -> list[dict[str, Any]]:
    """Conversations with a tool call whose arguments Arrow cannot type across rows (a string, then a list of a
    string and a number), reasoning in some answers (Qwen3 renders it only after the last user message)."""
    rows = []
    for i, chat in enumerate(fx.conversations(n, seed=4, turns=(1, 3))):
        chat = [dict(m) for m in chat]
        if i % 3 == 0:
            chat[-1:-1] = [
                _call({"city": "Oslo"} if i % 2 else {"city": ["Oslo", 3]}),
                {"role": "tool", "content": "ok"},
            ]
        for k, message in enumerate(chat):
            if message["role"] == "assistant" and message.get("content") and (i + k) % 2:
                message["reasoning_content"] = f"Think {i} {k}."
        rows.append({"messages": chat, "id": i})
    return rows


@pytest.fixture(scope="module")
def chats(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("chats") / "chats.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in tool_chats(240)))
    return str(path)


def test_inspect_reads_conversations_whose_tool_arguments_fail_arrows_typing(chats: str) -> None:
    with pytest.raises(pp.DataError, match=r"arguments\.city\.\[\]' is a number, expected a string"):
        list(pp.read_jsonl(chats).loader())  # what a plain read of the file does
    tok = qwen3()
    result = pp.inspect(chats, tok, sample=None, shuffle_buffer=0, progress=False)
    stats = real_pass(pp.read_jsonl(chats).chat(tok).batch(64).pad())  # the stage itself, untruncated, in file order
    chat = result.chat
    assert chat is not None and result.fields == ("messages",) and result.max_length == 2048
    assert (chat.conversations, chat.rows, chat.reasoning_rows) == (
        stats.counters["chat.conversations"],
        stats.counters["chat.rows"],
        stats.counters["chat.reasoning_rows"],
    )
    assert chat.conversations == 240 and chat.rows > 240 and result.rows == chat.rows
    assert (chat.tokens, chat.trained_tokens) == (stats.counters["chat.tokens"], stats.counters["chat.trained_tokens"])
    assert chat.tokens == int(result.lengths.sum()) and chat.truncated_rows == 0 and chat.skipped == {}


@pytest.mark.slow  # seconds alone: make test runs it, test-fast leaves it out
def test_inspect_chat_figures_and_strategies_equal_real_passes_of_sft_stages(chats: str) -> None:
    tok = qwen3()
    result = pp.inspect(
        chats, tok, max_length=96, sample=None, batch_size=8, seq_len=256, buffer_size=200, shuffle_buffer=50,
        seed=2, progress=False,
    )  # fmt: skip
    chat = result.chat
    assert chat is not None and chat.truncated_rows > 0 and chat.emptied_rows > 0
    whole = real_pass(pp.read_jsonl(chats).chat(tok).batch(64).pad()).counters
    cut = real_pass(pp.read_jsonl(chats).chat(tok, max_length=96).batch(64).pad())
    assert chat.truncated_rows == cut.counters["chat.truncated"] + chat.emptied_rows
    assert chat.emptied_rows == cut.skipped["chat.no_trained_tokens"]
    assert chat.trained_cut == whole["chat.trained_tokens"] - cut.counters["chat.trained_tokens"]
    check_equals_real_passes(result, pp.read_jsonl(chats).shuffle(50, seed=2).chat(tok, max_length=96))
    text = str(result)
    assert f"  {chat.conversations} conversations -> {chat.rows} rows ({chat.reasoning_rows} rows of their own" in text
    assert re.search(rf"longer than max_length 96: {chat.truncated_rows} rows .*; {chat.emptied_rows} left with", text)
    advice = result.recommendations()
    assert advice[0].startswith(f"max_length=96 (sft's seq_len) cuts {chat.truncated_rows / chat.rows:.1%} of the rows")
    assert advice[1].startswith(f"reasoning: {chat.reasoning_rows} of {chat.rows} rows are rows of their own")
    assert result.as_dict()["chat"]["reasoning_rows"] == chat.reasoning_rows


def test_inspect_counts_the_conversations_chat_refuses_and_scales_a_sample(chats: str, tmp_path: Any) -> None:
    rows = tool_chats(60) + [{"messages": "not a conversation", "id": 99}]
    path = tmp_path / "some.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    result = pp.inspect(str(path), qwen3(), sample=30, progress=False)
    chat = result.chat
    assert chat is not None and chat.read == 30 and result.scale == result.corpus.rows / 30
    full = pp.inspect(str(path), qwen3(), sample=None, progress=False).chat
    assert full is not None and full.skipped == {"chat.bad_messages": 1} and full.read == 61
    assert ".chat() refuses 1 conversations (chat.bad_messages 1): under on_error='raise'" in "\n".join(
        pp.inspect(str(path), qwen3(), sample=None, progress=False).recommendations()
    )


def test_inspect_chat_refuses_what_it_cannot_do_in_one_line(chats: str) -> None:
    tok = qwen3()
    with pytest.raises(ValueError, match=r"^`fields` is for text; conversations are read from `messages`"):
        pp.inspect(chats, tok, fields="id", messages="messages", progress=False)
    with pytest.raises(ValueError, match=r"^`chat_options` must not repeat inspect's own arguments, but sets "):
        pp.inspect(chats, tok, chat_options={"max_length": 8}, progress=False)
    with pytest.raises(ValueError, match=r"^the conversations \(column 'messages'\) are inspected as \.chat\(\) "):
        pp.inspect(chats, pp.examples.TOKENIZER_JSON, progress=False)


def test_inspect_says_when_chat_drops_every_conversation(tmp_path: Any) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text("".join(json.dumps({"messages": "hello", "id": i}) + "\n" for i in range(3)))
    with pytest.raises(pp.DataError, match=r"chat\(\) drops all 3 conversations read \({'chat\.bad_messages': 3}\)"):
        pp.inspect(str(path), qwen3(), progress=False)


@pytest.mark.slow  # seconds alone
def test_cli_inspects_the_shipped_chats_with_a_chat_template_file(capsys: pytest.CaptureFixture, tmp_path) -> None:
    assert main(["inspect", "chats", "--tokenizer", "chat", "--max-length", "512", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "  1,000 conversations -> 1,000 rows\n" in out
    assert "  longer than max_length 512: 44 rows (4.4%), cutting 5,155 trained tokens (4.7%)\n" in out
    template = tmp_path / "llama3.jinja"
    template.write_text(fx.LLAMA3)
    argv = ["inspect", "chats", "--tokenizer", "chat", "--chat-template", str(template), "--sample", "100"]
    assert main([*argv, "--no-progress"]) == 0
    llama = capsys.readouterr().out
    assert re.search(r"^  100 conversations -> 100 rows$", llama, re.M)
    mean = float(re.search(r"mean (\d+\.\d)", llama).group(1))  # type: ignore[union-attr]
    assert mean > float(re.search(r"mean (\d+\.\d)", out).group(1))  # type: ignore[union-attr]  # Llama 3's headers
    assert main(["inspect", "chats", "--tokenizer", "sample", "--no-progress"]) == 2
    assert capsys.readouterr().err.startswith("padpipe inspect: error: the conversations (column 'messages') are ")
