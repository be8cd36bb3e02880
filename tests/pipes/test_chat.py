"""The chat stage (padpipe/pipes/chat.py): ids equal ``apply_chat_template``'s for every template shape, labels on
exactly the canonical spans (checked against token-level prefix rendering, and against
``return_assistant_tokens_mask`` where the template has markers), each ``train_on`` mode and the per-message flag,
tools and template arguments, from JSONL, Parquet and ``pp.from_hf``, through ``.bucket(...).pad()`` with exact
resume."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import padpipe as pp
from padpipe.state import StateMismatchError
from padpipe.stats import PipelineStats
from tests import chat_fixtures as fx
from tests.contract import check_loader_resume

transformers = pytest.importorskip("transformers")

EOT = {
    "chatml": "<|im_end|>",
    "chatml_marked": "<|im_end|>",
    "qwen25": "<|im_end|>",
    "llama3": "<|eot_id|>",
    "llama3_marked": "<|eot_id|>",
    "mistral": "</s>",
    "gemma": "<end_of_turn>",
    "gemma_marked": "<end_of_turn>",
}
"""Each template's end-of-turn token, as its model card says (not as padpipe reads it)."""


def chats_for(name: str, n: int = 40, seed: int = 0, **options: Any) -> list[list[dict[str, Any]]]:
    no_system = name.startswith("gemma")  # Gemma's template raises on a system message
    return fx.conversations(n, seed=seed, system=0.0 if no_system else 0.3, **options)


def rows_of(pipe: pp.Pipeline, stats: PipelineStats | None = None) -> list[dict[str, Any]]:
    """The chat stage's rows: ``ids``, ``labels`` and the other columns."""
    node = pipe.build(stats=stats)
    node.reset(None)
    out = []
    for chunk in node:
        for i in range(chunk.num_rows):
            row = {name: column[i].as_py() for name, column in chunk.columns.items()}
            out.append({"ids": chunk.row(i).tolist(), **row})
    return out


def expected_labels(tok: Any, chat: list[dict[str, Any]], trained: list[int], eot: str, **kwargs: Any) -> list[int]:
    """Labels by token-level prefix rendering: from the end of ``messages[:k]`` with the generation prompt through
    the first end-of-turn token after it, for each trained message ``k``."""
    ids = fx.reference(tok, chat, **kwargs)
    labels = [-100] * len(ids)
    eot_id = tok.convert_tokens_to_ids(eot)
    for k in trained:
        head = fx.reference(tok, chat[:k], add_generation_prompt=True, **kwargs)
        assert ids[: len(head)] == head
        end = ids.index(eot_id, len(head)) + 1
        labels[len(head) : end] = ids[len(head) : end]
    return labels


def answers(chat: list[dict[str, Any]]) -> list[int]:
    return [k for k, m in enumerate(chat) if m["role"] == "assistant"]


@pytest.mark.parametrize("name", sorted(EOT))
def test_chat_works_with_every_template_shape(name: str) -> None:
    tok = fx.tokenizer(name=name)
    chats = chats_for(name)
    stats = PipelineStats()
    rows = rows_of(pp.from_iterable([{"messages": c, "idx": i} for i, c in enumerate(chats)]).chat(tok), stats)
    assert [r["idx"] for r in rows] == list(range(len(chats)))
    for row, chat in zip(rows, chats):
        assert row["ids"] == fx.reference(tok, chat)  # exactly apply_chat_template's ids
        assert row["labels"] == expected_labels(tok, chat, answers(chat), EOT[name])
    counters = stats.snapshot().counters
    assert counters["chat.rows"] == len(chats) and stats.snapshot().skipped == {}
    assert counters["chat.trained_tokens"] == sum(sum(x != -100 for x in r["labels"]) for r in rows)


