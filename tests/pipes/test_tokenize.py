"""ChunkTokenizer and the tokenize stage: exact ids, bad-text policy, pass-through columns, resume."""

from __future__ import annotations

import json
import pickle
import re
import traceback

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from torchdata.nodes import Loader

import padpipe as pp
from padpipe.chunks import TokenChunk
from padpipe.errors import DataError
from padpipe.stats import PipelineStats
from padpipe.tokenizer import TextEncoder
from padpipe.tokenizer.rows import ChunkTokenizer
from tests import tokenizer_fixtures as fx
from tests.contract import check_node_resume


def _encoder(tok, max_length=None, **kw):
    return TextEncoder.load(tok, max_length=max_length, truncation=True, add_special_tokens=True, **kw)


def _chunks(pipe):
    """The token chunks a pipeline ending in tokenize yields (``loader()`` asks for pad/pack first)."""
    return list(Loader(pipe.build(consumer=pp.Consumer())))


def _sample(n=200):
    return pq.read_table(pp.examples.SAMPLE_PARQUET).slice(0, n).combine_chunks().to_batches()[0]


@pytest.fixture(scope="module")
def hf():
    return pp.examples.hf_tokenizer()


@pytest.mark.parametrize("max_length", [None, 24])
@pytest.mark.parametrize("fields", [("sentence1",), ("sentence1", "sentence2")], ids=["single", "pairs"])
def test_tokenize_works(hf, fields, max_length):
    batch = _sample()
    chunk = ChunkTokenizer(_encoder(hf, max_length), fields=fields)(batch)
    texts = [batch.column(f).to_pylist() for f in fields]
    want = fx.hf_rows(hf, texts[0], texts[1] if len(texts) == 2 else None, truncation=True, max_length=max_length)
    assert fx.chunk_rows(chunk) == want
    assert chunk.ids.dtype.name == "int32" and chunk.type_ids.dtype.name == "int8"
    other = [n for n in batch.schema.names if n not in fields]
    assert list(chunk.columns) == [("labels" if n == "label" else n) for n in other]
    assert chunk.columns["labels"].equals(batch.column("label"))
    assert chunk.columns["idx"].equals(batch.column("idx"))


@pytest.mark.parametrize("maker", [fx.wordpiece, fx.bpe], ids=["wordpiece", "bpe"])
def test_tokenize_works_with_trained_tokenizers(maker):
    _, tok = maker()
    pairs = fx.pairs()
    batch = pa.RecordBatch.from_pydict({"a": [p[0] for p in pairs], "b": [p[1] for p in pairs]})
    chunk = ChunkTokenizer(_encoder(tok, 12), fields=("a", "b"))(batch)
    assert fx.chunk_rows(chunk) == fx.hf_rows(
        tok, batch.column("a").to_pylist(), batch.column("b").to_pylist(), truncation=True, max_length=12
    )
    assert (chunk.type_ids is None) == ("token_type_ids" not in tok.model_input_names)
    assert chunk.columns == {}


def test_tokenize_works_with_empty_and_dictionary_encoded_text(hf):
    text = pa.array(["", "a cat", ""]).dictionary_encode()
    chunk = ChunkTokenizer(_encoder(hf), fields="text")(pa.RecordBatch.from_arrays([text], names=["text"]))
    cls, sep = hf.cls_token_id, hf.sep_token_id
    assert fx.chunk_rows(chunk)[0] == [[cls, sep], hf("a cat")["input_ids"], [cls, sep]]


def test_tokenize_keeps_both_label_and_labels_as_they_are(hf):
    batch = pa.RecordBatch.from_pydict({"text": ["a", "b"], "label": [1, 0], "labels": [[1], [2, 3]], "id": ["x", "y"]})
    chunk = ChunkTokenizer(_encoder(hf), fields=("text",))(batch)
    assert {k: v.to_pylist() for k, v in chunk.columns.items()} == {
        "label": [1, 0],
        "labels": [[1], [2, 3]],
        "id": ["x", "y"],
    }


def test_tokenize_reports_its_counters(hf):
    stats = PipelineStats()
    chunk = ChunkTokenizer(_encoder(hf), fields=("sentence1",), stats=stats)(_sample(50))
    snap = stats.snapshot()
    assert snap.counters == {"tokenize.rows": 50, "tokenize.tokens": chunk.num_tokens}
    assert snap.seconds["tokenize"] > 0 and snap.skipped == {}


