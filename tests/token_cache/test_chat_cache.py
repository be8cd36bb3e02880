"""The chat cache (``.chat(..., cache=...)``): same batches and counters as without it in every epoch, never stale.

Conversations come from the real templates (Qwen3: reasoning rows, tool calls and results, a tools column;
DeepSeek-R1-Distill: reasoning the template drops) with rows that are skipped (bad messages, nothing trained),
truncated, or hold a special token's text. Every test compares against the same pipeline without a cache,
epoch by epoch, and counts what came from the cache; the attacks are the token cache's: changed settings,
a crafted or corrupted segment, a cache folder shared with ``tokenize``, resume anywhere.
"""

from __future__ import annotations

import dataclasses
import json
import pickle
import re
import threading

import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest

import padpipe as pp
from padpipe.chat.options import ChatOptions
from padpipe.chat.template import ChatTemplate
from padpipe.token_cache import rows as cr
from padpipe.token_cache import walk
from padpipe.token_cache.store import FORMAT
from tests import chat_fixtures as fx
from tests.chat import real_templates as rt
from tests.contract import normalize
from tests.token_cache.test_cache_trust import replace_segment, segment_files

pytestmark = pytest.mark.timeout(180)

ROWS = 90


@pytest.fixture(autouse=True)
def small_segments(monkeypatch):
    monkeypatch.setattr(walk, "SEGMENT_ROWS", 16)  # many segments per unit, cut anywhere


def fast_first(names):
    """``names`` as parameters, all but the first marked slow (seconds each: ``make test`` runs them)."""
    return [pytest.param(n, marks=() if i == 0 else pytest.mark.slow) for i, n in enumerate(names)]


def chats(name: str = "qwen3", n: int = ROWS) -> list[dict]:
    """Model ``name``'s conversations with a tools column on the tool-calling ones, and rows that are skipped
    (not a conversation; nothing to train) or hold a special token's text."""
    rows = [{"messages": c, "id": i} for i, c in enumerate(rt.conversations(name, n, seed=2))]
    for row in rows:
        if any(m.get("tool_calls") for m in row["messages"]):
            row["tools"] = [fx.WEATHER_TOOL]
    rows[7]["messages"] = "not a conversation"
    rows[30]["messages"] = [{"role": "user", "content": "a question nobody answers"}]
    rows[41]["messages"][-1]["content"] += " <|im_end|> written in an answer"
    return rows


def write(tmp_path, rows, kind: str = "jsonl"):
    if kind == "parquet":  # conversations as JSON text (a row that is none would not fit a struct column)
        path = tmp_path / "chats.parquet"
        rows = [{k: json.dumps(v) if k in ("messages", "tools") else v for k, v in row.items()} for row in rows]
        pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=25)
        return pp.read_parquet(str(path), chunk_rows=8)
    path = tmp_path / "chats.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    pipe = pp.read_jsonl(str(path), chunk_rows=8)  # several byte-range units, several blocks each
    options = {**pipe.source.options, "unit_bytes": 9000, "block_bytes": 3000}
    return dataclasses.replace(pipe, source=dataclasses.replace(pipe.source, options=options))


BASE = {"max_length": 256, "on_error": "skip"}


def stages(source, tok, cache=None, pad_id=None, **chat):
    return (
        source.shuffle(buffer_size=30, seed=3)
        .chat(tok, cache=cache, **{**BASE, **chat})
        .bucket(max_tokens=1024, buffer_size=40)
        .pad(pad_to_multiple_of=8, pad_id=pad_id)
    )


def epochs(loader, n):
    return [[normalize(b) for b in loader] for _ in range(n)]


def counter(loader, name):
    return loader.stats().counters.get(name, 0)


def chat_counters(loader):
    stats = loader.stats()
    return {k: v for k, v in stats.counters.items() if k.startswith("chat.")}, dict(stats.skipped)


@pytest.fixture(scope="module")
def qwen3():
    return rt.tokenizer("qwen3")


