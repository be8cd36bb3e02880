"""Crafted packer states, checksums recomputed: every field of the v6 state is checked, refused in one line naming it.

A state edited and resealed passes its CRC, so what refuses it here is the packer's own check of each
leaf (issue 47: an empty piece, or an id of -1, in ``planned``, ``pool`` or ``incoming`` loaded and
reached the model). Each attack of :data:`ATTACKS` edits one field of a state holding pieces in all
three; a search then writes any value at any token of any piece field: refused, or every id and label
that comes out is one the model takes. The same ids and labels coming in as data are refused too,
naming the row (a state the packer saved always loads).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import padpipe as pp
from padpipe.chunks import TokenChunk
from padpipe.pipes.pack import Packer
from padpipe.pipes.piece_state import Pieces
from padpipe.pipes.pieces import Piece, pieces_to_chunk
from padpipe.state import CHECKSUM_KEY, StateMismatchError, checksum, seal
from tests.pipes.test_pack_labels import chunks_node, masked_docs
from tests.test_state_attacks import forged, path_to, refused

VOCAB, SEQ_LEN, PAD = 1000, 12, 0
DOCS = masked_docs([(i * 7) % 13 + 1 for i in range(120)], seed=2)  # ids 1..~800, some longer than SEQ_LEN
PIECE_FIELDS = ("incoming", "pool", "planned")


def make() -> Packer:
    return Packer(chunks_node(DOCS, 16), seq_len=SEQ_LEN, long_docs="split", buffer_size=24, pad_id=PAD,
                  keep=("idx",), vocab_size=VOCAB)  # fmt: skip


@pytest.fixture(scope="module")
def saved() -> dict:
    """The state after 3 batches: pieces waiting in ``incoming`` and ``pool``, planned rows ``[0, 1, 1]``."""
    node = make()
    node.reset(None)
    for _ in range(3):
        next(node)
    state = node.state_dict()
    assert all(TokenChunk.from_state(state[key]).num_rows for key in PIECE_FIELDS)
    assert state["planned_rows"] == [0, 1, 1]
    return state


def resealed(state: dict, **fields: Any) -> dict:
    """``state`` with ``fields`` replaced and its checksum recomputed, as an attacker would."""
    out = seal({**{k: v for k, v in state.items() if k != CHECKSUM_KEY}, **fields})
    assert out[CHECKSUM_KEY] == checksum(out)
    return out


def pieces(saved_chunk: dict) -> list[Piece]:
    return Pieces(("idx",)).load(saved_chunk)


def with_piece(edit: Callable[[list[Piece]], None]) -> Callable[[dict], dict]:
    """An attack on a pieces field: its pieces, edited as pieces, saved again (a well-formed chunk)."""

    def attack(chunk: dict) -> dict:
        found = [Piece(p.ids.copy(), p.labels.copy(), p.values) for p in pieces(chunk)]
        edit(found)
        return pieces_to_chunk(found, ("idx",)).to_state()

    return attack


def with_chunk(**change: Any) -> Callable[[dict], dict]:
    """An attack on a pieces field: its chunk with ``ids``, ``offsets``, ``type_ids`` or ``columns`` changed."""

    def attack(chunk: dict) -> dict:
        old = TokenChunk.from_state(chunk)
        parts = {"ids": old.ids, "offsets": old.offsets, "type_ids": old.type_ids, "columns": dict(old.columns)}
        for key, value in change.items():
            parts[key] = value(old) if callable(value) else value
        return TokenChunk(**parts).to_state()

    return attack


def set_token(field: str, value: int) -> Callable[[list[Piece]], None]:
    def edit(found: list[Piece]) -> None:
        getattr(found[0], field)[1] = value

    return edit


def short_labels(old: TokenChunk) -> dict:
    offsets = np.minimum(old.offsets, len(old.ids) - 1)
    labels = pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(old.ids[:-1].astype(np.int64)))
    return {**old.columns, "labels": labels}


def piece_at(message: str) -> str:
    return rf"must be {message} instead\.$"


PIECE_ATTACKS: dict[str, tuple[Callable[[dict], dict], str]] = {
    "an empty piece": (
        with_piece(lambda f: f.insert(1, Piece(f[0].ids[:0], f[0].labels[:0], (99,)))),
        piece_at(r"pieces of 1 to 12 tokens, but is a piece of 0 tokens at index 1"),
    ),
    "a piece longer than seq_len": (
        with_piece(lambda f: f.__setitem__(0, Piece(np.arange(1, 14, dtype=np.int32), None, (98,)))),
        piece_at(r"pieces of 1 to 12 tokens, but is a piece of 13 tokens at index 0"),
    ),
    "an id of -1": (
        with_piece(set_token("ids", -1)),
        piece_at(r"pieces with ids from 0 to 999, but is id -1 in the piece at index 0"),
    ),
    "an id of the vocabulary's size": (
        with_piece(set_token("ids", VOCAB)),
        piece_at(r"pieces with ids from 0 to 999, but is id 1000 in the piece at index 0"),
    ),
    "a label of -5": (
        with_piece(set_token("labels", -5)),
        piece_at(r"pieces with labels that are ids from 0 to 999 or -100, but is label -5 in the piece at index 0"),
    ),
    "a label past the vocabulary": (
        with_piece(set_token("labels", 2**40)),
        piece_at(
            r"pieces with labels that are ids from 0 to 999 or -100, but is label 1099511627776 in the piece at "
            r"index 0"
        ),  # fmt: skip
    ),
    "labels one short": (
        with_chunk(columns=short_labels),
        piece_at(
            r"pieces with one integer label per token, but is pack: token-level labels at row \d+ of the chunk "
            r"\(idx=\d+\) are \d+ labels for \d+ tokens; expected one label per token\."
        ),  # fmt: skip
    ),
    "token type ids": (
        with_chunk(type_ids=lambda old: np.zeros(len(old.ids), np.int8)),
        piece_at(r"pieces without token type ids, but is pieces with token type ids"),
    ),
    "no kept column": (
        with_chunk(columns=lambda old: {"labels": old.columns["labels"]}),
        piece_at(r"pieces with the kept columns \['idx'\] \(and labels\), but is pieces with \['labels'\]"),
    ),
    "a float kept column": (
        with_chunk(columns=lambda old: {**old.columns, "idx": pa.array([0.5] * old.num_rows)}),
        piece_at(
            r"pieces whose kept columns are integers or strings, but is pack: column 'idx' named in `keep` has "
            r"type double; expected integers or strings \(row ids\)\."
        ),  # fmt: skip
    ),
    "offsets past the ids": (
        with_chunk(ids=lambda old: old.ids[:-1]),
        r": a token chunk's offsets must rise from 0 to its \d+ ids, but are \[.*\]\.\.\. instead$",
    ),
}


@pytest.mark.parametrize("case", list(PIECE_ATTACKS))
@pytest.mark.parametrize("key", PIECE_FIELDS)
def test_pack_refuses_a_crafted_piece_in_one_line_naming_the_field(saved, key, case) -> None:
    attack, pattern = PIECE_ATTACKS[case]
    crafted = resealed(saved, **{key: attack(saved[key])})
    with pytest.raises(StateMismatchError, match=rf"^pack state is invalid: '{key}'.*{pattern}") as caught:
        make().reset(crafted)
    assert "\n" not in str(caught.value) and len(str(caught.value)) < 500


def overfull_rows(state: dict) -> dict:
    """The planned pieces all in row 0: more than seq_len tokens."""
    planned = pieces(state["planned"])
    assert sum(len(p.ids) for p in planned) > SEQ_LEN
    return {"planned_rows": [0] * len(planned)}


def overfull_pool(state: dict) -> dict:
    """More than buffer_size pieces holding a batch's tokens before the last."""
    return {"pool": pieces_to_chunk(pieces(state["pool"]) * 2, ("idx",)).to_state()}


