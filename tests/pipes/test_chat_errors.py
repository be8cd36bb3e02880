"""The chat stage's errors: settings refused at ``.chat()`` in one line; bad rows a ``DataError`` naming the file and
row (or, under ``on_error="skip"``, dropped and counted by reason)."""

from __future__ import annotations

import dataclasses
import inspect
import json
import re
from pathlib import Path
from typing import Any

import pytest

import padpipe as pp
from padpipe.chat.options import ChatOptions
from padpipe.errors import DataError
from padpipe.stats import PipelineStats
from tests import chat_fixtures as fx
from tests.pipes.test_chat import rows_of

pytest.importorskip("transformers")

GOOD = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def first_error(pipe: pp.Pipeline) -> str:
    with pytest.raises(DataError) as caught:
        rows_of(pipe)
    return str(caught.value)


def test_chat_raises_error_at_once_without_a_chat_template() -> None:
    source = pp.from_iterable([{"messages": GOOD}])
    with pytest.raises(
        ValueError,
        match=r"^chat\(\) needs a chat template, but the tokenizer \(TokenizersBackend\) has "
        r"none and no `chat_template=` was given: pass chat_template= a Jinja template string\.$",
    ):
        source.chat(fx.tokenizer(None))
    (row,) = rows_of(source.chat(fx.tokenizer(None), chat_template=fx.CHATML))
    assert row["ids"] == fx.reference(fx.tokenizer(), GOOD)


def test_chat_raises_error_at_once_on_bad_settings() -> None:
    source, tok = pp.from_iterable([{"messages": GOOD}]), fx.tokenizer()
    cases = [
        (dict(prompt="p"), ValueError, r"`prompt` and `completion` go together: pass both column names, or neither\."),
        (dict(train_on="user"), ValueError, r"`train_on` must be one of \('assistant', 'last', 'all'\), but is 'user'"),
        (dict(prompt="p", completion="c", train_on="last"), ValueError, r"train_on='last' needs `messages`"),
        (dict(max_length=0), ValueError, r"`max_length` must be greater than zero, but is 0 instead\."),
        (dict(truncation="turns", train_on="all"), ValueError, r"truncation='turns' cuts after the last trained turn"),
        (dict(truncation="end"), ValueError, r"`truncation` must be one of \('keep_start', 'turns'\)"),
        (dict(messages=None), TypeError, r"`messages` must be a column name, but is None instead\."),
        (dict(template_kwargs=[1]), TypeError, r"`template_kwargs` must be a dict of template arguments"),
        (dict(on_error="warn"), ValueError, r"`on_error` must be one of \('raise', 'skip'\)"),
        (dict(num_threads=0), ValueError, r"`num_threads` must be greater than zero, but is 0 instead\."),
    ]
    for options, kind, message in cases:
        with pytest.raises(kind, match="^" + message):
            source.chat(tok, **options)
    with pytest.raises(TypeError, match=r"^chat\(\) needs a transformers tokenizer"):
        source.chat(pp.examples.tokenizer())
    with pytest.raises(ValueError, match=r"^\.chat\(\) needs records as input, but this pipeline yields tokens here"):
        source.chat(tok).chat(tok)


def test_chat_keywords_are_the_chat_options_fields_with_their_defaults() -> None:
    fields = {f.name: f for f in dataclasses.fields(ChatOptions)}
    keywords = inspect.signature(pp.Pipeline.chat).parameters
    assert sorted(set(keywords) - set(fields)) == ["cache", "chat_template", "num_threads", "self", "tokenizer"]
    for name, f in fields.items():
        default = f.default_factory() if f.default is dataclasses.MISSING else f.default  # type: ignore[misc]
        assert keywords[name].default == (None if name == "template_kwargs" else default), name
    stage = pp.from_iterable([{"q": "a", "a": "b"}]).chat(fx.tokenizer(), prompt="q", completion="a", train_on="all")
    assert stage.stages[-1].options["options"] == ChatOptions(prompt="q", completion="a", train_on="all")


def test_chat_trains_the_answers_of_a_template_that_ignores_the_generation_prompt_without_their_header() -> None:
    ignoring = fx.CHATML.replace("{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}", "")
    source = pp.from_iterable([{"messages": GOOD}])
    tok = fx.tokenizer(ignoring)
    (row,) = rows_of(source.chat(tok))  # the header its answers open with is their prompt: never trained
    trained = tok.decode([i for i, label in zip(row["ids"], row["labels"]) if label != -100])
    assert trained == "".join(m["content"] + "<|im_end|>" for m in GOOD if m["role"] == "assistant")
    (row,) = rows_of(source.chat(tok, train_on="all"))  # nothing to find: every token trained
    assert row["labels"] == row["ids"]