def no_rendering(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a cached epoch rendered a conversation")

    monkeypatch.setattr(ChatTemplate, "render", refuse)


@pytest.mark.parametrize("kind", fast_first(["jsonl", "parquet"]))
def test_chat_cache_gives_the_same_batches_and_counters_in_every_epoch(tmp_path, qwen3, kind, monkeypatch):
    source, cache = write(tmp_path, chats(), kind), str(tmp_path / "cache")
    plain = stages(source, qwen3).loader()
    reference = epochs(plain, 1)
    one_epoch = chat_counters(plain)
    reference += epochs(plain, 1)
    counts, skipped = chat_counters(plain)
    assert counts["chat.reasoning_rows"] > 0 and counts["chat.truncated"] > 0 and counts["chat.special_text"] == 2
    assert skipped["chat.bad_messages"] == 2 and skipped["chat.no_trained_tokens"] >= 2
    loader = stages(source, qwen3, cache).loader()
    assert epochs(loader, 1) == reference[:1]  # filling
    assert counter(loader, "cache.miss_rows") == ROWS and counter(loader, "cache.hit_rows") == 0
    assert epochs(loader, 1) == reference[1:]  # served
    assert counter(loader, "cache.hit_rows") == ROWS and chat_counters(loader) == (counts, skipped)
    again = stages(source, qwen3, cache).loader()  # a later run renders nothing, counts the same
    no_rendering(monkeypatch)
    assert epochs(again, 1) == reference[:1]
    assert counter(again, "cache.hit_rows") == ROWS and chat_counters(again) == one_epoch


@pytest.mark.slow  # seconds: make test runs it, test-fast leaves it out
def test_chat_cache_counts_and_warns_of_what_the_template_drops_on_a_cached_run(tmp_path):
    tok = rt.tokenizer("deepseek_r1_distill")
    rows = [{"messages": c, "id": i} for i, c in enumerate(rt.conversations("deepseek_r1_distill", 40, seed=4))]
    source, cache = write(tmp_path, rows), str(tmp_path / "cache")
    with pytest.warns(UserWarning, match="does not render the reasoning"):
        plain = stages(source, tok, pad_id=0).loader()
        reference = epochs(plain, 1)
    assert chat_counters(plain)[0]["chat.dropped_reasoning"] > 0
    with pytest.warns(UserWarning, match="does not render the reasoning"):
        epochs(stages(source, tok, cache, pad_id=0).loader(), 1)
    with pytest.warns(UserWarning, match="does not render the reasoning"):
        loader = stages(source, tok, cache, pad_id=0).loader()
        assert epochs(loader, 1) == reference
    assert counter(loader, "cache.hit_rows") == 40 and chat_counters(loader) == chat_counters(plain)


CHANGES = {
    "train_on": {"train_on": "last"},
    "max_length": {"max_length": 200},
    "truncation": {"truncation": "turns"},
    "reasoning": {"reasoning": "as_rendered"},
    "template_kwargs": {"template_kwargs": {"enable_thinking": False}},
    "special_text": {"special_text": "skip"},
    "training_field": {"training_field": None},
    "kwargs column": {"kwargs_column": "tools"},  # template arguments from another column: a miss
    "template text": {"chat_template": rt.template_text("trl:qwen3") + "{# a comment changes no rendering #}"},
}


@pytest.mark.parametrize("change", fast_first(CHANGES))
def test_chat_cache_misses_when_an_option_or_the_template_changes(tmp_path, qwen3, change):
    source, cache = write(tmp_path, chats()), str(tmp_path / "cache")
    epochs(stages(source, qwen3, cache).loader(), 1)
    loader = stages(source, qwen3, cache, **CHANGES[change]).loader()
    assert epochs(loader, 1) == epochs(stages(source, qwen3, **CHANGES[change]).loader(), 1)
    assert counter(loader, "cache.hit_rows") == 0 and counter(loader, "cache.miss_rows") == ROWS


@pytest.mark.slow  # seconds: make test runs it, test-fast leaves it out
def test_chat_cache_misses_when_the_tokenizer_or_the_file_changes(tmp_path, qwen3):
    rows = chats()
    source, cache = write(tmp_path, rows), str(tmp_path / "cache")
    epochs(stages(source, qwen3, cache).loader(), 1)
    other = rt.tokenizer("qwen3")
    other.add_tokens(["assistant"])  # one more token: other ids
    loader = stages(source, other, cache).loader()
    assert epochs(loader, 1) == epochs(stages(source, other).loader(), 1)
    assert counter(loader, "cache.hit_rows") == 0
    rows[0]["messages"][-1]["content"] = "A changed answer."
    changed = write(tmp_path, rows)  # same path, new size and mtime
    loader = stages(changed, qwen3, cache).loader()
    assert epochs(loader, 1) == epochs(stages(changed, qwen3).loader(), 1)
    assert counter(loader, "cache.hit_rows") < ROWS  # the changed file's units miss (unchanged ones may hit)


def test_chat_cache_keys_on_every_option_on_error_too():
    template = ChatTemplate(rt.tokenizer("qwen3"), None)
    about = pp.cache.chat_fingerprint_of(template, ChatOptions(on_error="skip"))
    assert about["stage"] == "chat" and about["options"]["on_error"] == "skip"
    changed = pp.cache.chat_fingerprint_of(template, ChatOptions(on_error="raise"))
    assert about != changed and about["template"] == changed["template"]


@pytest.mark.slow  # seconds: make test runs it, test-fast leaves it out
def test_chat_and_tokenize_caches_in_one_folder_never_read_each_others_files(tmp_path, qwen3):
    rows = [{**row, "text": f"row {row['id']}"} for row in chats()]
    rows[7]["messages"] = rows[8]["messages"]  # every row a list: the JSON reader parses every key of a line
    source, cache = write(tmp_path, rows), str(tmp_path / "cache")
    texts = pp.read_jsonl(str(tmp_path / "chats.jsonl"), columns=["text", "id"])  # the same file and units
    options = {**texts.source.options, "unit_bytes": 9000, "block_bytes": 3000}
    texts = dataclasses.replace(texts, source=dataclasses.replace(texts.source, options=options))
    tokenized = texts.tokenize(pp.examples.tokenizer(), fields="text", cache=cache).batch(16).pad()
    epochs(tokenized.loader(), 1)
    loader = stages(source, qwen3, cache).loader()
    assert epochs(loader, 1) == epochs(stages(source, qwen3).loader(), 1)
    assert counter(loader, "cache.hit_rows") == 0
    assert sorted(about.get("stage", "tokenize") for about in pp.cache.info(cache).fingerprints.values()) == [
        "chat",
        "tokenize",
    ]
    for pipe in (tokenized, stages(source, qwen3, cache)):
        again = pipe.loader()
        epochs(again, 1)
        assert counter(again, "cache.hit_rows") == ROWS and counter(again, "cache.bad_files") == 0


def crafted(table: pa.Table, how: str) -> pa.Table:
    """A chat segment changed the way a forger might, published under a valid size and checksum."""
    ids, trained = table.column(cr.IDS).to_pylist(), table.column(cr.TRAINED).to_pylist()
    row = next(i for i, rows in enumerate(ids) if rows)
    if how == "id past the vocabulary":
        ids[row][0][-1] = 65535
    elif how == "token row longer than max_length":
        ids[row][0], trained[row][0] = ids[row][0] * 9, trained[row][0] * 9
    elif how == "trained flags shorter than the ids":
        trained[row][0] = trained[row][0][:-1]
    elif how == "token row with nothing trained":
        trained[row][0] = [False] * len(trained[row][0])
    elif how in ("counter of another stage", "count of zero"):
        counts = table.column(cr.COUNTS).to_pylist()
        counts[row] = [("tokenize.rows", 5)] if how == "counter of another stage" else [("chat.truncated", 0)]
        return table.set_column(table.schema.get_field_index(cr.COUNTS), cr.COUNTS, pa.array(counts, cr.COUNTS_TYPE))
    elif how == "rows of text state":
        state = pa.array([cr.TEXT] * table.num_rows, pa.int8())
        return table.set_column(table.schema.get_field_index(cr.STATE), cr.STATE, state)
    else:
        raise AssertionError(how)
    table = table.set_column(
        table.schema.get_field_index(cr.IDS), cr.IDS, pa.array(ids, table.schema.field(cr.IDS).type)
    )
    return table.set_column(
        table.schema.get_field_index(cr.TRAINED), cr.TRAINED, pa.array(trained, table.schema.field(cr.TRAINED).type)
    )


HOWS = [
    "id past the vocabulary",
    "token row longer than max_length",
    "trained flags shorter than the ids",
    "token row with nothing trained",
    "counter of another stage",
    "count of zero",
    "rows of text state",
    "a flipped byte",
]


@pytest.mark.parametrize("how", fast_first(HOWS))
def test_chat_cache_rejects_a_crafted_or_corrupted_segment_and_renders_again(tmp_path, qwen3, how):
    source, cache = write(tmp_path, chats()), tmp_path / "cache"
    plain = stages(source, qwen3).loader()
    reference = epochs(plain, 1)
    epochs(stages(source, qwen3, str(cache)).loader(), 1)
    files = segment_files(cache)
    target = max(files, key=lambda p: p.stat().st_size)  # one with token rows
    table = ipc.open_file(str(target)).read_all()
    if how == "a flipped byte":
        data = bytearray(target.read_bytes())
        data[len(data) // 2] ^= 0xFF  # same size, wrong checksum
        target.write_bytes(bytes(data))
    else:
        replace_segment(target, crafted(table, how))
    loader = stages(source, qwen3, str(cache)).loader()
    assert epochs(loader, 1) == reference
    assert chat_counters(loader) == chat_counters(plain)
    assert counter(loader, "cache.bad_files") == 1 and counter(loader, "cache.miss_rows") == table.num_rows
    assert len(segment_files(cache)) == len(files) and target.exists()  # the bad file gone, the true one back


@pytest.mark.slow  # seconds alone
def test_chat_cache_resumes_exactly_while_filling_and_when_full(tmp_path, qwen3):
    source, cache = write(tmp_path, chats()), str(tmp_path / "cache")
    reference = epochs(stages(source, qwen3).loader(), 2)
    loader = stages(source, qwen3, cache).loader()
    states = []  # (epoch, batches taken in it, state): epoch 0 fills the cache, epoch 1 reads it
    for epoch in range(2):
        for taken, _ in enumerate(loader, 1):
            states.append((epoch, taken, pickle.dumps(loader.state_dict())))
    for epoch, taken, state in states[1::4]:
        fresh = stages(source, qwen3, cache).loader()
        fresh.load_state_dict(pickle.loads(state))
        assert epochs(fresh, 2 - epoch) == [reference[epoch][taken:]] + reference[epoch + 1 :], (epoch, taken)


@pytest.mark.slow  # seconds alone
@pytest.mark.parametrize("kind", fast_first(["jsonl", "parquet"]))
def test_chat_cache_assembles_pieces_when_cut_points_move(tmp_path, qwen3, kind):
    source, cache = write(tmp_path, chats(), kind), str(tmp_path / "cache")
    slots = [dict(consumer=pp.Consumer(index, 2), equal_steps="off") for index in (0, 1)]
    for slot in slots:  # two consumers: their shares' cut points move every epoch, batches mix cached rows and text
        plain = stages(source, qwen3).loader(**slot)
        reference = epochs(plain, 3)
        loader = stages(source, qwen3, cache).loader(**slot)
        assert epochs(loader, 3) == reference
        assert chat_counters(loader) == chat_counters(plain)
    hits = 0
    for slot in slots:
        loader = stages(source, qwen3, cache).loader(**slot)
        epochs(loader, 1)
        hits += counter(loader, "cache.hit_rows")
        assert counter(loader, "cache.miss_rows") == 0
    assert hits == ROWS


@pytest.mark.slow  # worker processes start in seconds: make test runs it, test-fast leaves it out
def test_chat_cache_gives_the_same_batches_through_worker_processes(tmp_path, qwen3):
    source, cache = write(tmp_path, chats(), "parquet"), str(tmp_path / "cache")
    reference = epochs(stages(source, qwen3).loader(num_workers=2), 2)
    assert epochs(stages(source, qwen3, cache).loader(num_workers=2), 2) == reference
    loader = stages(source, qwen3, cache).loader(num_workers=2)
    assert epochs(loader, 1) == reference[:1]
    assert counter(loader, "cache.hit_rows") == ROWS and counter(loader, "cache.miss_rows") == 0


@pytest.mark.slow  # seconds: make test runs it, test-fast leaves it out
def test_chat_cache_is_filled_by_concurrent_loaders_without_corruption(tmp_path, qwen3):
    source, cache = write(tmp_path, chats()), str(tmp_path / "cache")
    reference = epochs(stages(source, qwen3).loader(), 1)
    results: list = []
    threads = [
        threading.Thread(target=lambda: results.append(epochs(stages(source, qwen3, cache).loader(), 1)))
        for _ in range(3)
    ]  # the same segments written at once, renamed into place
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [reference] * 3
    loader = stages(source, qwen3, cache).loader()
    assert epochs(loader, 1) == reference and counter(loader, "cache.hit_rows") == ROWS
    assert counter(loader, "cache.bad_files") == 0 and not list((tmp_path / "cache").rglob(".tmp-*"))


@pytest.mark.slow  # seconds: make test runs it, test-fast leaves it out
def test_chat_cache_gives_the_same_batches_after_an_elastic_resume(tmp_path, qwen3):
    source = write(tmp_path, chats(), "parquet")

    def elastic(cache):  # 2 ranks take 2 batches each and save; 3 ranks load both states
        pipe, states, before = stages(source, qwen3, cache), [], []
        for rank in range(2):
            old = pipe.loader(consumer=pp.Consumer(rank=rank, world_size=2))
            it = iter(old)
            before += [normalize(next(it)) for _ in range(2)]
            states.append(pickle.loads(pickle.dumps(old.state_dict())))
        after = []
        for rank in range(3):
            new = pipe.loader(consumer=pp.Consumer(rank=rank, world_size=3))
            new.load_state_dict(states)
            after.append(epochs(new, 2))
        return before, after

    reference = elastic(None)
    cache = str(tmp_path / "cache")
    assert elastic(cache) == reference  # filling: re-shared pieces of units cut at the saved rows
    assert elastic(cache) == reference  # from the cache


def test_chat_cache_refuses_a_state_saved_with_another_chat_setting(tmp_path, qwen3):
    source, cache = write(tmp_path, chats()), str(tmp_path / "cache")
    epochs(stages(source, qwen3, cache).loader(), 1)
    loader = stages(source, qwen3, cache).loader()
    iterator = iter(loader)
    next(iterator)
    state = loader.state_dict()  # its shuffle buffer: references into this chat cache
    other = stages(source, qwen3, cache, max_length=200).loader()
    with pytest.raises(
        pp.StateMismatchError, match=r"^CacheFiller state doesn't match this pipeline: setting 'fingerp"
    ):
        other.load_state_dict(state)
        next(iter(other))


@pytest.mark.slow  # seconds: make test runs it, test-fast leaves it out
def test_chat_cache_keeps_the_shuffle_buffer_state_small_on_a_cached_epoch(tmp_path, qwen3):
    source, cache = write(tmp_path, chats()), str(tmp_path / "cache")
    epochs(stages(source, qwen3, cache).loader(), 1)
    plain, cached = stages(source, qwen3).loader(), stages(source, qwen3, cache).loader()
    iter_plain, iter_cached = iter(plain), iter(cached)
    next(iter_plain), next(iter_cached)
    shuffle = "token_cache"  # the shuffle buffer's rows are saved as references into the cache
    assert shuffle in str(cached.state_dict()) and shuffle not in str(plain.state_dict())
    assert len(pickle.dumps(cached.state_dict())) < len(pickle.dumps(plain.state_dict()))


def test_chat_cache_raises_the_same_error_as_without_it(tmp_path, qwen3):
    source = write(tmp_path, chats())
    with pytest.raises(pp.DataError) as plain:
        epochs(stages(source, qwen3, on_error="raise").loader(), 1)
    with pytest.raises(pp.DataError, match=f"^{re.escape(str(plain.value))}$"):
        epochs(stages(source, qwen3, str(tmp_path / "cache"), on_error="raise").loader(), 1)


def test_chat_cache_raises_error_for_a_pipeline_it_cannot_key(tmp_path, qwen3):
    with pytest.raises(ValueError, match=r"^`cache` needs a reader with work units .* from_iterable\(\) instead\.$"):
        pp.from_iterable(chats()).chat(qwen3, cache=str(tmp_path / "cache"))


def test_chat_cache_files_lie_under_the_cache_format_folder(tmp_path, qwen3):
    source, cache = write(tmp_path, chats()), tmp_path / "cache"
    epochs(stages(source, qwen3, str(cache)).loader(), 1)
    assert segment_files(cache) and all(FORMAT in p.parts for p in segment_files(cache))
    info = pp.cache.info(str(cache))
    (about,) = info.fingerprints.values()
    assert about["stage"] == "chat" and about["options"]["max_length"] == 256
    assert re.search(r"\n  [0-9a-f]{20}: chat\(\) max_length=256, train_on=assistant, messages=messages$", str(info))
