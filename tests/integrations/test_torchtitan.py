"""PadpipeDataLoader in one process: torchtitan 0.3.0's batches, the end of the data, and a checkpoint round trip.

Under ``torchrun`` on several DP degrees: test_torchtitan_torchrun.py; the contacts with torchtitan's
API: test_torchtitan_api.py.
"""

from __future__ import annotations

import collections
import dataclasses
import io
import pathlib
import re
import tempfile

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import torch.nn as nn
from tokenizers import Tokenizer

import padpipe as pp
from padpipe.state import Child, ListOf, StateMismatchError, StateSchema

INSTALL = "needs torchtitan 0.3.0: pip install 'padpipe[torchtitan]' && pip install --no-deps torchtitan==0.3.0"
dataloader = pytest.importorskip("torchtitan.components.dataloader", reason=INSTALL)
from torchtitan.components.checkpoint import CheckpointManager  # noqa: E402
from torchtitan.components.optimizer import LRSchedulersContainer, default_adamw  # noqa: E402
from torchtitan.components.tokenizer import HuggingFaceTokenizer  # noqa: E402

from padpipe.checkpoints import CHECKPOINT, PART_KEYS  # noqa: E402
from padpipe.integrations.titan_state import KEY, STATE, unpacked  # noqa: E402
from padpipe.integrations.torchtitan import PadpipeDataLoader, text_tokenizer  # noqa: E402

TITAN = HuggingFaceTokenizer(tokenizer_path=pp.examples.TOKENIZER_DIR)
WORDS = "the cat sat on a mat and then ran far away".split()
TEXTS = [" ".join(WORDS[(i + j) % len(WORDS)] for j in range(1 + (i * 7) % 30)) for i in range(60)]


def build(config: PadpipeDataLoader.Config, *, seq_len: int = 32, rows: int = 2, dp: int = 1, rank: int = 0):
    """As torchtitan 0.3.0's trainer builds its loader."""
    return config.build(
        dp_world_size=dp,
        dp_rank=rank,
        tokenizer=TITAN,
        seq_len=seq_len,
        local_batch_size=rows,
        snapshot_every_n_steps=1,
    )


def packed(tokenizer, seq_len: int, batch_size: int) -> pp.Pipeline:
    rows = pp.from_iterable([{"text": t} for t in TEXTS])
    return rows.tokenize(pp.examples.tokenizer(), truncation=False).pack(seq_len, batch_size=batch_size, buffer_size=8)


def test_it_is_torchtitans_base_dataloader_built_by_its_config():
    loader = build(PadpipeDataLoader.Config(pipeline=packed))
    assert isinstance(loader, dataloader.BaseDataLoader)
    (inputs, labels), *_ = iter(loader)
    assert sorted(inputs) == ["input", "positions"]
    assert [t.shape for t in (inputs["input"], inputs["positions"], labels)] == [torch.Size([2, 32])] * 3
    assert {t.dtype for t in (inputs["input"], inputs["positions"], labels)} == {torch.int64}


def test_labels_are_each_documents_next_token_and_positions_restart():
    got = list(build(PadpipeDataLoader.Config(pipeline=packed)))
    want = list(packed(None, 32, 2).loader())
    assert len(got) == len(want)
    for (inputs, labels), batch in zip(got, want):
        rows = len(batch["input_ids"])
        assert torch.equal(inputs["input"][:rows], batch["input_ids"])
        assert torch.equal(inputs["positions"][:rows], batch["position_ids"])
        assert torch.equal(labels[:rows, :-1], batch["labels"][:, 1:]) and (labels[:, -1] == -100).all()
        ends = torch.cat([inputs["positions"][:, 1:] == 0, torch.ones(len(labels), 1, dtype=torch.bool)], 1)
        assert (labels[ends] == -100).all(), "a document's last token predicts nothing"
        inside = labels[:, :-1] != -100
        assert torch.equal(labels[:, :-1][inside], inputs["input"][:, 1:][inside])


