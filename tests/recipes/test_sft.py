"""The SFT recipe on the shipped conversations and chat tokenizer: packed labels, truncation, drops, formats, CLI."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import padpipe as pp
from padpipe import _command
from padpipe.recipes.sft import main, sft
from tests.contract import check_loader_resume

datasets = pytest.importorskip("datasets")

TOK = pp.examples.chat_tokenizer()
EOT = TOK.convert_tokens_to_ids("<|im_end|>")
with gzip.open(pp.examples.CHATS_JSONL, "rt") as _f:
    ROWS = [json.loads(line) for line, _ in zip(_f, range(60))]


def reference(messages: list[dict[str, Any]], **kwargs: Any) -> list[int]:
    return list(TOK.apply_chat_template(messages, tokenize=True, return_dict=True, **kwargs)["input_ids"])


def expected(messages: list[dict[str, Any]], last_only: bool = False) -> tuple[list[int], list[int]]:
    """A conversation's ids and labels, by token-level prefix rendering: each answer from after its generation
    prompt through the ``<|im_end|>`` that closes it."""
    ids = reference(messages)
    labels = [-100] * len(ids)
    answers = [k for k, m in enumerate(messages) if m["role"] == "assistant"]
    for k in answers[-1:] if last_only else answers:
        head = reference(messages[:k], add_generation_prompt=True)
        assert ids[: len(head)] == head
        end = ids.index(EOT, len(head)) + 1
        labels[len(head) : end] = ids[len(head) : end]
    return ids, labels


def segments(batches: list[dict]) -> dict[int, tuple[list[int], list[int]]]:
    """Each packed conversation's ids and labels, by its id (``keep=("id",)``); asserts none comes twice."""
    out: dict[int, tuple[list[int], list[int]]] = {}
    for batch in batches:
        for r, ids in enumerate(batch["id"]):
            seq, tokens, labels = (batch[k][r].tolist() for k in ("seq_idx", "input_ids", "labels"))
            for s, conversation in zip(sorted(set(seq)), ids):  # the row's segments in order; padding last
                assert conversation not in out
                out[conversation] = tuple([v for v, k in zip(values, seq) if k == s] for values in (tokens, labels))  # type: ignore[assignment]
    return out


def first_masked(labels: list[int]) -> list[int]:
    return [-100] + labels[1:]


def write_chats(path: Path, rows: list[dict[str, Any]] = ROWS) -> str:
    if path.suffix == ".parquet":
        pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=16)
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_sft_packs_every_conversation_once_with_its_own_labels(tmp_path: Path) -> None:
    batches = list(sft(write_chats(tmp_path / "c.jsonl"), TOK, seq_len=1024, batch_size=2, keep=("id",)).loader())
    assert all(b["input_ids"].shape == (2, 1024) for b in batches[:-1])
    found = segments(batches)
    assert sorted(found) == [r["id"] for r in ROWS]
    for row in ROWS:
        ids, labels = expected(row["messages"])
        assert found[row["id"]] == (ids, first_masked(labels)), row["id"]


def test_sft_truncates_longer_conversations_and_counts_those_left_untrained(tmp_path: Path) -> None:
    seq_len = 48
    loader = sft(write_chats(tmp_path / "c.jsonl"), TOK, seq_len=seq_len, batch_size=4, keep=("id",)).loader()
    found = segments(list(loader))
    kept, untrained, truncated = {}, 0, 0
    for row in ROWS:
        ids, labels = expected(row["messages"])
        if all(label == -100 for label in labels[:seq_len]):
            untrained += 1
            continue
        truncated += len(ids) > seq_len
        kept[row["id"]] = (ids[:seq_len], first_masked(labels[:seq_len]))
    assert untrained and truncated  # the test covers both
    assert found == kept
    stats = loader.stats()
    assert stats.skipped == {"chat.no_trained_tokens": untrained}
    assert stats.counters["chat.truncated"] == truncated


