"""TextEncoder: ids and type ids equal the ``transformers`` tokenizer's own output, row for row."""

from __future__ import annotations

import pickle
import re

import numpy as np
import pytest
from tokenizers import Tokenizer

from padpipe import examples
from padpipe.tokenizer import TextEncoder
from tests import tokenizer_fixtures as fx

KINDS = ("shipped", "wordpiece", "bpe")
MAKERS = {
    "shipped": lambda **kw: fx.shipped() if not kw else (examples.tokenizer(), _shipped_hf(**kw)),
    "wordpiece": fx.wordpiece,
    "bpe": fx.bpe,
}


def _shipped_hf(**options):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(examples.TOKENIZER_DIR, **options)


@pytest.fixture(scope="module", params=KINDS)
def kind(request):
    return request.param


@pytest.fixture(scope="module")
def tokenizers_of(kind):
    return MAKERS[kind]()


def _load(tok, max_length=None, truncation=True, add_special_tokens=True):
    return TextEncoder.load(tok, max_length=max_length, truncation=truncation, add_special_tokens=add_special_tokens)


def _check_matches_hf(enc, hf, firsts, seconds, **call):
    got_ids, got_types = fx.chunk_rows(enc.encode(firsts, seconds))
    want_ids, want_types = fx.hf_rows(hf, firsts, seconds, **call)
    assert got_ids == want_ids
    assert got_types == want_types


CASES = [  # (max_length, truncation, add_special_tokens)
    (None, True, True),
    (None, False, True),
    (16, True, True),
    (5, True, True),
    (16, True, False),
    (16, False, True),
]


@pytest.mark.parametrize("max_length, truncation, special", CASES)
@pytest.mark.parametrize("use_pairs", [False, True], ids=["single", "pairs"])
def test_encoder_works(tokenizers_of, max_length, truncation, special, use_pairs):
    _, hf = tokenizers_of
    firsts, seconds = (list(x) for x in zip(*fx.pairs())) if use_pairs else (fx.texts(), None)
    enc = _load(hf, max_length, truncation, special)
    call = dict(truncation=truncation, max_length=max_length, add_special_tokens=special)
    _check_matches_hf(enc, hf, firsts, seconds, **call)


@pytest.mark.parametrize("use_pairs", [False, True], ids=["single", "pairs"])
def test_encoder_from_tokenizers_object_matches_its_hf_wrapper(tokenizers_of, use_pairs):
    raw, hf = tokenizers_of
    firsts, seconds = (list(x) for x in zip(*fx.pairs())) if use_pairs else (fx.texts(), None)
    enc = _load(raw, max_length=12)
    got_ids, got_types = fx.chunk_rows(enc.encode(firsts, seconds))
    want_ids, _ = fx.hf_rows(hf, firsts, seconds, truncation=True, max_length=12)
    assert got_ids == want_ids
    assert enc.returns_token_type_ids == ("token_type_ids" in hf.model_input_names)
    if enc.returns_token_type_ids:
        assert got_types == fx.hf_rows(hf, firsts, seconds, truncation=True, max_length=12)[1]


@pytest.mark.parametrize("max_length, truncation, special", CASES)
def test_encoder_truncation_config_equals_transformers(tokenizers_of, max_length, truncation, special):
    _, hf = tokenizers_of
    enc = _load(hf, max_length, truncation, special)
    hf("a b c", "d e", truncation=truncation, max_length=max_length, add_special_tokens=special)
    assert enc._tokenizer.truncation == hf.backend_tokenizer.truncation
    assert enc._tokenizer.padding is None


@pytest.mark.slow  # seconds alone: make test runs it, test-fast leaves it out
def test_encoder_works_with_left_truncation_side(kind):
    raw, hf = MAKERS[kind](truncation_side="left")
    assert hf.truncation_side == "left"
    firsts, seconds = (list(x) for x in zip(*fx.pairs()))
    for max_length in (5, 9, 20):
        enc = _load(hf, max_length)
        assert enc.truncation_side == "left"
        _check_matches_hf(enc, hf, firsts, seconds, truncation=True, max_length=max_length)
        _check_matches_hf(enc, hf, firsts, None, truncation=True, max_length=max_length)