def test_every_prediction_of_a_cut_document_is_trained_once_from_the_token_before_it():
    """Rows of 12 cut most documents: torchtitan's (input, label) pairs are each document's (token, next token) once,
    ``[SEP]`` included; the continuation's first input is the token before the cut, so no prediction is lost."""
    pairs: collections.Counter = collections.Counter()
    for inputs, labels in build(PadpipeDataLoader.Config(pipeline=packed), seq_len=12):
        taken = labels != -100
        pairs.update(zip(inputs["input"][taken].tolist(), labels[taken].tolist()))
    corpus = [e.ids for e in pp.examples.tokenizer().encode_batch(TEXTS)]
    assert sum(len(ids) > 12 for ids in corpus) > 20
    assert pairs == collections.Counter(pair for ids in corpus for pair in zip(ids, ids[1:]))


def test_a_row_cut_by_equal_steps_reaches_torchtitan_as_rows_of_seq_len_with_its_predictions():
    """A piece of a cut row is as long as its tokens; torchtitan gets it as [rows, seq_len], a padding run after it
    that trains nothing (a launch on 3 DP ranks met [2, 23] before)."""
    from padpipe.integrations.titan_batches import titan_batch
    from padpipe.runtime.row_pieces import cut_row

    (row, *_) = packed(None, 32, 1).loader()
    pieces = cut_row(row)
    assert pieces is not None and all(p["input_ids"].shape[1] < 32 for p in pieces)
    whole: collections.Counter = collections.Counter()
    for piece in pieces:
        (inputs, labels), filled = titan_batch(piece, rows=2, seq_len=32, pad_id=0)
        assert [t.shape for t in (inputs["input"], inputs["positions"], labels)] == [torch.Size([2, 32])] * 3
        n = piece["input_ids"].shape[1]
        assert filled == 1 and (inputs["input"][0, n:] == 0).all() and (labels[0, n - 1 :] == -100).all()
        assert inputs["positions"][0, n:].tolist() == list(range(32 - n))
        whole.update((i, t) for i, t in zip(inputs["input"][0].tolist(), labels[0].tolist()) if t != -100)
    ids, labels = row["input_ids"][0].tolist(), row["labels"][0].tolist()
    assert whole == collections.Counter((ids[j - 1], labels[j]) for j in range(1, 32) if labels[j] != -100)


def test_a_piece_that_starts_inside_a_document_starts_a_document_torchtitan_finds():
    """torchtitan 0.3.0's flex and varlen masks start a document where positions are 0: the second piece of a row that
    equal steps cut inside its one document must start at 0 too (from 15, its tokens were in no document: varlen left
    them out, flex let them attend nothing, or indexed -1), its positions still rising by one (RoPE: the same logits)."""
    from padpipe.integrations.titan_batches import titan_batch
    from padpipe.runtime.row_pieces import cut_row

    (row, *_) = pp.from_iterable([{"input_ids": list(range(1, 101))}]).tokens(pad_id=0).pack(32).loader()
    first, second = cut_row(row)
    assert second["position_ids"][0, 0] > 0  # equal steps keeps the document's own positions (HF)
    for piece in (first, second):
        (inputs, labels), _ = titan_batch(piece, rows=2, seq_len=32, pad_id=0)
        n, positions = piece["input_ids"].shape[1], inputs["positions"]
        assert positions[0].tolist() == list(range(n)) + list(range(32 - n))
        assert torch.equal(labels[0, : n - 1], piece["labels"][0, 1:])


def test_masked_sft_tokens_and_padding_train_nothing():
    def masked(tokenizer, seq_len, batch_size):
        rows = [{"input_ids": [5, 6, 7, 8], "labels": [-100, -100, 7, 8]}]  # a prompt (5 6) and its answer (7 8)
        return pp.from_iterable(rows).tokens(pad_id=0).pack(seq_len, batch_size=batch_size)

    (inputs, labels), *rest = build(PadpipeDataLoader.Config(pipeline=masked), seq_len=6, rows=1)
    assert inputs["input"].tolist() == [[5, 6, 7, 8, 0, 0]] and inputs["positions"].tolist() == [[0, 1, 2, 3, 0, 1]]
    assert labels.tolist() == [[-100, 7, 8, -100, -100, -100]] and rest == []