def test_sft_bucket_mode_pads_labels_with_minus_100(tmp_path: Path) -> None:
    pipe = sft(write_chats(tmp_path / "c.jsonl"), TOK, seq_len=1024, mode="bucket", max_tokens=2048)
    seen = {}
    for batch in pipe.loader():
        assert batch["input_ids"].numel() <= 2048
        for ids, labels, mask, row_id in zip(batch["input_ids"], batch["labels"], batch["attention_mask"], batch["id"]):
            n = int(mask.sum())
            assert labels[n:].eq(-100).all()
            seen[int(row_id)] = (ids[:n].tolist(), labels[:n].tolist())
    assert seen == {row["id"]: expected(row["messages"]) for row in ROWS}


def test_sft_trains_on_the_last_answer_or_every_token(tmp_path: Path) -> None:
    path = write_chats(tmp_path / "c.jsonl")
    last = segments(list(sft(path, TOK, seq_len=1024, train_on="last", keep=("id",)).loader()))
    every = segments(list(sft(path, TOK, seq_len=1024, train_on="all", keep=("id",)).loader()))
    for row in ROWS:
        ids, labels = expected(row["messages"], last_only=True)
        assert last[row["id"]] == (ids, first_masked(labels))
        assert every[row["id"]] == (ids, first_masked(ids))


@pytest.mark.parametrize("source", ["jsonl", "parquet", "list", "dataset", "pipeline"])
def test_sft_reads_paths_datasets_and_pipelines_alike(tmp_path: Path, source: str) -> None:
    rows = ROWS[:20]
    data: Any = {
        "jsonl": lambda: write_chats(tmp_path / "c.jsonl", rows),
        "parquet": lambda: write_chats(tmp_path / "c.parquet", rows),
        "list": lambda: [write_chats(tmp_path / "a.jsonl", rows[:7]), write_chats(tmp_path / "b.jsonl", rows[7:])],
        "dataset": lambda: datasets.Dataset.from_list(rows),
        "pipeline": lambda: pp.from_iterable(rows),
    }[source]()
    found = segments(list(sft(data, TOK, seq_len=1024, keep=("id",)).loader()))
    assert {k: v[0] for k, v in found.items()} == {r["id"]: reference(r["messages"]) for r in rows}


def test_sft_takes_prompt_completion_columns_and_chat_options(tmp_path: Path) -> None:
    rows = [{"prompt": r["messages"][:-1], "completion": r["messages"][-1:], "id": r["id"]} for r in ROWS[:20]]
    pipe = sft(pp.from_iterable(rows), TOK, seq_len=1024, prompt="prompt", completion="completion", keep=("id",))
    found = segments(list(pipe.loader()))
    for row in rows:
        ids = reference(row["prompt"] + row["completion"])
        start = len(reference(row["prompt"], add_generation_prompt=True))
        end = ids.index(EOT, start) + 1
        assert found[row["id"]] == (ids, [-100] * start + ids[start:end] + [-100] * (len(ids) - end))
    bad = [{"messages": [{"role": None, "content": "no role"}], "id": 99}, *ROWS[:3]]
    loader = sft(pp.from_iterable(bad), TOK, seq_len=1024, keep=("id",), chat_options={"on_error": "skip"}).loader()
    assert sorted(segments(list(loader))) == [0, 1, 2]
    assert loader.stats().skipped == {"chat.bad_messages": 1}


def test_sft_shuffles_deterministically_for_a_seed_and_resumes_exactly(tmp_path: Path) -> None:
    path = write_chats(tmp_path / "c.parquet")

    def order(seed: int) -> list[list[int]]:
        return [b["input_ids"].flatten().tolist() for b in sft(path, TOK, seq_len=512, seed=seed).loader()]

    assert order(3) == order(3) != order(4)
    check_loader_resume(lambda: sft(path, TOK, seq_len=512, batch_size=2, pack_buffer=16).loader(), steps=[0, 3, 7])


