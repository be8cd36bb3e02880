"""A big vocabulary costs once: a loader's build serializes and parses its tokenizer at most once per process,
the fingerprint comes from that one serialization, and a tokenizer changed in place is read again.

Calls to the Rust tokenizer's ``to_str`` (serialize) and ``from_str`` (parse) are counted with a profile hook
(``sys.setprofile`` sees every call of a built-in from Python code, in every thread), never timed.
"""

from __future__ import annotations

import collections
import hashlib
import json
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from tokenizers import Tokenizer, processors

import padpipe as pp
from padpipe.recipes.sft import sft
from padpipe.tokenizer import TextEncoder
from padpipe.tokenizer.serialized import tokenizer_json
from tests import chat_fixtures as fx
from tests import tokenizer_fixtures as tf

COUNTED = {"Tokenizer.to_str": "to_str", "Tokenizer.from_str": "from_str"}


@contextmanager
def tokenizer_calls() -> Iterator[collections.Counter[str]]:
    """Count the ``to_str`` and ``from_str`` calls of ``tokenizers.Tokenizer`` made inside the block, any thread."""
    calls: collections.Counter[str] = collections.Counter()

    def hook(frame: Any, event: str, arg: Any) -> None:
        if event == "c_call" and getattr(arg, "__qualname__", "") in COUNTED:
            calls[COUNTED[arg.__qualname__]] += 1

    sys.setprofile(hook)
    threading.setprofile(hook)
    try:
        yield calls
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]


def _chats(tmp_path: Any, rows: list[dict[str, Any]]) -> str:
    path = tmp_path / "chats.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def _epoch(pipe: pp.Pipeline) -> tuple[list[list[int]], pp.StatsSnapshot]:
    loader = pipe.loader()
    rows = [ids for batch in loader for ids in batch["input_ids"].tolist() + batch["labels"].tolist()]
    return rows, loader.stats()


def test_a_chat_loader_serializes_and_parses_its_tokenizer_once_and_a_cached_epoch_not_at_all(tmp_path):
    path = _chats(tmp_path, [{"messages": c, "id": i} for i, c in enumerate(fx.conversations(30, seed=1))])
    cache = str(tmp_path / "cache")
    tok = fx.tokenizer()
    with tokenizer_calls() as calls:
        uncached, _ = _epoch(sft(path, tok, seq_len=256, batch_size=2))
    assert calls == {"to_str": 1, "from_str": 1}
    with tokenizer_calls() as calls:  # the same tokenizer again in this process: read from the memo
        filled, _ = _epoch(sft(path, tok, seq_len=256, batch_size=2, cache=cache))
    assert calls == {"from_str": 1}  # the conversations rendered into the cache need a copy to tokenize with
    with tokenizer_calls() as calls:  # a later run on the filled cache: nothing to render, no copy made
        cached, stats = _epoch(sft(path, tok, seq_len=256, batch_size=2, cache=cache))
    assert calls == {}
    assert uncached == filled == cached and stats.counters["cache.hit_rows"] == 30


def test_a_tokenize_loader_serializes_and_parses_its_tokenizer_once():
    tok = tf.bpe()[1]
    with tokenizer_calls() as calls:
        pipe = pp.read_jsonl(pp.examples.SAMPLE_JSONL).tokenize(tok, max_length=64).batch(64).pad()
        batches = sum(1 for _ in pipe.loader())
    assert batches > 1 and calls == {"to_str": 1, "from_str": 1}


def test_a_tokenizer_changed_in_place_is_read_again_and_misses_the_cache_it_filled(tmp_path):
    path = _chats(tmp_path, [{"messages": c} for c in fx.conversations(12, seed=2)])
    cache = str(tmp_path / "cache")
    tok = fx.tokenizer()
    backend = tok.backend_tokenizer
    before = tokenizer_json(backend)
    assert tokenizer_json(backend) is before
    _, filled = _epoch(sft(path, tok, seq_len=256, batch_size=2, cache=cache))
    tok.add_tokens(["<extra>"])
    after = tokenizer_json(backend)
    assert after.vocab_size == before.vocab_size + 1 and after.fingerprint != before.fingerprint
    _, again = _epoch(sft(path, tok, seq_len=256, batch_size=2, cache=cache))
    assert filled.counters["cache.miss_rows"] == again.counters["cache.miss_rows"] == 12
    assert "cache.hit_rows" not in again.counters
    backend.post_processor = processors.ByteLevel(trim_offsets=False)  # no new token, another tokenizer
    assert tokenizer_json(backend).fingerprint != after.fingerprint