OTHER_ATTACKS: dict[str, tuple[Callable[[dict], dict], str]] = {
    "source": (lambda s: {"source": "x"}, r"^pack state is invalid: 'source' must be a state dict, but is 'x'"),
    "epoch": (lambda s: {"epoch": -1}, r"^pack state is invalid: 'epoch' must be an int >= 0, but is -1 instead\.$"),
    "planned_rows": (
        lambda s: {"planned_rows": [0, 2, 2]},
        r"^pack state is invalid: 'planned_rows' must be one row per planned piece, rising by 0 or 1 from 0, but is "
        r"\[0, 2, 2\] instead\.$",
    ),
    "planned": (
        overfull_rows,
        r"^pack state is invalid: 'planned' must be rows of at most seq_len=12 tokens, but is \[\d+\] instead\.$",
    ),
    "pool": (
        overfull_pool,
        r"^pack state is invalid: 'pool' must be at most buffer_size=24 pieces, or fewer than a batch's tokens "
        r"before the last, but is \d+ pieces of \d+ tokens instead\.$",
    ),
    "exhausted": (lambda s: {"exhausted": 1}, r"^pack state is invalid: 'exhausted' must be a bool, but is 1"),
    "started": (lambda s: {"started": "yes"}, r"^pack state is invalid: 'started' must be a bool, but is 'yes'"),
}