@pytest.mark.parametrize("name", ["llama3_marked", "chatml_marked", "gemma_marked"])
def test_chat_labels_are_the_generation_markers_moved_to_the_canonical_span(name: str) -> None:
    tok = fx.tokenizer(name=name)
    chats = chats_for(name, n=20, seed=1)
    rows = rows_of(pp.from_iterable([{"messages": c} for c in chats]).chat(tok))
    eot_id, newline = tok.convert_tokens_to_ids(EOT[name]), tok.convert_tokens_to_ids("Ċ")
    for row, chat in zip(rows, chats):
        out = tok.apply_chat_template(chat, return_dict=True, return_assistant_tokens_mask=True)
        ids, mask = out["input_ids"], list(out["assistant_masks"])
        if name == "chatml_marked":  # its block holds the header's newline and the separator after <|im_end|>
            for i in range(len(ids)):
                starts = mask[i] and (i == 0 or not mask[i - 1])
                after_eot = mask[i] and i > 0 and ids[i - 1] == eot_id
                if (starts or after_eot) and ids[i] == newline:
                    mask[i] = 0
        if name == "gemma_marked":  # its block holds the content only: the end-of-turn token after it is trained
            mask = [m or (ids[i] == eot_id and i > 0 and mask[i - 1]) for i, m in enumerate(mask)]
        assert row["labels"] == [t if m else -100 for t, m in zip(ids, mask)]
        assert row["labels"] == expected_labels(tok, chat, answers(chat), EOT[name])


def test_chat_trains_whitespace_tokens_inside_an_answer() -> None:
    """A byte-level post-processor trims a whitespace token's offsets to nothing; the spans use the pre-tokenizer's
    offsets, so such tokens inside an answer are trained (and at its edges are not)."""
    tok = fx.tokenizer(name="llama3_marked")
    chat = [{"role": "user", "content": "Hi  "}, {"role": "assistant", "content": "a  b   c"}]
    (row,) = rows_of(pp.from_iterable([{"messages": chat}]).chat(tok))
    trained = [t for t in row["labels"] if t != -100]
    assert tok.decode(trained) == "a  b   c<|eot_id|>"
    out = tok.apply_chat_template(chat, return_dict=True, return_assistant_tokens_mask=True)
    assert row["labels"] == [t if m else -100 for t, m in zip(out["input_ids"], out["assistant_masks"])]


@pytest.mark.parametrize("name", ["chatml", "llama3_marked", "mistral"])
def test_chat_train_on_last_and_all(name: str) -> None:
    tok = fx.tokenizer(name=name)
    chats = chats_for(name, n=20, seed=2, turns=(2, 3))
    source = pp.from_iterable([{"messages": c} for c in chats])
    for row, chat in zip(rows_of(source.chat(tok, train_on="last")), chats):
        assert row["labels"] == expected_labels(tok, chat, answers(chat)[-1:], EOT[name])
    for row in rows_of(source.chat(tok, train_on="all")):
        assert row["labels"] == row["ids"]


def test_chat_per_message_flag_turns_training_on_and_off() -> None:
    tok = fx.tokenizer(name="chatml")
    chat = fx.conversations(1, seed=5, turns=(2, 2), system=0.0)[0]  # user, assistant, user, assistant
    chat[1]["training"], chat[2]["training"] = False, True
    source = pp.from_iterable([{"messages": chat}])
    (row,) = rows_of(source.chat(tok))
    text = tok.apply_chat_template(chat, tokenize=False)
    runs = trained_texts(tok, row)
    user_turn = text[text.index("<|im_start|>user", 1) : text.index("<|im_end|>", text.index("<|im_start|>user", 1))]
    assert runs == [user_turn + "<|im_end|>", chat[3]["content"] + "<|im_end|>"]  # the user's whole turn
    (row,) = rows_of(source.chat(tok, training_field=None))
    assert trained_texts(tok, row) == [chat[1]["content"] + "<|im_end|>", chat[3]["content"] + "<|im_end|>"]
    (row,) = rows_of(source.chat(tok, train_on="all"))
    assert tok.decode([t for t in row["labels"] if t != -100]) == text.replace(chat[1]["content"] + "<|im_end|>", "")
    (row,) = rows_of(source.chat(tok, train_on="last"))
    assert trained_texts(tok, row) == [user_turn + "<|im_end|>", chat[3]["content"] + "<|im_end|>"]


def trained_texts(tok: Any, row: dict[str, Any]) -> list[str]:
    """The decoded runs of trained tokens."""
    runs, current = [], []
    for label in row["labels"] + [-100]:
        if label != -100:
            current.append(label)
        elif current:
            runs.append(tok.decode(current))
            current = []
    return runs