@pytest.mark.parametrize(
    "make, setting, value",
    [
        (pp.examples.tokenizer, "max_input_chars_per_word", 4),  # WordPiece: a longer word becomes [UNK]
        (lambda: tf.bpe()[0], "ignore_merges", True),  # BPE: a word in the vocabulary taken whole
        (lambda: tf.bpe()[0], "fuse_unk", True),
    ],
    ids=["max_input_chars_per_word", "ignore_merges", "fuse_unk"],
)
def test_a_model_setting_changed_in_place_is_read_again(make, setting, value):
    tok = make()
    before = tokenizer_json(tok)
    assert getattr(tok.model, setting) != value
    setattr(tok.model, setting, value)
    after = tokenizer_json(tok)
    assert after.fingerprint != before.fingerprint
    assert after.text == tokenizer_json(Tokenizer.from_str(tok.to_str())).text  # a fresh object: serialized anew
    text = "internationalization matters"
    enc = TextEncoder.load(tok, max_length=None, truncation=False, add_special_tokens=True)
    assert enc.encode([text]).ids.tolist() == tok.encode(text).ids


def test_truncation_and_padding_left_by_a_call_do_not_change_the_fingerprint():
    tok = tf.bpe()[1]
    before = TextEncoder.load(tok, max_length=None, truncation=False, add_special_tokens=True).fingerprint()
    tok(["a b c"], truncation=True, max_length=3, padding="max_length")  # transformers leaves both set
    assert tok.backend_tokenizer.truncation is not None and tok.backend_tokenizer.padding is not None
    found = tokenizer_json(tok.backend_tokenizer)
    assert found.fingerprint == before
    copy = Tokenizer.from_str(tok.backend_tokenizer.to_str())  # the digest of the JSON without them, as before
    copy.no_truncation()
    copy.no_padding()
    assert found.text == copy.to_str()
    assert (
        found.fingerprint == f"vocab={copy.get_vocab_size()} sha1={hashlib.sha1(found.text.encode()).hexdigest()[:16]}"
    )


def test_an_encoder_sent_to_a_worker_carries_the_json_and_encodes_the_same():
    import pickle

    enc = TextEncoder.load(tf.bpe()[1], max_length=8, truncation=True, add_special_tokens=True)
    with tokenizer_calls() as calls:
        copy = pickle.loads(pickle.dumps(enc))
    assert calls == {"from_str": 1}  # parsed on arrival, never serialized to be sent
    texts, pairs = ["the cat sat on the mat " * 4, "a"], ["dog", "the red table " * 3]
    assert copy.encode(texts, pairs).ids.tolist() == enc.encode(texts, pairs).ids.tolist()
    assert copy.fingerprint() == enc.fingerprint()


@pytest.mark.slow
def test_qwens_real_151k_vocabulary_is_serialized_and_parsed_once_per_chat_loader(tmp_path):
    from tests.chat import real_templates as rt

    tok = tf.qwen(rt.template_text("trl:qwen3"))
    assert len(tok) == 151_669 and tok("Hello world")["input_ids"] == [9707, 1879]  # Qwen's own ids
    path = _chats(tmp_path, [{"messages": c} for c in rt.conversations("qwen3", 20, seed=0)])
    cache = str(tmp_path / "cache")
    with tokenizer_calls() as calls:
        filled, _ = _epoch(sft(path, tok, seq_len=1024, batch_size=2, cache=cache))
    assert calls == {"to_str": 1, "from_str": 1}
    with tokenizer_calls() as calls:
        cached, stats = _epoch(sft(path, tok, seq_len=1024, batch_size=2, cache=cache))
    assert calls == {} and cached == filled and stats.counters["cache.hit_rows"] == 20