@pytest.mark.parametrize("case", list(OTHER_ATTACKS))
def test_pack_refuses_a_crafted_value_of_each_other_field_in_one_line(saved, case) -> None:
    change, pattern = OTHER_ATTACKS[case]
    with pytest.raises(StateMismatchError, match=pattern):
        make().reset(resealed(saved, **change(saved)))


def test_every_field_of_the_packer_state_is_attacked() -> None:
    """A field added to the state (a version 7) needs its attack here."""
    assert Packer.STATE.version == 6
    attacked = {key for key in PIECE_FIELDS if PIECE_ATTACKS} | set(OTHER_ATTACKS)
    assert attacked == set(Packer.STATE.fields)


def test_pack_loads_the_states_it_saves_at_every_step_with_the_checks_on() -> None:
    node = make()
    node.reset(None)
    for _ in range(2):
        for _ in node:
            make().reset(node.state_dict())
        node.reset(None)


@pytest.mark.slow  # seconds alone
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_pack_resumes_a_state_with_any_value_at_any_token_only_into_ids_and_labels_the_model_takes(saved, data):
    key = data.draw(st.sampled_from(PIECE_FIELDS), label="field")
    found = pieces(saved[key])
    piece = data.draw(st.integers(0, len(found) - 1), label="piece")
    field = data.draw(st.sampled_from(["ids", "labels"]), label="ids or labels")
    at = data.draw(st.integers(0, len(found[piece].ids) - 1), label="token")
    special = [-(2**31), -101, -100, -1, 0, VOCAB - 1, VOCAB, 2**31 - 1]
    low, high = (-(2**31), 2**31 - 1) if field == "ids" else (-(2**63), 2**63 - 1)
    value = data.draw(st.sampled_from(special) | st.integers(low, high), label="value")
    getattr(found[piece], field)[at] = value
    crafted = resealed(saved, **{key: pieces_to_chunk(found, ("idx",)).to_state()})
    node = make()
    try:
        node.reset(crafted)
    except StateMismatchError as exc:
        assert re.match(rf"^pack state is invalid: '{key}' must be pieces with ", str(exc)), str(exc)
        return
    for batch in node:
        ids, labels = batch["input_ids"], batch["labels"]
        assert 0 <= int(ids.min()) and int(ids.max()) < VOCAB
        assert bool(((labels >= 0) & (labels < VOCAB) | (labels == -100)).all())