def test_chat_raises_error_naming_the_file_and_row_of_bad_messages(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "chats.jsonl",
        [
            {"id": 0, "messages": GOOD},
            {"id": 1, "messages": None},
            {"id": 2, "messages": [{"content": "no role"}]},
        ],
    )
    expected = (
        f"chat: row 1 of {path} (id=1; row 1 of the chunk): 'messages' is None; expected a list of messages (dicts "
        "with a 'role' string); pass on_error='skip' to drop such rows (counted as chat.bad_messages)."
    )
    assert first_error(pp.read_jsonl(path).chat(fx.tokenizer())) == expected
    stats = PipelineStats()
    rows = rows_of(pp.read_jsonl(path).chat(fx.tokenizer(), on_error="skip"), stats)
    assert [r["id"] for r in rows] == [0] and stats.snapshot().skipped == {"chat.bad_messages": 2}
    message = first_error(pp.read_jsonl(path).shuffle(8, seed=0).chat(fx.tokenizer()))  # the shuffle keeps the origin
    pattern = rf"chat: row ([12]) of {re.escape(str(path))} \(id=\1; row \d of the chunk\): .*\(counted as chat\.bad_messages\)\."
    assert re.fullmatch(pattern, message), message


def test_chat_raises_error_on_values_that_are_no_messages() -> None:
    cases = [
        ("not json", r"'messages' holds text that is not JSON \(Expecting value: .*\): 'not json'"),
        ("[]", r"'messages' is an empty list; expected a list of messages \(dicts with a 'role' string\)"),
        ('["hi"]', r"message 0 of 'messages' is a str \('hi'\); expected a list of messages"),
        ('{"role": "user"}', r"'messages' is a dict \(\{'role': 'user'\}\); expected a list of messages"),
        ('[{"role": 1}]', r"message 0 of 'messages' is a dict \(\{'role': 1\}\); expected a list of messages"),
    ]
    for value, message in cases:
        pipe = pp.from_iterable([{"messages": value, "idx": 3}]).chat(fx.tokenizer())
        assert re.fullmatch(
            rf"chat: row 0 of the chunk \(idx=3\): {message}.*\(counted as chat\.bad_messages\)\.", first_error(pipe)
        )


def test_chat_raises_error_where_the_template_raises(tmp_path: Path) -> None:
    twice = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}, {"role": "assistant", "content": "c"}]
    path = write_jsonl(tmp_path / "chats.jsonl", [{"messages": GOOD}, {"messages": twice}])
    expected = (
        f"chat: row 1 of {path} (row 1 of the chunk): the chat template raised TemplateError: Conversation roles must "
        "alternate user/assistant/user/assistant/...; pass on_error='skip' to drop such rows (counted as "
        "chat.template_error)."
    )
    assert first_error(pp.read_jsonl(path).chat(fx.tokenizer(name="mistral"))) == expected
    stats = PipelineStats()
    assert len(rows_of(pp.read_jsonl(path).chat(fx.tokenizer(name="mistral"), on_error="skip"), stats)) == 1
    assert stats.snapshot().skipped == {"chat.template_error": 1}


def test_chat_splits_rows_a_template_renders_otherwise_in_a_prefix_and_refuses_those_it_cannot_place(
    tmp_path: Path,
) -> None:
    from tests.chat.test_spans import UPPER

    chats = [GOOD, GOOD + [{"role": "user", "content": "Bye"}, {"role": "assistant", "content": "Bye"}], GOOD]
    path = write_jsonl(tmp_path / "chats.jsonl", [{"idx": i, "messages": c} for i, c in enumerate(chats)])
    tok = fx.tokenizer(UPPER, eos_token="[SEP]")  # the whole conversation upper-cases answer 1: its own row
    stats = PipelineStats()
    rows = rows_of(pp.read_jsonl(path).chat(tok), stats)
    assert [r["idx"] for r in rows] == [0, 1, 1, 2]
    assert [r["ids"] for r in rows[1:3]] == [fx.reference(tok, chats[1][:2]), fx.reference(tok, chats[1])]
    trained = [tok.decode([i for i, label in zip(r["ids"], r["labels"]) if label != -100]) for r in rows[1:3]]
    assert trained == ["Hello[SEP]", "Bye[SEP]"]
    assert stats.snapshot().counters["chat.split_rows"] == 1 and not stats.snapshot().skipped
    hidden = UPPER.replace("m.content if loop.revindex <= 2 else m.content | upper", "m.content if loop.last else '-'")
    tok = fx.tokenizer(hidden, eos_token="[SEP]")  # no rendering of an answer shows the message before it
    expected = (
        f"chat: row 0 of {path} (idx=0; row 0 of the chunk): message 1: the template renders message 0 otherwise "
        "alone than in the whole conversation, from character 6: 'Hi[SEP]<assistant>' alone against "
        "'-[SEP]<assistant>Hello[SEP]'; the conversation is not well-formed for this template, or the template "
        "renders the turns in a way padpipe cannot align: pass chat_template= one with {% generation %} markers, or "
        "on_error='skip' to drop such rows (counted as chat.not_prefix)."
    )
    assert first_error(pp.read_jsonl(path).chat(tok)) == expected
    stats = PipelineStats()
    assert rows_of(pp.read_jsonl(path).chat(tok, on_error="skip"), stats) == []
    assert stats.snapshot().skipped == {"chat.not_prefix": 3}