def test_chat_passes_tools_as_json_text_or_structs_and_trains_tool_calls(tmp_path) -> None:
    tok = fx.tokenizer(name="qwen25")
    chat = fx.tool_conversation()
    as_text = pp.from_iterable([{"messages": chat, "tools": [json.dumps(fx.WEATHER_TOOL)], "id": 1}])
    (row,) = rows_of(as_text.chat(tok))
    assert row["ids"] == fx.reference(tok, chat, tools=[fx.WEATHER_TOOL])
    assert trained_texts(tok, row) == [
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>',
        "It is 21 degrees in Paris.<|im_end|>",
    ]
    other = {"type": "function", "function": {"name": "now", "parameters": {"type": "object"}}}
    pq.write_table(
        pa.Table.from_pylist([{"messages": chat, "tools": [fx.WEATHER_TOOL, other], "id": 1}]),
        tmp_path / "tools.parquet",
    )  # structs: the two tools' keys are unified, filled with None
    (row,) = rows_of(pp.read_parquet(str(tmp_path / "tools.parquet")).chat(tok))
    assert row["ids"] == fx.reference(tok, chat, tools=[fx.WEATHER_TOOL, other])
    assert "id" in row and "tools" not in row and "messages" not in row


def test_chat_passes_template_arguments_per_row_and_for_all_rows() -> None:
    tok = fx.tokenizer(name="qwen3")
    chat = fx.conversations(1, seed=6, turns=(1, 1), system=0.0)[0]
    rows = [{"messages": chat, "chat_template_kwargs": {"enable_thinking": False}}, {"messages": chat}]
    quiet, thinking = rows_of(pp.from_iterable(rows).chat(tok))
    assert quiet["ids"] == thinking["ids"] == fx.reference(tok, chat)
    assert trained_texts(tok, quiet) == [chat[1]["content"] + "<|im_end|>"]  # the prompt holds the empty think block
    assert trained_texts(tok, thinking) == ["<think>\n\n</think>\n\n" + chat[1]["content"] + "<|im_end|>"]
    (both,) = rows_of(pp.from_iterable(rows[1:]).chat(tok, template_kwargs={"enable_thinking": False}))
    assert both["labels"] == quiet["labels"]
    dated = pp.from_iterable([{"messages": chat, "chat_template_kwargs": json.dumps({"date_string": "1 Jan 2026"})}])
    (row,) = rows_of(dated.chat(fx.tokenizer(name="llama3"), template_kwargs={"date_string": "2 Feb 2026"}))
    assert row["ids"] == fx.reference(fx.tokenizer(name="llama3"), chat, date_string="1 Jan 2026")


def test_chat_reads_content_parts_and_json_text_messages() -> None:
    tok = fx.tokenizer(name="chatml")
    chat = [
        {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "Hello"}]},
    ]
    (row,) = rows_of(pp.from_iterable([{"messages": chat}]).chat(tok))
    assert row["ids"] == fx.reference(tok, chat) and trained_texts(tok, row) == ["Hello<|im_end|>"]
    (again,) = rows_of(pp.from_iterable([{"conversation": json.dumps(chat)}]).chat(tok, messages="conversation"))
    assert again == row