def test_the_data_ends_at_a_multiple_of_the_batches_per_optimizer_step():
    config = PadpipeDataLoader.Config(pipeline=packed, epochs=2, global_batch_size=2 * 5)  # 5 batches a step
    loader = build(config)
    batches = list(loader)
    real = 2 * len(list(packed(None, 32, 2).loader()))
    assert real % 5 and len(batches) == real + (-real) % 5 and len(batches) % 5 == 0
    assert loader.counts["end_batches"] == (-real) % 5
    for inputs, labels in batches[real:]:
        assert (labels == -100).all() and (inputs["input"] == 0).all()
    assert loader.counts["filled_rows"] == 2 * sum(2 - len(b["input_ids"]) for b in packed(None, 32, 2).loader())
    assert list(loader) == [], "the data has ended: iterating again yields nothing"


def checkpoints(loader, folder) -> CheckpointManager:
    """torchtitan's CheckpointManager of a tiny model and ``loader``, saving under ``folder``."""
    model = nn.Linear(2, 2)
    optimizers = default_adamw(lr=1e-3).build(model_parts=[model])
    schedulers = LRSchedulersContainer.Config(warmup_steps=1).build(optimizers=optimizers, training_steps=9)
    return CheckpointManager.Config(enable=True, interval=1, keep_latest_k=0).build(
        dataloader=loader,
        model_parts=[model],
        optimizers=optimizers,
        lr_schedulers=schedulers,
        states={},
        sd_adapter=None,
        base_folder=str(folder),
    )


def test_a_torchtitan_checkpoint_resumes_the_loader_exactly(tmp_path):
    def run(folder):
        loader = build(PadpipeDataLoader.Config(pipeline=packed, epochs=2))
        return loader, checkpoints(loader, folder)

    loader, manager = run(tmp_path)
    it = iter(loader)
    before = [next(it) for _ in range(5)]
    manager.save(5)
    rest = list(it)
    again, manager = run(tmp_path)
    assert manager.load()
    resumed = list(again)
    assert len(before) + len(resumed) == len(list(build(PadpipeDataLoader.Config(pipeline=packed, epochs=2))))
    assert len(resumed) == len(rest)
    assert all(torch.equal(a[0]["input"], b[0]["input"]) and torch.equal(a[1], b[1]) for a, b in zip(rest, resumed))


def test_simulated_dp_ranks_without_torch_distributed_share_the_corpus(tmp_path):
    path = tmp_path / "docs.parquet"
    pq.write_table(pa.table({"text": TEXTS}), path, row_group_size=10)
    config = PadpipeDataLoader.Config(dataset_path=str(path), shuffle_buffer=16)
    tokens, trained = collections.Counter(), collections.Counter()
    for rank in range(2):
        for inputs, labels in build(config, dp=2, rank=rank):
            tokens.update(t for t in inputs["input"].flatten().tolist() if t != 0)
            trained.update(labels[labels != -100].tolist())
    docs = [e.ids for e in pp.examples.tokenizer().encode_batch(TEXTS)]
    cuts = [doc[i] for doc in docs for i in range(31, len(doc) - 1, 31)]  # rows of 32: each cut's token again
    assert cuts and tokens == collections.Counter(t for doc in docs for t in doc) + collections.Counter(cuts)
    assert trained == collections.Counter(t for doc in docs for t in doc[1:])