def test_encoder_left_truncation_of_a_raw_tokenizer_follows_its_baked_direction():
    raw, hf = fx.wordpiece(truncation_side="left")
    raw.enable_truncation(100, direction="left")
    enc = _load(raw, max_length=6)
    _check_matches_hf(enc, hf, fx.texts(), None, truncation=True, max_length=6)


def test_encoder_uses_model_max_length_only_when_it_is_a_real_limit():
    _, hf = fx.wordpiece(model_max_length=10)
    enc = _load(hf)
    assert enc.max_length == 10
    _check_matches_hf(enc, hf, fx.texts(), None, truncation=True)
    assert _load(fx.wordpiece()[1]).max_length is None
    assert _load(examples.tokenizer()).max_length is None
    assert _load(examples.TOKENIZER_DIR).max_length == 512
    assert _load(examples.TOKENIZER_DIR, max_length=7, truncation=False).max_length is None


def test_encoder_pairs_with_an_empty_second_text_match_the_batch_call():
    # hf("a", "") drops the empty pair (a single-call quirk); the batch call keeps it, as we do.
    _, hf = fx.shipped()
    firsts, seconds = ["a cat", "", "dog"], ["", "", "a mat"]
    got_ids, got_types = fx.chunk_rows(_load(hf, 8).encode(firsts, seconds))
    want = hf(firsts, seconds, truncation=True, max_length=8)
    assert got_ids == want["input_ids"]
    assert got_types == want["token_type_ids"]


def test_encoder_reports_special_token_ids():
    enc = _load(examples.hf_tokenizer())
    assert (enc.pad_id, enc.eos_id, enc.bos_id, enc.returns_token_type_ids) == (0, None, None, True)
    raw_bpe, hf_bpe = fx.bpe()
    enc = _load(hf_bpe)
    want = (hf_bpe.pad_token_id, hf_bpe.eos_token_id, hf_bpe.bos_token_id, False)
    assert (enc.pad_id, enc.eos_id, enc.bos_id, enc.returns_token_type_ids) == want
    enc = _load(raw_bpe)
    assert (enc.pad_id, enc.eos_id, enc.bos_id, enc.returns_token_type_ids) == want
    assert _load(examples.tokenizer()).pad_id == examples.tokenizer().token_to_id("[PAD]")


def test_encoder_takes_pad_id_from_the_padding_config_before_the_vocab():
    raw = examples.tokenizer()
    raw.enable_padding(pad_id=7, pad_token="[MASK]")
    assert _load(raw).pad_id == 7
    raw, _ = fx.bpe()
    raw.add_special_tokens(["[PAD]"])  # bpe has "<pad>" too; "[PAD]" is looked up first
    assert _load(raw).pad_id == raw.token_to_id("[PAD]")


def test_encoder_does_not_change_the_users_tokenizer():
    raw, hf = fx.wordpiece()
    raw.enable_padding(pad_id=0, length=40)
    raw.enable_truncation(30)
    before = raw.to_str()
    enc = _load(raw, max_length=6)
    assert raw.to_str() == before
    assert len(raw.encode("a").ids) == 40
    assert enc._tokenizer.padding is None and enc._tokenizer.truncation["max_length"] == 6
    hf_before = hf.backend_tokenizer.to_str()
    _load(hf, max_length=6)
    assert hf.backend_tokenizer.to_str() == hf_before