@pytest.mark.parametrize("source", ["jsonl", "parquet", "from_hf"])
def test_chat_reads_jsonl_parquet_and_from_hf_alike(tmp_path, source: str) -> None:
    tok = fx.tokenizer(name="llama3")
    chats = chats_for("llama3", n=50, seed=7)
    records = [{"idx": i, "messages": c} for i, c in enumerate(chats)]
    if source == "jsonl":
        (tmp_path / "chats.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        pipe = pp.read_jsonl(str(tmp_path / "chats.jsonl"))
    elif source == "parquet":
        pq.write_table(pa.Table.from_pylist(records), tmp_path / "chats.parquet", row_group_size=16)
        pipe = pp.read_parquet(str(tmp_path / "chats.parquet"))
    else:
        pipe = pp.from_hf(pytest.importorskip("datasets").Dataset.from_list(records))
    rows = rows_of(pipe.chat(tok))
    assert [r["idx"] for r in rows] == list(range(len(chats)))
    for row, chat in zip(rows, chats):
        assert row["ids"] == fx.reference(tok, chat)
        assert row["labels"] == expected_labels(tok, chat, answers(chat), "<|eot_id|>")


def test_chat_is_the_same_with_any_number_of_threads() -> None:
    tok = fx.tokenizer(name="chatml_marked")
    source = pp.from_iterable([{"messages": c, "idx": i} for i, c in enumerate(chats_for("chatml", n=150, seed=8))])
    assert rows_of(source.chat(tok, num_threads=1)) == rows_of(source.chat(tok, num_threads=3))


def test_chat_then_bucket_pad_pads_labels_and_resumes_exactly(tmp_path) -> None:
    tok = fx.tokenizer(name="chatml")
    chats = chats_for("chatml", n=60, seed=9)
    (tmp_path / "chats.jsonl").write_text(
        "".join(json.dumps({"id": i, "messages": c}) + "\n" for i, c in enumerate(chats))
    )
    pipe = pp.read_jsonl(str(tmp_path / "chats.jsonl")).shuffle(64, seed=1).chat(tok).bucket(batch_size=8).pad()
    seen: dict[int, list[int]] = {}
    for batch in pipe.loader():
        assert batch["labels"].shape == batch["input_ids"].shape
        assert bool((batch["labels"][batch["attention_mask"] == 0] == -100).all())
        trained = batch["labels"] != -100
        assert bool((batch["labels"][trained] == batch["input_ids"][trained]).all())
        for i, row_id in enumerate(batch["id"].tolist()):
            seen[row_id] = batch["labels"][i][batch["attention_mask"][i] == 1].tolist()
    assert sorted(seen) == list(range(len(chats)))  # every conversation once
    assert all(seen[i] == expected_labels(tok, c, answers(c), "<|im_end|>") for i, c in enumerate(chats))
    check_loader_resume(lambda: pipe.loader(), epochs=2, steps=[0, 2, 5, 8])


def test_chat_output_is_what_tokens_gives() -> None:
    """``.chat()`` rows are token rows with a token-level ``labels`` column, as ``.tokens()`` makes from the same
    ids and labels."""
    tok = fx.tokenizer(name="gemma")
    chats = chats_for("gemma", n=30, seed=10)
    source = pp.from_iterable([{"messages": c, "idx": i} for i, c in enumerate(chats)])
    chat_batches = list(source.chat(tok).batch(8).pad().loader())
    rows = [{"input_ids": r["ids"], "labels": r["labels"], "idx": r["idx"]} for r in rows_of(source.chat(tok))]
    token_batches = list(pp.from_iterable(rows).tokens(pad_id=tok.pad_token_id).batch(8).pad().loader())
    assert len(chat_batches) == len(token_batches) == 4
    for a, b in zip(chat_batches, token_batches):
        assert sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)


def test_chat_reads_every_conversation_once_in_dataloader_workers(tmp_path) -> None:
    tok = fx.tokenizer(name="llama3_marked")
    chats = chats_for("llama3_marked", n=64, seed=16)
    path = tmp_path / "chats.jsonl"
    path.write_text("".join(json.dumps({"id": i, "messages": c}) + "\n" for i, c in enumerate(chats)))
    pipe = pp.read_jsonl(str(path)).chat(tok).batch(8).pad()
    seen: dict[int, list[int]] = {}
    for batch in pipe.loader(num_workers=2):
        for i, row_id in enumerate(batch["id"].tolist()):
            assert row_id not in seen
            seen[row_id] = batch["labels"][i][batch["attention_mask"][i] == 1].tolist()
    assert sorted(seen) == list(range(len(chats)))
    assert all(seen[i] == expected_labels(tok, c, answers(c), "<|eot_id|>") for i, c in enumerate(chats))


def test_chat_refuses_a_state_saved_with_other_labels_or_another_template() -> None:
    source = pp.from_iterable([{"messages": c} for c in chats_for("chatml", n=40, seed=17)])
    loader = source.chat(fx.tokenizer(name="chatml")).batch(4).pad().loader()
    next(iter(loader))
    state = loader.state_dict()
    for changed, found in [
        (dict(train_on="last"), r"setting 'train_on' found 'assistant' instead of 'last'"),
        (dict(chat_template=fx.QWEN25), r"setting 'template' found 'template sha1=\w+' instead of 'template sha1=\w+'"),
    ]:
        other = source.chat(fx.tokenizer(name="chatml"), **changed).batch(4).pad().loader()
        other.load_state_dict(state)
        with pytest.raises(StateMismatchError, match=rf"^chat state doesn't match this pipeline: {found}\.?$"):
            next(iter(other))