def test_sft_with_a_cache_gives_the_same_batches_and_counters_and_renders_once(tmp_path: Path) -> None:
    path, cache = write_chats(tmp_path / "c.jsonl"), str(tmp_path / "cache")
    plain = sft(path, TOK, seq_len=96, batch_size=2, keep=("id",)).loader()
    reference = [segments(list(plain)) for _ in range(2)]
    loader = sft(path, TOK, seq_len=96, batch_size=2, keep=("id",), cache=cache).loader()
    assert [segments(list(loader)) for _ in range(2)] == reference

    def chat(stats: pp.StatsSnapshot) -> dict[str, int]:
        return {k: v for k, v in stats.counters.items() if k.startswith("chat.")}

    assert chat(loader.stats()) == chat(plain.stats()) and loader.stats().skipped == plain.stats().skipped
    assert loader.stats().counters["cache.hit_rows"] == loader.stats().counters["cache.miss_rows"] == len(ROWS)
    with pytest.raises(ValueError, match=r"^`cache` needs a reader with work units"):
        sft(pp.from_iterable(ROWS), TOK, cache=cache)
    with pytest.raises(
        ValueError, match=r"^`chat_options` must not repeat the recipe's own arguments, but sets \['cache'"
    ):
        sft(path, TOK, chat_options={"cache": cache})


def test_sft_raises_error_when_options_do_not_fit() -> None:
    with pytest.raises(ValueError, match=r"^`seq_len` must be at least 2, but is 1 instead\.$"):
        sft("c.jsonl", TOK, seq_len=1)
    with pytest.raises(ValueError, match=r"^`max_tokens` is for mode='bucket'; "):
        sft("c.jsonl", TOK, max_tokens=4096)
    with pytest.raises(ValueError, match=r"^`keep` is for mode='pack'; with mode='bucket' columns pass through, "):
        sft("c.jsonl", TOK, mode="bucket", keep=("id",))
    with pytest.raises(ValueError, match=r"^`chat_options` must not repeat the recipe's own arguments, but sets \["):
        sft("c.jsonl", TOK, chat_options={"max_length": 10})
    with pytest.raises(TypeError, match=r"^`data` must be a path, a list of paths, a datasets\.Dataset or "):
        sft(42, TOK)
    with pytest.raises(ValueError, match=r"^chat\(\) needs a chat template, but the tokenizer \(BertTokenizer"):
        sft(pp.from_iterable(ROWS), pp.examples.hf_tokenizer())