def test_encoder_loads_a_tokenizer_json_path_and_a_folder(tmp_path):
    texts = fx.texts()
    want = _load(examples.hf_tokenizer(), 32).encode(texts)
    for source in (examples.TOKENIZER_JSON, examples.TOKENIZER_DIR):
        assert fx.chunk_rows(_load(source, 32).encode(texts))[0] == fx.chunk_rows(want)[0]
    raw, hf = fx.bpe()
    raw.save(str(tmp_path / "bpe.json"))
    hf.save_pretrained(str(tmp_path / "bpe"))
    from_file, from_dir = _load(str(tmp_path / "bpe.json"), 9), _load(tmp_path / "bpe", 9)
    assert not from_dir.returns_token_type_ids and from_dir.eos_id == hf.eos_token_id
    _check_matches_hf(from_file, hf, texts, None, truncation=True, max_length=9)
    _check_matches_hf(from_dir, hf, texts, None, truncation=True, max_length=9)


def test_encoder_keeps_split_special_tokens():
    _, hf = fx.shipped()
    hf.split_special_tokens = True
    enc = _load(hf)
    _check_matches_hf(enc, hf, ["[CLS] hello [SEP]"], None, truncation=True)
    assert pickle.loads(pickle.dumps(enc)).encode(["[CLS]"]).num_tokens == enc.encode(["[CLS]"]).num_tokens > 3


def test_encoder_saves_and_restores_its_settings_through_pickle(tokenizers_of):
    _, hf = tokenizers_of
    enc = _load(hf, max_length=7, add_special_tokens=False)
    copy = pickle.loads(pickle.dumps(enc))
    firsts, seconds = (list(x) for x in zip(*fx.pairs()))
    assert fx.chunk_rows(copy.encode(firsts, seconds)) == fx.chunk_rows(enc.encode(firsts, seconds))
    assert (copy.max_length, copy.pad_id, copy.returns_token_type_ids) == (7, enc.pad_id, enc.returns_token_type_ids)


def test_encoder_encodes_an_empty_batch():
    chunk = _load(examples.tokenizer()).encode([])
    assert (chunk.num_rows, chunk.ids.tolist(), chunk.type_ids.tolist()) == (0, [], [])


def test_encoder_raises_error_when_tokenizer_is_slow():
    from transformers import ByT5Tokenizer

    with pytest.raises(TypeError, match=r"^tokenize\(\) needs a fast \(Rust\) tokenizer, but ByT5Tokenizer is a slow"):
        _load(ByT5Tokenizer())


def test_encoder_raises_error_when_tokenizer_is_unknown(tmp_path):
    with pytest.raises(
        TypeError, match=r"^`tokenizer` must be a transformers fast tokenizer, .* but is int instead\.$"
    ):
        _load(3)
    with pytest.raises(FileNotFoundError, match=r"^Tokenizer '.*missing\.json': no such file or folder\.$"):
        _load(str(tmp_path / "missing.json"))
    with pytest.raises(ValueError, match=r"^`max_length` must be greater than zero, but is 0 instead\.$"):
        _load(examples.tokenizer(), max_length=0)
    with pytest.raises(TypeError, match=r"^`truncation` must be a bool, but is 'yes' instead\.$"):
        _load(examples.tokenizer(), truncation="yes")


def test_encoder_copies_a_tokenizers_object_without_sharing_it():
    raw = examples.tokenizer()
    enc = _load(raw, max_length=4)
    assert isinstance(enc._tokenizer, Tokenizer) and enc._tokenizer is not raw
    assert raw.truncation is None


@pytest.mark.slow  # seconds alone: make test runs it, test-fast leaves it out
def test_encoder_truncates_long_pairs_as_the_rust_tokenizer_does():
    # the encoder cuts pairs in numpy (padpipe/tokenizer/truncate.py); the Rust call is the reference
    import pyarrow.parquet as pq

    table = pq.read_table(examples.SAMPLE_PARQUET, columns=["sentence1", "sentence2"]).slice(0, 400)
    firsts, seconds = table.column("sentence1").to_pylist(), table.column("sentence2").to_pylist()
    for side in ("right", "left"):
        for max_length, special in ((64, True), (128, True), (3, True), (2, True), (17, False)):
            rust = examples.tokenizer()
            rust.enable_truncation(max_length, direction=side)
            enc = _load(rust, max_length, add_special_tokens=special)
            want = rust.encode_batch(list(zip(firsts, seconds)), add_special_tokens=special)
            got_ids, got_types = fx.chunk_rows(enc.encode(firsts, seconds))
            assert got_ids == [e.ids for e in want]
            assert got_types == [e.type_ids for e in want]