def test_bad_configs_and_pipelines_are_refused():
    with pytest.raises(ValueError, match=r"^PadpipeDataLoader.Config needs exactly one of `dataset_path`"):
        PadpipeDataLoader.Config()
    with pytest.raises(
        ValueError, match=r"^PadpipeDataLoader needs a padpipe pipeline ending in \.pack\(32, batch_size=2\)"
    ):
        build(PadpipeDataLoader.Config(pipeline=lambda **_: packed(None, 16, 2)))
    with pytest.raises(ValueError, match=r"layout='rows'\), but found .*, layout='flat'\.$"):
        rows = pp.from_iterable([{"text": t} for t in TEXTS]).tokenize(pp.examples.tokenizer(), truncation=False)
        build(PadpipeDataLoader.Config(pipeline=lambda **_: rows.pack(32, batch_size=2, layout="flat")))
    with pytest.raises(ValueError, match=r"found no \.pack\(\) last\.$"):
        build(
            PadpipeDataLoader.Config(
                pipeline=lambda **_: pp.from_iterable([{"text": "a"}]).tokenize(TITAN.tokenizer).batch(2).pad()
            )
        )
    with pytest.raises(
        ValueError,
        match=r"^PadpipeDataLoader: `global_batch_size` must be a multiple of local_batch_size x dp_world_size = 2 x 1, but is 5",
    ):
        build(PadpipeDataLoader.Config(pipeline=packed, global_batch_size=5))


def test_a_state_it_did_not_write_is_refused():
    loader = build(PadpipeDataLoader.Config(pipeline=packed))
    with pytest.raises(StateMismatchError, match=r"^PadpipeDataLoader state must be a dict with 'padpipe': bytes"):
        loader.load_state_dict({"dp_rank_0": b"", "world_size": 1})  # torchtitan's own loader's state
    with pytest.raises(StateMismatchError, match=r"^PadpipeDataLoader state 'padpipe' could not be read"):
        loader.load_state_dict({"padpipe": b"not a state"})
    with tempfile.TemporaryFile() as f:
        torch.save({"version": 1}, f)
        f.seek(0)
        with pytest.raises(StateMismatchError, match=r"^PadpipeDataLoader state"):
            loader.load_state_dict({"padpipe": f.read()})


def other_tokenizer() -> Tokenizer:
    tokenizer = Tokenizer.from_str(pp.examples.tokenizer().to_str())
    tokenizer.add_tokens(["<another>"])
    return tokenizer


@pytest.mark.parametrize(
    ("other", "setting"),
    [
        (dict(seq_len=16), r"'seq_len' found 32 instead of 16\.$"),
        (dict(texts=TEXTS[::-1]), r"'data' found 'from_iterable\(iterable=60 rows sha1=\w+\)' instead of "),
        (dict(tokenizer=other_tokenizer()), r"'tokenizer' found 'vocab=8000 sha1=\w+' instead of 'vocab=8001 "),
    ],
    ids=["seq_len", "dataset", "tokenizer"],
)
def test_a_checkpoint_of_another_dataset_tokenizer_or_seq_len_is_refused_when_torchtitan_loads_it(
    tmp_path, other, setting
):
    def pipeline(texts, tokenizer):
        def make(seq_len, batch_size, **_):  # torchtitan's tokenizer left unused
            rows = pp.from_iterable([{"text": t} for t in texts]).tokenize(tokenizer, truncation=False)
            return rows.pack(seq_len, batch_size=batch_size)

        return PadpipeDataLoader.Config(pipeline=make)

    saved = build(pipeline(TEXTS, pp.examples.tokenizer()))
    next(iter(saved))
    checkpoints(saved, tmp_path).save(1)
    seq_len = other.get("seq_len", 32)
    loader = build(
        pipeline(other.get("texts", TEXTS), other.get("tokenizer", pp.examples.tokenizer())), seq_len=seq_len
    )
    manager = checkpoints(loader, tmp_path)
    with pytest.raises(
        StateMismatchError, match=r"^PadpipeDataLoader state doesn't match this pipeline: setting " + setting
    ):
        manager.load()  # refused here, before a model step: not at the first batch


def test_a_checkpoint_of_another_dataset_path_is_refused_when_loaded(tmp_path):
    for name in ("a", "b"):
        pq.write_table(pa.table({"text": TEXTS, "body": TEXTS}), tmp_path / f"{name}.parquet")
    config = PadpipeDataLoader.Config(dataset_path=str(tmp_path / "a.parquet"))
    saved = build(config)
    next(iter(saved))
    state = saved.state_dict()
    again = build(config)
    again.load_state_dict(state)
    assert len(list(again)) == len(list(build(config))) - 1  # the same data resumes
    other = build(PadpipeDataLoader.Config(dataset_path=str(tmp_path / "b.parquet")))
    with pytest.raises(StateMismatchError, match=r"^PadpipeDataLoader state .* setting 'data' found .*a\.parquet"):
        other.load_state_dict(state)
    text = build(PadpipeDataLoader.Config(dataset_path=str(tmp_path / "a.parquet"), text_field="body"))
    with pytest.raises(StateMismatchError, match=r"setting 'data' found .*\['text'\].* instead of .*\['body'\]"):
        text.load_state_dict(state)