# -- command line ---------------------------------------------------------------------------------
def test_sft_cli_prints_conversations_trained_share_efficiency_and_drops(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    path = write_chats(tmp_path / "c.jsonl")
    assert main(["--data", path, "--tokenizer", "chat", "--seq-len", "48", "--batch-size", "4"]) == 0
    lines = capsys.readouterr().out.splitlines()
    untrained = sum(all(label == -100 for label in expected(r["messages"])[1][:48]) for r in ROWS)
    assert lines[0] == "sft pack seq_len=48, train_on=assistant:"
    assert re.match(r"^batch 0: input_ids \[4, 48\] int64, position_ids \[4, 48\] int64, labels \[4, 48\]", lines[1])
    assert re.fullmatch(
        rf"\d+ batches, {len(ROWS) - untrained} rows, \d+ tokens in \d+ slots: packing efficiency \d+\.\d%", lines[-6]
    )
    assert re.fullmatch(r"trained tokens \(labels other than -100\): \d+ of \d+ \(\d+\.\d%\)", lines[-5])
    assert lines[-4] == f"rendered: {len(ROWS) - untrained} conversations into {len(ROWS) - untrained} rows"
    assert re.fullmatch(r"truncated to seq_len: \d+ rows \(their first seq_len tokens kept\)", lines[-3])
    assert lines[-2:] == [
        f"dropped: {untrained} rows with no token to train",
        f"  chat.no_trained_tokens {untrained}: no token left to train (after truncation to seq_len, or under "
        "train_on)",
    ]


def test_sft_cli_fills_a_cache_then_reads_it(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path, cache = write_chats(tmp_path / "c.jsonl"), str(tmp_path / "cache")
    argv = ["--data", path, "--tokenizer", "chat", "--seq-len", "256", "--cache", cache]
    assert main(argv) == 0
    first = capsys.readouterr().out.splitlines()
    assert first[-1] == f"cache {cache}: 0 conversations read from it, {len(ROWS)} rendered and stored"
    assert main(argv) == 0
    again = capsys.readouterr().out.splitlines()
    assert again[-1] == f"cache {cache}: {len(ROWS)} conversations read from it, 0 rendered and stored"
    assert again[:-1] == first[:-1]  # the same batches, shares and counts


def test_sft_cli_counts_trained_tokens_of_the_batches(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = write_chats(tmp_path / "c.jsonl")
    assert main(["--data", path, "--tokenizer", pp.examples.CHAT_TOKENIZER_DIR, "--seq-len", "1024"]) == 0
    out = capsys.readouterr().out
    tokens = sum(len(expected(r["messages"])[0]) for r in ROWS)
    trained = sum(sum(label != -100 for label in expected(r["messages"])[1]) for r in ROWS)
    assert f"trained tokens (labels other than -100): {trained} of {tokens} ({trained / tokens:.1%})" in out
    assert out.endswith("dropped: none\n")


def test_sft_cli_names_a_tokenizer_without_a_chat_template_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    path = write_chats(tmp_path / "c.jsonl")
    prog = "python -m padpipe.recipes.sft"
    assert _command.run(main, ["--data", path, "--tokenizer", "sample"], prog=prog) == 2
    assert capsys.readouterr().err == (
        f"{prog}: error: --tokenizer 'sample' is a tokenizer.json file, which has no chat template and no special "
        "token names; pass a pretrained folder with a chat template (e.g. --tokenizer chat).\n"
    )
    assert _command.run(main, ["--data", path, "--tokenizer", "chat", "--prompt", "p"], prog=prog) == 2
    assert capsys.readouterr().err == (
        f"{prog}: error: --prompt and --completion go together: name both columns, or neither.\n"
    )


def test_sft_cli_reads_a_chat_template_file(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = write_chats(tmp_path / "c.jsonl", ROWS[:10])
    template = tmp_path / "template.jinja"
    template.write_text(
        "{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n{{ m.content }}<|eot_id|>"
        "{% endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
    )
    args = ["--data", path, "--tokenizer", "chat", "--chat-template", str(template), "--seq-len", "1024"]
    assert main(args) == 0
    tokens = sum(len(reference(r["messages"], chat_template=template.read_text())) for r in ROWS[:10])
    assert re.search(rf"^\d+ batches, 10 rows, {tokens} tokens in ", capsys.readouterr().out, re.M)


@pytest.mark.filterwarnings("ignore:.*the chat template does not render:UserWarning")
def test_sft_cli_says_reasoning_rows_and_what_the_template_drops(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from tests import chat_fixtures as fx

    chat = [
        {"role": "user", "content": "2 + 2?"},
        {"role": "assistant", "content": "<think>\nAdd.\n</think>\n\n4."},
        {"role": "user", "content": "3 + 3?"},
        {"role": "assistant", "content": "<think>\nAdd again.\n</think>\n\n6."},
    ]
    path = write_chats(tmp_path / "c.jsonl", [{"id": i, "messages": chat} for i in range(3)])
    template = tmp_path / "qwen3.jinja"
    template.write_text(fx.QWEN3)
    args = ["--data", path, "--tokenizer", "chat", "--chat-template", str(template), "--seq-len", "256"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert re.search(r"^\d+ batches, 6 rows, \d+ tokens in ", out, re.M)  # a conversation and its reasoning row, each
    assert (
        "rendered: 3 conversations into 6 rows (3 rows of their own for reasoning the whole conversation drops)\n"
        in out
    )
    assert main([*args, "--reasoning", "as_rendered"]) == 0
    assert "not rendered by the template (trained as rendered): reasoning of 3 messages\n" in capsys.readouterr().out