@pytest.mark.parametrize(
    "n1, n2, want",
    # the table of tokenizers' own truncate_encodings_longest_first test (max_length 7)
    [
        (0, 8, (0, 7)),
        (2, 8, (2, 5)),
        (4, 4, (3, 4)),
        (4, 8, (3, 4)),
        (8, 0, (7, 0)),
        (8, 2, (5, 2)),
        (8, 4, (4, 3)),
        (8, 8, (3, 4)),
    ],
)
def test_pair_keep_lengths_works(n1, n2, want):
    from padpipe.tokenizer.truncate import pair_keep_lengths

    k1, k2 = pair_keep_lengths(np.array([n1]), np.array([n2]), 7)
    assert (int(k1[0]), int(k2[0])) == want


@pytest.mark.parametrize(
    "name", ["padpipe/data/tokenzier", "./tok", "../tok", "~/no-such-tok", "tokenizer.json", "data/tok/", "a/b/c"]
)
def test_encoder_raises_error_at_once_when_a_path_names_nothing(name, monkeypatch):
    import transformers

    def online(*args, **kwargs):  # a path that names nothing must never reach the Hub
        raise AssertionError(f"from_pretrained({args}) was called")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", online)
    with pytest.raises(
        FileNotFoundError, match=rf"^Tokenizer {re.escape(repr(name))}: no such file or folder\.$"
    ) as raised:
        _load(name)
    assert raised.value.__cause__ is None and raised.value.__context__ is None
    from pathlib import Path

    with pytest.raises(FileNotFoundError, match=r"^Tokenizer '.*missing': no such file or folder\.$"):
        _load(Path("missing"))  # a Path is a path, whatever its name


def test_encoder_takes_org_name_as_a_path_when_org_is_a_local_folder(tmp_path, monkeypatch):
    (tmp_path / "data").mkdir()
    monkeypatch.chdir(tmp_path)
    message = (
        r"^Tokenizer 'data/tokenzier': no such file or folder \('data' is a local folder; for the hub name, "
        r"pass AutoTokenizer\.from_pretrained\('data/tokenzier'\)\)\.$"
    )
    with pytest.raises(FileNotFoundError, match=message):
        _load("data/tokenzier")


@pytest.mark.parametrize("name", ["bert-base-uncased", "google-bert/bert-base-uncased", "org/model.v2"])
def test_encoder_loads_hub_names_with_from_pretrained(name, monkeypatch):
    import transformers

    asked, shipped = [], _shipped_hf()

    def from_pretrained(path, *args, **kwargs):
        asked.append(path)
        return shipped

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", from_pretrained)
    assert _load(name).pad_id == 0 and asked == [name]
    assert _load(examples.TOKENIZER_DIR).pad_id == 0 and asked[-1] == examples.TOKENIZER_DIR  # a folder, the same way


def test_the_fingerprint_is_the_tokenizers_json_without_truncation_or_padding_for_every_setting() -> None:
    import hashlib

    plain = examples.tokenizer()
    plain.no_truncation()
    plain.no_padding()
    expected = f"vocab=8000 sha1={hashlib.sha1(plain.to_str().encode()).hexdigest()[:16]}"
    baked = examples.tokenizer()
    baked.enable_truncation(5)  # a truncation of its own, left out too
    for tok in (examples.tokenizer(), baked):
        for max_length, truncation in ((None, False), (8, True), (3, True)):
            enc = TextEncoder.load(tok, max_length=max_length, truncation=truncation, add_special_tokens=True)
            copy = pickle.loads(pickle.dumps(enc))  # as a worker gets it, before anything was digested
            assert enc.fingerprint() == copy.fingerprint() == expected
    other = TextEncoder.load(fx.bpe()[0], max_length=8, truncation=True, add_special_tokens=True)
    assert other.fingerprint() != expected