def test_pack_refuses_ids_and_labels_no_model_takes_as_data_naming_the_row() -> None:
    """What a crafted state is refused for is refused as data too, so a state the packer saved always loads."""
    rows = [
        {"input_ids": [1, 2, 3], "labels": [-100, 2, 3], "idx": 7},
        {"input_ids": [4, 5], "labels": [-5, 5], "idx": 8},
    ]
    with pytest.raises(
        pp.DataError,
        match=r"^pack: row 1 of the chunk \(idx=8\) has label -5; expected labels that are ids >= 0 or -100\.$",
    ):
        list(pp.from_iterable(rows).tokens(pad_id=PAD).pack(8).loader())
    ok = list(pp.from_iterable(rows).tokens(pad_id=PAD).pack(8, label_pad_id=-5).loader())  # the loss's own ignore
    assert ok[0]["labels"].tolist() == [[-5, 2, 3, -5, 5, -5, -5, -5]]
    node = Packer(chunks_node(masked_docs([3, 4])), seq_len=8, pad_id=PAD, vocab_size=5)
    with pytest.raises(
        pp.DataError, match=r"^pack: row 1 of the chunk \(idx=1\) has id 5; expected ids from 0 to 4\.$"
    ):
        node.reset(None)
        list(node)


@pytest.fixture(scope="module")
def tokenized() -> pp.Pipeline:
    rows = [{"text": "hello world " * (1 + i % 9), "id": i} for i in range(80)]
    return pp.from_iterable(rows, chunk_rows=8).tokenize(pp.examples.tokenizer()).pack(16, batch_size=2, buffer_size=8)


def test_pack_refuses_an_id_past_the_tokenizers_vocabulary_in_a_loader_state(tokenized) -> None:
    """The recipe gives the packer its tokenizer's vocabulary, so an id the embedding would not hold is refused."""
    vocab = pp.examples.tokenizer().get_vocab_size(True)
    loader = tokenized.loader()
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    at = path_to(state, lambda d: "planned_rows" in d)

    def edit(packer: dict) -> None:
        found = Pieces().load(packer["pool"])
        found[0].ids[0] = vocab
        packer["pool"] = pieces_to_chunk(found).to_state()

    refused(
        tokenized,
        forged(state, at, edit),
        rf"^pack state is invalid: 'pool' must be pieces with ids from 0 to {vocab - 1}, but is id {vocab} in the "
        r"piece at index 0 instead\.$",
    )


def test_pack_knows_the_vocabulary_of_the_recipes_tokenizer_or_checks_ids_non_negative(tokenized) -> None:
    chats = pp.from_iterable(pp.examples.conversations(4)).chat(pp.examples.chat_tokenizer()).pack(64)
    tokens = pp.from_iterable([{"input_ids": [1, 2]}]).tokens(pad_id=PAD).pack(8)
    vocab = {pipe.stages[-1].options["vocab_size"] for pipe in (tokenized, chats, tokens)}
    chat_vocab = pp.examples.chat_tokenizer().backend_tokenizer.get_vocab_size(True)
    assert vocab == {pp.examples.tokenizer().get_vocab_size(True), chat_vocab, None}


def test_pack_takes_every_id_of_a_vocabulary_whose_ids_leave_gaps() -> None:
    """A vocabulary with holes (CamemBERT lacks id 3) counts fewer entries than its highest id: the bound the packer
    checks ids against is one past the highest id, so valid ids are never refused (found by review)."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    tok = Tokenizer(WordLevel({"a": 0, "b": 1, "[UNK]": 2, "z": 9}, unk_token="[UNK]"))
    tok.pre_tokenizer = Whitespace()
    pipe = pp.from_iterable([{"text": "a z b"}, {"text": "z z"}]).tokenize(tok).pack(8, pad_id=2)
    assert sorted(t for b in pipe.loader() for t in b["input_ids"].flatten().tolist() if t != 2) == [0, 1, 9, 9, 9]
    assert pipe.stages[-1].options["vocab_size"] == 10