def test_tokenize_skips_bad_rows_and_counts_them(hf):
    stats = PipelineStats()
    batch = pa.RecordBatch.from_pydict(
        {"s1": ["a", None, "c", "d", None], "s2": ["w", "x", None, "z", None], "label": [0, 1, 2, 3, 4]}
    )
    chunk = ChunkTokenizer(_encoder(hf), fields=("s1", "s2"), on_error="skip", stats=stats)(batch)
    assert chunk.columns["labels"].to_pylist() == [0, 3]
    assert fx.chunk_rows(chunk)[0] == [hf("a", "w")["input_ids"], hf("d", "z")["input_ids"]]
    assert stats.snapshot().skipped == {"tokenize.bad_text": 3}
    assert stats.snapshot().counters["tokenize.rows"] == 2
    all_bad = pa.RecordBatch.from_pydict({"s1": [None], "s2": ["x"], "label": [9]})
    empty = ChunkTokenizer(_encoder(hf), fields=("s1", "s2"), on_error="skip", stats=stats)(all_bad)
    assert (empty.num_rows, empty.columns["labels"].to_pylist()) == (0, [])
    assert stats.snapshot().skipped == {"tokenize.bad_text": 4}


def test_tokenize_skips_a_column_that_is_not_text(hf):
    stats = PipelineStats()
    batch = pa.RecordBatch.from_pydict({"text": [1, 2], "idx": [0, 1]})
    chunk = ChunkTokenizer(_encoder(hf), fields="text", on_error="skip", stats=stats)(batch)
    assert chunk.num_rows == 0 and stats.snapshot().skipped == {"tokenize.bad_text": 2}


def test_tokenize_raises_error_when_text_is_none(hf):
    batch = pa.RecordBatch.from_pydict({"s1": ["a", "b", "c"], "s2": ["x", None, None], "idx": [10, 11, 12]})
    pattern = (
        r"^tokenize: field 's2' at row 1 of the chunk \(idx=11\) is None; expected a string\. "
        r"2 row\(s\) of this chunk have bad text; pass on_error='skip' to drop them\.$"
    )
    with pytest.raises(DataError, match=pattern):
        ChunkTokenizer(_encoder(hf), fields=("s1", "s2"))(batch)
    no_ids = pa.RecordBatch.from_pydict({"text": ["a", None]})
    with pytest.raises(DataError, match=r"^tokenize: field 'text' at row 1 of the chunk is None; expected a string\."):
        ChunkTokenizer(_encoder(hf), fields="text")(no_ids)


def test_tokenize_raises_error_without_a_skip_hint_when_no_row_has_text(hf):
    """Issue 30 item 7: skipping would drop every row, so the message names the columns instead."""
    tokenize = ChunkTokenizer(_encoder(hf), fields="text")
    for column in (pa.array([None, None], pa.string()), pa.nulls(2)):  # a JSONL key in no row: type null
        with pytest.raises(
            DataError,
            match=r"^tokenize: field 'text' is None in all 2 rows of this chunk; expected a string: name "
            r"the text field\(s\) to tokenize \(the chunk's columns are \['text', 'id'\]\)\.$",
        ):
            tokenize(pa.RecordBatch.from_pydict({"text": column, "id": [1, 2]}))


def test_tokenize_raises_error_when_text_is_not_a_string(hf):
    batch = pa.RecordBatch.from_pydict({"text": [3, 4], "id": ["r0", "r1"]})
    pattern = (
        r"^tokenize: field 'text' is of type int64 in every row, not text; expected a string: name the text "
        r"field\(s\) to tokenize \(the chunk's columns are \['text', 'id'\]\)\.$"
    )
    with pytest.raises(DataError, match=pattern):
        ChunkTokenizer(_encoder(hf), fields="text")(batch)
    binary = pa.RecordBatch.from_pydict({"text": pa.array([b"a"], pa.binary())})
    with pytest.raises(DataError, match=r"^tokenize: field 'text' is of type binary in every row, not text; "):
        ChunkTokenizer(_encoder(hf), fields="text")(binary)


def test_tokenize_names_chat_template_for_a_column_of_messages(tmp_path):
    """Issue 30 item 7: tokenize(fields="messages") on chat rows suggested on_error='skip' (every row dropped)."""
    chat = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps({"messages": chat, "id": i}) + "\n" for i in range(40)))
    message = (
        rf"^tokenize: field 'messages'( from {re.escape(str(path))})? holds chat messages "
        r"\(list<item: struct<role: string, content: string>>\), not text; expected a string: apply the chat "
        r"template with \.chat\(tokenizer, messages='messages'\) instead of \.tokenize\(\.\.\.\)\.$"
    )
    for pipe in (pp.read_jsonl(str(path)), pp.read_jsonl(str(path)).shuffle(16)):
        with pytest.raises(DataError, match=message):
            list(pipe.tokenize(pp.examples.tokenizer(), fields="messages").batch(4).pad().loader())


def test_tokenize_raises_error_when_field_is_missing(hf):
    batch = pa.RecordBatch.from_pydict({"sentence": ["a"], "label": [1]})
    pattern = r"^tokenize: text field 'text' is not in the data; expected one of the columns \['sentence', 'label'\]\.$"
    with pytest.raises(DataError, match=pattern):
        ChunkTokenizer(_encoder(hf), fields="text")(batch)