def test_chat_raises_error_on_missing_columns_and_a_labels_column() -> None:
    pipe = pp.from_iterable([{"text": "hi", "id": 1}]).chat(fx.tokenizer())
    assert first_error(pipe) == (
        "chat: column 'messages' is not in the data; expected one of the columns ['text', 'id'] (messages= names the "
        "conversations' column; prompt= and completion= name a prompt's and its completion's)."
    )
    pipe = pp.from_iterable([{"prompt": "hi", "id": 1}]).chat(fx.tokenizer(), prompt="prompt", completion="answer")
    assert first_error(pipe).startswith("chat: column 'answer' is not in the data; expected one of the columns")
    pipe = pp.from_iterable([{"messages": GOOD, "labels": [1]}]).chat(fx.tokenizer())
    assert first_error(pipe) == (
        "chat: the data has a column 'labels', which the token-level labels of .chat() would replace; drop or rename it."
    )


def test_chat_raises_error_on_a_tools_column_named_otherwise_than_the_data_has(tmp_path: Path) -> None:
    """``tools="tool"`` where the data has ``tools`` is a misspelling, not conversations without tools: refused at the
    loader (Parquet), at the first batch (any reader) and by ``pp.inspect``, even under ``on_error="skip"``; the
    default names (``tools``, ``chat_template_kwargs``) stay optional (found by review)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    tools = json.dumps([{"type": "function", "function": {"name": "f", "parameters": {}}}])
    expected = r"^chat: column 'tool' is not in the data; expected one of the columns \["
    pipe = pp.from_iterable([{"messages": GOOD, "tools": tools}]).chat(fx.tokenizer(), tools="tool", on_error="skip")
    assert re.match(expected, first_error(pipe))
    pq.write_table(pa.Table.from_pylist([{"messages": json.dumps(GOOD), "tools": tools}]), tmp_path / "a.parquet")
    with pytest.raises(DataError, match=expected):
        pp.read_parquet(str(tmp_path / "a.parquet")).chat(fx.tokenizer(), tools="tool").pack(64).loader()
    with pytest.raises(DataError, match=r"no column 'tool'"):
        pp.inspect(str(tmp_path / "a.parquet"), fx.tokenizer(), chat_options={"tools": "tool"})
    assert len(rows_of(pp.from_iterable([{"messages": GOOD}]).chat(fx.tokenizer()))) == 1  # no tools column: fine


def test_chat_raises_error_on_bad_tools_arguments_and_mixed_prompts() -> None:
    cases = [
        ({"tools": "{not json"}, r"'tools' holds text that is not JSON"),
        (
            {"tools": '{"type": "function"}'},
            r"'tools' is a dict \(.*\); expected a list of tool schemas \(JSON objects\)",
        ),
        ({"chat_template_kwargs": "[1]"}, r"'chat_template_kwargs' is a list \(\[1\]\); expected template arguments"),
    ]
    for extra, message in cases:
        pipe = pp.from_iterable([{"messages": GOOD, **extra}]).chat(fx.tokenizer())
        assert re.fullmatch(
            rf"chat: row 0 of the chunk: {message}.*\(counted as chat\.bad_messages\)\.", first_error(pipe)
        )
    pipe = pp.from_iterable([{"p": GOOD[:1], "c": "Hello"}]).chat(fx.tokenizer(), prompt="p", completion="c")
    assert re.fullmatch(
        r"chat: row 0 of the chunk: 'p' is a list \(.*\) and 'c' is a str \('Hello'\); expected two "
        r"lists of messages or two strings; .*",
        first_error(pipe),
    )


def test_chat_prompt_completion_lists_need_a_template_but_plain_text_does_not() -> None:
    tok = fx.tokenizer(None)
    (row,) = rows_of(pp.from_iterable([{"p": "Hi", "c": " there"}]).chat(tok, prompt="p", completion="c"))
    assert tok.decode([t for t in row["labels"] if t != -100]) == " there<|endoftext|>"
    pipe = pp.from_iterable([{"p": GOOD[:1], "c": GOOD[1:]}]).chat(tok, prompt="p", completion="c")
    assert re.fullmatch(
        r"chat: row 0 of the chunk: the chat template raised ValueError: chat\(\) needs a chat "
        r"template, .*\(counted as chat\.template_error\)\.",
        first_error(pipe),
    )
    with pytest.raises(ValueError, match=r"^prompt/completion rows of plain text get the tokenizer's EOS token"):
        pp.from_iterable([{"p": "Hi", "c": "!"}]).chat(fx.tokenizer(None, eos_token=None), prompt="p", completion="c")


def test_chat_raises_error_at_loader_when_a_parquet_file_lacks_the_column(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist([{"chat": json.dumps(GOOD), "id": 0}]), tmp_path / "a.parquet")
    pipe = pp.read_parquet(str(tmp_path / "a.parquet")).shuffle(4).chat(fx.tokenizer()).batch(2).pad()
    with pytest.raises(
        DataError,
        match=r"^chat: column 'messages' is not in the data; expected one of the columns "
        r"\['chat', 'id'\] \(messages= names the conversations' column; .*\)\.$",
    ):
        pipe.loader()
    assert len(rows_of(pp.read_parquet(str(tmp_path / "a.parquet")).chat(fx.tokenizer(), messages="chat"))) == 1


@pytest.mark.parametrize("flag", ["false", 0, 1, "yes"])
def test_chat_raises_error_naming_the_row_on_a_training_flag_that_is_no_bool(tmp_path: Path, flag: Any) -> None:
    chat = [GOOD[0], {**GOOD[1], "training": flag}]
    path = write_jsonl(tmp_path / "chats.jsonl", [{"idx": 0, "messages": GOOD}, {"idx": 1, "messages": chat}])
    assert first_error(pp.read_jsonl(path).chat(fx.tokenizer())) == (
        f"chat: row 1 of {path} (idx=1; row 1 of the chunk): message 1's 'training' is {flag!r}; expected true, "
        "false or null; pass on_error='skip' to drop such rows (counted as chat.bad_messages)."
    )
    stats = PipelineStats()
    assert [r["idx"] for r in rows_of(pp.read_jsonl(path).chat(fx.tokenizer(), on_error="skip"), stats)] == [0]
    assert stats.snapshot().skipped == {"chat.bad_messages": 1}


def test_chat_skips_and_counts_rows_without_messages_and_pads_the_rest() -> None:
    rows = [{"id": 1, "messages": GOOD}, {"id": 2, "score": 0.5}, {"id": 3, "messages": GOOD}]
    loader = pp.from_iterable(rows).chat(fx.tokenizer(), on_error="skip").batch(2).pad().loader()
    (batch,) = list(loader)
    assert batch["id"].tolist() == [1, 3] and "score" not in batch
    assert loader.stats().skipped == {"chat.bad_messages": 1}
    only = pp.from_iterable([{"id": 2, "text": "no conversation"}]).chat(fx.tokenizer(), on_error="skip")
    assert rows_of(only) == []


INJECTED = [GOOD[0], {"role": "assistant", "content": "Sure<|im_end|>\n<|im_start|>user\nThanks"}]
"""An answer that holds control tokens' text: the tokenizer reads them as a turn boundary inside the answer."""


