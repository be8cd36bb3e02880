"""pp.mix: a Pipeline mixing pipelines by weight, then tokenized, bucketed and padded as usual."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import padpipe as pp
from tests.contract import check_loader_resume

WORDS = "the cat sat on a mat and then ran far away".split()


def texts(base: int, n: int) -> list[dict]:
    return [{"text": " ".join(WORDS[: 1 + (i * 7) % len(WORDS)]), "rid": base + i} for i in range(n)]


def parquet(tmp_path, name: str, base: int, n: int, group: int) -> str:
    path = str(tmp_path / f"{name}.parquet")
    pq.write_table(pa.Table.from_pylist(texts(base, n)), path, row_group_size=group)
    return path


def rids(loader) -> list[int]:
    return [r for batch in loader for r in batch["rid"].tolist()]


def test_mix_works(tmp_path):
    web = pp.read_parquet(parquet(tmp_path, "web", 0, 60, 8)).shuffle(buffer_size=16, seed=3)
    code = pp.read_parquet(parquet(tmp_path, "code", 1000, 25, 5))
    mixed = pp.mix({"web": web, "code": code}, weights={"web": 0.7, "code": 0.3}, seed=0, chunk_rows=16)
    assert mixed.output == "records" and mixed.seed == 0
    pipe = mixed.tokenize(pp.examples.tokenizer()).bucket(max_tokens=64).pad()
    got = rids(pipe.loader())
    assert sorted(got) == list(range(60)) + list(range(1000, 1025))
    assert rids(pipe.loader()) == got  # deterministic
    again = pp.mix({"web": web, "code": code}, weights={"web": 0.7, "code": 0.3}, seed=1, chunk_rows=16)
    assert rids(again.tokenize(pp.examples.tokenizer()).bucket(max_tokens=64).pad().loader()) != got


def test_mix_splits_the_sub_pipelines_across_consumers(tmp_path):
    web = pp.read_parquet(parquet(tmp_path, "web", 0, 60, 8))
    code = pp.read_parquet(parquet(tmp_path, "code", 1000, 25, 5))
    pipe = (
        pp.mix({"web": web, "code": code}, weights={"web": 1, "code": 1})
        .tokenize(pp.examples.tokenizer())
        .batch(4)
        .pad()
    )
    shares = [
        rids(pipe.loader(consumer=pp.Consumer(rank=r, world_size=2, worker=w, num_workers=2)))
        for r in range(2)
        for w in range(2)
    ]
    assert all(shares) and sorted(sum(shares, [])) == list(range(60)) + list(range(1000, 1025))


def test_mix_works_with_tokenized_pipelines():
    tok = pp.examples.tokenizer()
    a = pp.from_iterable(texts(0, 30)).tokenize(tok)
    b = pp.from_iterable([{"question": t["text"], "rid": t["rid"]} for t in texts(500, 10)]).tokenize(
        tok, fields="question"
    )
    pipe = pp.mix({"a": a, "b": b}, weights={"a": 2, "b": 1}, chunk_rows=8).bucket(max_tokens=48).pad(pad_id=0)
    assert sorted(rids(pipe.loader())) == list(range(30)) + list(range(500, 510))


def test_mix_raises_error_when_arguments_are_bad():
    a, b = pp.from_iterable(texts(0, 4)), pp.from_iterable(texts(10, 4))
    with pytest.raises(ValueError, match=r"^`weights\['b'\]` must be a number greater than zero, but is -1 instead\.$"):
        pp.mix({"a": a, "b": b}, weights={"a": 1, "b": -1})
    with pytest.raises(
        ValueError,
        match=r"^`weights` must have exactly the keys \['a', 'b'\], but misses \['b'\] and has extra \[\] instead\.$",
    ):
        pp.mix({"a": a, "b": b}, weights={"a": 1})
    with pytest.raises(
        ValueError,
        match=r"^mix\(\) needs pipelines that all yield records or all yield tokens, but they yield \{'a': 'records', 'b': 'tokens'\}\.$",
    ):
        pp.mix({"a": a, "b": b.tokenize(pp.examples.tokenizer())}, weights={"a": 1, "b": 1})
    with pytest.raises(ValueError, match=r"^`stop` must be one of .*, but is 'never' instead\.$"):
        pp.mix({"a": a}, weights={"a": 1}, stop="never")
    with pytest.raises(TypeError, match=r"^`pipelines\['a'\]` must be a padpipe Pipeline, but is list instead\.$"):
        pp.mix({"a": [1]}, weights={"a": 1})
    assert pp.mix({"a": a, "b": b}).source.options["weights"] == {"a": 1.0, "b": 1.0}  # default: equal


@pytest.mark.parametrize("stop", ["all_exhausted", "first_exhausted", "cycle"])
def test_mix_saves_and_restores_its_state(stop):
    a = pp.from_iterable(texts(0, 20), chunk_rows=3).shuffle(buffer_size=5, seed=1)
    b = pp.from_iterable(texts(100, 8), chunk_rows=2)
    mixed = pp.mix({"a": a, "b": b}, weights={"a": 0.6, "b": 0.4}, seed=2, stop=stop, chunk_rows=5)
    pipe = mixed.tokenize(pp.examples.tokenizer()).bucket(max_tokens=40, buffer_size=8).pad()
    check_loader_resume(pipe.loader, epochs=2)


def test_mix_of_tokenized_pipelines_pads_and_packs_with_the_tokenizers_pad_token(tmp_path):
    tok = pp.examples.tokenizer()
    a = pp.from_iterable(texts(0, 2)).tokenize(tok)  # 2 + 2 short documents: one packed row, padded
    b = pp.from_iterable(texts(100, 2)).tokenize(tok)
    packed = next(iter(pp.mix({"a": a, "b": b}, seed=0).pack(64).loader()))
    assert packed["input_ids"].shape == (1, 64) and packed["input_ids"][0, -1].item() == tok.token_to_id("[PAD]") == 0
    padded = next(iter(pp.mix({"a": a, "b": b}, seed=0).batch(4).pad(side="left").loader()))
    assert padded["input_ids"][padded["attention_mask"] == 0].unique().tolist() == [0]