def test_tokenize_raises_error_when_arguments_are_bad(hf):
    with pytest.raises(ValueError, match=r"^`on_error` must be one of \('raise', 'skip'\), but is 'warn' instead\.$"):
        ChunkTokenizer(_encoder(hf), fields="text", on_error="warn")
    with pytest.raises(ValueError, match=r"^`fields` must be one column name or two for pairs, but is \(\) instead\.$"):
        ChunkTokenizer(_encoder(hf), fields=())
    with pytest.raises(TypeError, match=r"^`encoder` must be a TextEncoder, but is str instead\.$"):
        ChunkTokenizer("bert", fields="text")


def _rows(n=45):
    batch = _sample(n)
    return [
        {"idx": r["idx"], "s1": r["sentence1"], "s2": r["sentence2"], "label": r["label"]} for r in batch.to_pylist()
    ]


@pytest.mark.parametrize("num_threads", [1, 3])
def test_tokenize_stage_in_a_pipeline_works(hf, num_threads):
    rows = _rows()
    pipe = pp.from_iterable(rows, chunk_rows=8).tokenize(
        hf, fields=("s1", "s2"), max_length=40, num_threads=num_threads
    )
    if num_threads > 1:  # the recipe (and its encoder) travels to DataLoader workers by pickle
        pipe = pickle.loads(pickle.dumps(pipe))
    chunks = _chunks(pipe)
    assert len(chunks) == 6 and all(isinstance(c, TokenChunk) for c in chunks)
    whole = TokenChunk.concat(chunks)
    want = fx.hf_rows(hf, [r["s1"] for r in rows], [r["s2"] for r in rows], truncation=True, max_length=40)
    assert fx.chunk_rows(whole) == want
    assert whole.columns["idx"].to_pylist() == [r["idx"] for r in rows]
    assert whole.columns["labels"].to_pylist() == [r["label"] for r in rows]


@pytest.mark.parametrize("num_threads", [1, 2])
def test_tokenize_stage_raises_error_in_the_consumer(num_threads):
    rows = [{"text": "a", "idx": 0}, {"text": None, "idx": 1}]
    pipe = pp.from_iterable(rows).tokenize(pp.examples.tokenizer(), num_threads=num_threads)
    message = r"^tokenize: field 'text' at row 1 of the chunk \(idx=1\) is None; expected a string\."
    # the same exception object in both modes, its traceback reaching into the worker's call
    with pytest.raises(DataError, match=message) as raised:
        _chunks(pipe)
    frames = "".join(traceback.format_tb(raised.value.__traceback__))
    assert "in __call__" in frames and "tokenize.py" in frames


def test_tokenize_saves_and_restores_its_state(hf):
    pipe = pp.from_iterable(_rows(30), chunk_rows=4).tokenize(hf, fields=("s1", "s2"), max_length=16, num_threads=2)
    items = check_node_resume(lambda: pipe.build(consumer=pp.Consumer()), epochs=2)
    assert len(items[0]) == 8 and items[0] == items[1]


def test_tokenize_appends_eos_to_every_row():
    tok = pp.examples.hf_tokenizer()
    tok.eos_token = "[SEP]"
    rows = [{"text": "a b"}, {"text": ""}, {"text": "c"}]
    pipe = pp.from_iterable(rows).tokenize(tok, add_special_tokens=False, append_eos=True)
    (chunk,) = _chunks(pipe)
    want = [tok(r["text"], add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for r in rows]
    assert [chunk.row(i).tolist() for i in range(3)] == want


def test_tokenize_raises_error_when_append_eos_has_no_eos():
    """Issue 30 item 7: the message did not say how to set an EOS (the README's pretrain section does)."""
    message = (
        r"^`append_eos=True` needs a tokenizer with an EOS token, but this one has none; set one of its special tokens "
        r"\['\[PAD\]', '\[UNK\]', '\[CLS\]', '\[SEP\]', '\[MASK\]'\] as EOS: "
        r"AutoTokenizer\.from_pretrained\(path, eos_token='\[SEP\]'\) or tok\.eos_token = '\[SEP\]' \(transformers; "
        r"a tokenizers\.Tokenizer or tokenizer\.json has one when it holds '</s>' or '<\|endoftext\|>' or '<eos>' or "
        r"'<\|end_of_text\|>'\)\.$"
    )
    with pytest.raises(ValueError, match=message):
        pp.from_iterable([{"text": "a"}]).tokenize(pp.examples.tokenizer(), append_eos=True)
    with pytest.raises(ValueError, match=message):
        ChunkTokenizer(_encoder(pp.examples.tokenizer()), fields="text", append_eos=True)
    fixed = pp.examples.hf_tokenizer()
    fixed.eos_token = "[SEP]"  # what the message says to do
    assert _chunks(pp.from_iterable([{"text": "a"}]).tokenize(fixed, append_eos=True))[0].row(0).tolist()[-1] == 3