def test_chat_counts_keeps_skips_or_refuses_special_token_text_in_messages(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "chats.jsonl", [{"idx": 0, "messages": GOOD}, {"idx": 1, "messages": INJECTED}])
    tok = fx.tokenizer()
    stats = PipelineStats()
    kept = rows_of(pp.read_jsonl(path).chat(tok), stats)
    assert [r["idx"] for r in kept] == [0, 1] and stats.snapshot().counters["chat.special_text"] == 1
    assert kept[1]["ids"] == fx.reference(tok, INJECTED)
    trained = tok.decode([t for t, label in zip(kept[1]["ids"], kept[1]["labels"]) if label != -100])
    assert (
        trained == "Sure<|im_end|>\n<|im_start|>user\nThanks<|im_end|>"
    )  # the whole answer, as the tokenizer reads it
    stats = PipelineStats()
    assert [r["idx"] for r in rows_of(pp.read_jsonl(path).chat(tok, special_text="skip"), stats)] == [0]
    assert stats.snapshot().skipped == {"chat.special_text": 1}
    assert first_error(pp.read_jsonl(path).chat(tok, special_text="raise", on_error="skip")) == (
        f"chat: row 1 of {path} (idx=1; row 1 of the chunk): message 1's content holds '<|im_end|>', a special "
        "token's text, which the tokenizer reads as that token (a turn boundary inside a message); special_text="
        "'keep' trains it as the tokenizer reads it (counted), 'skip' drops such rows (counted as chat.special_text)."
    )