def test_its_state_is_loader_checkpoint_plus_torchtitans_counts():
    loader = build(PadpipeDataLoader.Config(pipeline=packed))
    next(iter(loader))
    saved = torch.load(io.BytesIO(loader.state_dict()[KEY]), weights_only=True)
    assert saved["version"] == STATE.version and saved["settings"] == loader.recipe
    assert set(saved) == {"version", "settings", "checksum", "checkpoint", "yielded", "batches_per_step", "epochs"}
    checkpoint, own = saved["checkpoint"], loader.loader.checkpoint()
    assert checkpoint["version"] == own["version"] == CHECKPOINT.version and set(checkpoint) == set(own)
    assert [set(one) for one in checkpoint["ranks"]] == [set(PART_KEYS)]
    assert checkpoint["ranks"][0]["loader"]["checksum"] == own["ranks"][0]["loader"]["checksum"]
    assert unpacked(loader.state_dict()).yielded == 1


def test_a_state_of_an_earlier_version_is_refused_by_its_version():
    """padpipe before ``loader.checkpoint()`` saved every DP rank's entry apart (format 1): not read, named."""
    old = StateSchema("PadpipeDataLoader", 1, ranks=ListOf(Child())).make({}, ranks=[])
    buffer = io.BytesIO()
    torch.save(old, buffer)
    with pytest.raises(
        StateMismatchError,
        match=r"^PadpipeDataLoader state doesn't match this pipeline: version found 1 instead of 2\.$",
    ):
        build(PadpipeDataLoader.Config(pipeline=packed)).load_state_dict({KEY: buffer.getvalue()})


def test_every_config_field_is_in_the_docs():
    text = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "torchtitan.md").read_text()
    rows = set(re.findall(r"^\| `(\w+)` \|", text, flags=re.M))
    assert rows == {f.name for f in dataclasses.fields(PadpipeDataLoader.Config)}


def test_ids_equal_torchtitans_but_where_the_tokenizer_json_truncates(tmp_path):
    """torchtitan's encode cuts a document its tokenizer.json truncates (128 ids); padpipe yields it whole."""
    tokenizer = Tokenizer.from_file(str(pathlib.Path(pp.examples.TOKENIZER_DIR) / "tokenizer.json"))
    tokenizer.enable_truncation(128)
    for path in pathlib.Path(pp.examples.TOKENIZER_DIR).iterdir():
        (tmp_path / path.name).write_bytes(path.read_bytes())
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    titan = HuggingFaceTokenizer(tokenizer_path=str(tmp_path))
    short, long = "the cat sat", " ".join(["word"] * 400)
    config = PadpipeDataLoader.Config(
        pipeline=lambda tokenizer, seq_len, batch_size: (
            pp.from_iterable([{"text": short}, {"text": long}])
            .tokenize(text_tokenizer(tokenizer), truncation=False)
            .pack(seq_len, batch_size=batch_size, buffer_size=1)
        )
    )
    loader = config.build(dp_world_size=1, dp_rank=0, tokenizer=titan, seq_len=512, local_batch_size=2)
    (inputs, _), *_ = loader
    tokens = int((inputs["input"] != loader.pad_id).sum())  # both documents, in one batch of 2 x 512
    assert titan.encode(short, add_bos=True, add_eos=True) == text_tokenizer(titan).encode(short).ids
    assert len(titan.encode(long, add_bos=True, add_eos=True)) == 128
    assert tokens == len(titan.encode(short, add_bos=True, add_eos=True)) + 402  # whole: 400 words, BOS, EOS
