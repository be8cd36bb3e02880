"""The preference stage (padpipe/pipes/preference.py): TRL's formats read, each member's ids the template's rendering
of ``prompt + completion`` and its completion the tokens after the answer's header to the end, the pair's prompt cut
alike from its start, skips counted, errors naming the row, and through ``.pad()``/``.pack()`` with exact resume."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import torch

import padpipe as pp
from padpipe.errors import DataError
from padpipe.state import StateMismatchError
from tests import chat_fixtures as fx
from tests.contract import check_loader_resume

transformers = pytest.importorskip("transformers")

HEADER = "<|im_start|>assistant\n"


def pairs(n: int = 30, seed: int = 0, *, system: float = 0.3) -> list[dict[str, Any]]:
    """Pairs made of real multi-turn conversations: the last answer chosen, another's rejected."""
    chats = fx.conversations(n + 1, seed=seed, system=system)
    return [
        {"prompt": c[:-1], "chosen": c[-1:], "rejected": [{"role": "assistant", "content": d[-1]["content"] + " No."}],
         "id": i}
        for i, (c, d) in enumerate(zip(chats, chats[1:]))
    ]  # fmt: skip


def members(batch: dict[str, Any]) -> dict[tuple[int, str], tuple[list[int], list[int]]]:
    """A padded batch's members by ``(id, "chosen" | "rejected")``: ids and completion mask, padding left out."""
    out, rows = {}, len(batch["chosen"])
    for i in range(rows):
        real = batch["attention_mask"][i].bool()
        key = (int(batch["id"][i]), "chosen" if bool(batch["chosen"][i]) else "rejected")
        out[key] = (batch["input_ids"][i][real].tolist(), batch["completion_mask"][i][real].tolist())
    return out


def padded(pipe: pp.Pipeline, n: int = 1000) -> dict[tuple[int, str], tuple[list[int], list[int]]]:
    out: dict[tuple[int, str], tuple[list[int], list[int]]] = {}
    for batch in pipe.batch(n).pad().loader():
        out.update(members(batch))
    return out


def reference(tok: Any, prompt: list[dict], completion: list[dict]) -> tuple[list[int], list[int]]:
    """The template's ids of ``prompt + completion``; the completion: every token after the last answer header."""
    text = tok.apply_chat_template(prompt + completion, tokenize=False)
    start = text.rindex(HEADER) + len(HEADER)
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    return enc["input_ids"], [int(a >= start) for a, _ in enc["offset_mapping"]]


def test_preference_works_on_conversations():
    tok, rows = fx.tokenizer(), pairs()
    got = padded(pp.from_iterable(rows).preference(tok))
    assert len(got) == 2 * len(rows)
    for row in rows:
        for member in ("chosen", "rejected"):
            assert got[row["id"], member] == reference(tok, row["prompt"], row[member])


def test_preference_reads_plain_text_as_trl_does():
    tok = fx.tokenizer()
    rows = [{"prompt": f"Question {i}: what is {i}+{i}?", "chosen": f" It is {2 * i}.", "rejected": " I do not know.",
             "id": i} for i in range(12)]  # fmt: skip
    got = padded(pp.from_iterable(rows).preference(tok))
    for row in rows:
        for member in ("chosen", "rejected"):
            ids = tok(row["prompt"] + row[member] + tok.eos_token)["input_ids"]
            prompt = tok(row["prompt"])["input_ids"]
            assert got[row["id"], member] == (ids, [0] * len(prompt) + [1] * (len(ids) - len(prompt)))


@pytest.mark.parametrize("kind", ["conversations", "text"])
def test_preference_splits_an_implicit_prompt_as_trls_extract_prompt(kind):
    extract_prompt = pytest.importorskip("trl.data_utils").extract_prompt
    tok, explicit = fx.tokenizer(), pairs(12)
    if kind == "conversations":
        implicit = [{"chosen": r["prompt"] + r["chosen"], "rejected": r["prompt"] + r["rejected"], "id": r["id"]}
                    for r in explicit]  # fmt: skip
    else:
        implicit = [{"chosen": f"Say {i}: yes {i}", "rejected": f"Say {i}: no", "id": i} for i in range(12)]
    got = padded(pp.from_iterable(implicit).preference(tok))
    split = [{**extract_prompt({"chosen": r["chosen"], "rejected": r["rejected"]}), "id": r["id"]} for r in implicit]
    assert got == padded(pp.from_iterable(split).preference(tok))
    if kind == "conversations":
        assert got == padded(pp.from_iterable(explicit).preference(tok))


def test_preference_reads_unpaired_rows_with_their_label():
    tok = fx.tokenizer()
    rows = [{"prompt": r["prompt"], "completion": r["chosen"], "label": r["id"] % 2 == 0, "id": r["id"]}
            for r in pairs(10)]  # fmt: skip
    pipe = pp.from_iterable(rows).preference(tok, unpaired=True)
    batch = next(iter(pipe.batch(10).pad().loader()))
    assert batch["label"].tolist() == [int(r["label"]) for r in rows]
    for i, row in enumerate(rows):
        ids, mask = reference(tok, row["prompt"], row["completion"])
        real = batch["attention_mask"][i].bool()
        assert batch["input_ids"][i][real].tolist() == ids
        assert batch["labels"][i][real].tolist() == [t if m else -100 for t, m in zip(ids, mask)]
    packed = next(iter(pipe.pack(4096, keep=("label", "id")).loader()))
    assert sorted(zip(packed["id"][0], packed["label"][0])) == [(r["id"], int(r["label"])) for r in rows]
    with pytest.raises(DataError, match=r"pass unpaired=True"):
        next(iter(pp.from_iterable(rows).preference(tok).batch(2).pad().loader()))
    with pytest.raises(DataError, match=r"pass unpaired=False"):
        next(iter(pp.from_iterable(pairs(2)).preference(tok, unpaired=True).batch(2).pad().loader()))
    unlabelled = [{k: v for k, v in r.items() if k != "label"} for r in rows]
    with pytest.raises(DataError, match=r"^preference: the data has no column 'label' \(columns: "):
        next(iter(pp.from_iterable(unlabelled).preference(tok, unpaired=True).batch(2).pad().loader()))


def test_preference_cuts_the_prompt_start_alike_in_both_members_and_skips_what_cannot_fit():
    tok, rows = fx.tokenizer(), pairs(40)
    whole = padded(pp.from_iterable(rows).preference(tok))
    longest = {r["id"]: max(len(whole[r["id"], m][0]) for m in ("chosen", "rejected")) for r in rows}
    completion = {r["id"]: max(sum(whole[r["id"], m][1]) for m in ("chosen", "rejected")) for r in rows}
    limit = sorted(completion.values())[-4]  # the pairs with the longest completions cannot fit
    pipe = pp.from_iterable(rows).preference(tok, max_length=limit)
    loader = pipe.batch(100).pad().loader()
    got = {}
    for batch in loader:
        got.update(members(batch))
    stats = loader.stats()
    kept = {i for i, _ in got}
    for row in rows:
        i = row["id"]
        cut = max(longest[i] - limit, 0)
        prompts = [whole[i, m][1].index(1) for m in ("chosen", "rejected")]
        if cut and cut >= min(prompts):
            assert i not in kept  # its completions do not fit with a token of prompt before them
            continue
        for member in ("chosen", "rejected"):
            ids, mask = whole[i, member]
            assert got[i, member] == (ids[cut:], mask[cut:])  # the same tokens cut from both members' start
            assert len(got[i, member][0]) <= limit and sum(got[i, member][1]) == sum(mask)
    assert 0 < len(rows) - len(kept) <= 4 and stats.skipped == {"preference.too_long": len(rows) - len(kept)}
    cut = sum(1 for r in rows if r["id"] in kept and longest[r["id"]] > limit)
    assert 0 < cut and stats.counters["preference.prompt_cut"] == cut
    assert stats.counters["preference.rows"] == len(kept)


def test_preference_counts_what_it_drops_and_names_the_row_it_refuses():
    tok, rows = fx.tokenizer(), pairs(6)
    rows[2]["rejected"] = [{"role": "assistant", "content": "a"}, {"role": "assistant", "content": "b"}]
    rows[4]["chosen"] = [{"role": "user", "content": "not an answer"}]
    with pytest.raises(DataError, match=r"preference: row 2 of the chunk \(id=2\): a completion is .*expected one"):
        list(pp.from_iterable(rows).preference(tok).batch(6).pad().loader())
    loader = pp.from_iterable(rows).preference(tok, chat_options={"on_error": "skip"}).batch(6).pad().loader()
    ids = {int(i) for b in loader for i in b["id"]}
    assert ids == {0, 1, 3, 5} and loader.stats().skipped == {"preference.bad_messages": 2}


def test_preference_names_the_member_a_template_refuses():
    tok, rows = fx.tokenizer(), pairs(3, system=0.0)
    template = fx.CHATML.replace(
        "{% for message in messages %}",
        "{% for message in messages %}{% if 'boom' in message['content'] %}{{ raise_exception('no boom') }}{% endif %}",
    )
    rows[1]["rejected"][0]["content"] = "boom"
    with pytest.raises(DataError, match=r"preference: the rejected conversation of row 1 of the chunk .*no boom"):
        list(pp.from_iterable(rows).preference(tok, chat_template=template).batch(3).pad().loader())
    loader = (pp.from_iterable(rows).preference(tok, chat_template=template, chat_options={"on_error": "skip"})
              .batch(3).pad().loader())  # fmt: skip
    assert [int(i) for b in loader for i in b["id"]] == [0, 2, 0, 2]
    assert loader.stats().skipped == {"preference.template_error": 1}


def test_preference_keeps_tools_and_template_arguments():
    tok = fx.tokenizer(fx.QWEN25)
    tools = [{"type": "function", "function": {"name": "weather", "parameters": {"city": {"type": "string"}}}}]
    rows = [{**r, "tools": json.dumps(tools)} for r in pairs(6)]
    got = padded(pp.from_iterable(rows).preference(tok))
    for row in rows:
        ids = tok.apply_chat_template(row["prompt"] + row["chosen"], tools=tools, tokenize=True, return_dict=True)
        assert got[row["id"], "chosen"][0] == ids["input_ids"]


def test_preference_refuses_bad_options_at_once():
    tok = fx.tokenizer()
    pipe = pp.from_iterable(pairs(2))
    with pytest.raises(ValueError, match=re.escape("`chat_options` may set")):
        pipe.preference(tok, chat_options={"train_on": "all"})
    with pytest.raises(ValueError, match="`max_length` must be an int of at least 2"):
        pipe.preference(tok, max_length=1)
    pairs_pipe = pipe.preference(tok, max_length=64)
    with pytest.raises(ValueError, match=r"bucket\(max_tokens=\) counts a row's tokens"):
        pairs_pipe.bucket(max_tokens=1024)
    with pytest.raises(ValueError, match="pack\\(\\) keeps a preference pair whole"):
        pairs_pipe.pack(128, long_docs="split")
    with pytest.raises(ValueError, match="pack\\(\\) keeps a preference pair whole"):
        pairs_pipe.pack(128, keep=("chosen_tokens",))
    with pytest.raises(ValueError, match="takes `label_pad_id` -100"):
        pairs_pipe.batch(2).pad(label_pad_id=0)


def test_preference_pads_in_trls_layout_with_the_other_columns_once_per_member():
    tok, rows = fx.tokenizer(), pairs(5)
    batch = next(iter(pp.from_iterable(rows).preference(tok).batch(5).pad().loader()))
    assert sorted(batch) == ["attention_mask", "chosen", "completion_mask", "id", "input_ids"]
    assert batch["chosen"].tolist() == [True] * 5 + [False] * 5
    assert batch["id"].tolist() == [0, 1, 2, 3, 4] * 2
    assert batch["input_ids"].shape == batch["completion_mask"].shape == (10, int(batch["attention_mask"].sum(1).max()))


def test_preference_packs_each_member_as_its_own_sequence():
    tok, rows = fx.tokenizer(), pairs(24)
    whole = padded(pp.from_iterable(rows).preference(tok))
    pipe = pp.from_iterable(rows).preference(tok).pack(1024, batch_size=2, keep=("id",), block_mask=True)
    seen = []
    for batch in pipe.loader():
        bounds = batch["cu_seq_lens_q"].tolist()
        flat = {k: batch[k].reshape(-1) for k in ("input_ids", "position_ids", "seq_idx", "completion_mask", "chosen")}
        segments = list(zip(bounds, bounds[1:]))
        assert batch["max_length_q"] == max(b - a for a, b in segments)
        for k, (a, b) in enumerate(segments):
            assert flat["position_ids"][a:b].tolist() == list(range(b - a))
            assert set(flat["seq_idx"][a:b].tolist()) == {k}
        starts = [a for a, _ in segments]
        ids = [i for row in batch["id"] for i in row]
        chosen = [a for a in starts if bool(flat["chosen"][a])]
        assert len(chosen) == len(ids)
        for pair, a in zip(ids, chosen):
            b = bounds[bounds.index(a) + 1]
            c = bounds[bounds.index(b) + 1]
            assert (flat["input_ids"][a:b].tolist(), flat["completion_mask"][a:b].tolist()) == whole[pair, "chosen"]
            assert (flat["input_ids"][b:c].tolist(), flat["completion_mask"][b:c].tolist()) == whole[pair, "rejected"]
            assert not bool(flat["chosen"][b:c].any())
            seen.append(pair)
        mask = batch["attention_mask"]
        for r in range(mask.shape[0]):
            row = [(a - r * 1024, b - r * 1024) for a, b in segments if r * 1024 <= a < (r + 1) * 1024]
            for a, b in row:  # a member sees itself only, causally
                assert torch.equal(mask[r, 0, a:b, a:b] == 0, torch.ones(b - a, b - a, dtype=torch.bool).tril())
                assert bool((mask[r, 0, a:b, :a] != 0).all())
    assert sorted(seen) == [r["id"] for r in rows]


def test_preference_packed_and_padded_give_the_same_log_probabilities():
    """A tiny float64 model: each member's completion log-probability packed equals its padded one."""
    tok, rows = fx.tokenizer(), pairs(12)
    config = transformers.LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=2, max_position_embeddings=1024)  # fmt: skip
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).double().eval()
    sums: dict[str, dict[int, tuple[float, float]]] = {"packed": {}, "padded": {}}
    with torch.no_grad():
        for batch in pp.from_iterable(rows).preference(tok).pack(1024, batch_size=2, keep=("id",)).loader():
            logits = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False).logits
            ids = [i for row in batch["id"] for i in row]
            sums["packed"].update(zip(ids, zip(*(t.tolist() for t in pp.pair_logps(logits, batch)))))
        for batch in pp.from_iterable(rows).preference(tok).batch(5).pad().loader():
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
            ids = batch["id"][batch["chosen"]].tolist()
            sums["padded"].update(zip(ids, zip(*(t.tolist() for t in pp.pair_logps(logits, batch)))))
    assert sums["packed"].keys() == sums["padded"].keys() == {r["id"] for r in rows}
    for i, (chosen, rejected) in sums["packed"].items():
        assert chosen == pytest.approx(sums["padded"][i][0], abs=1e-9)
        assert rejected == pytest.approx(sums["padded"][i][1], abs=1e-9)


@pytest.mark.parametrize("layout", ["pad", "pack"])
def test_preference_resumes_exactly(tmp_path, layout):
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in pairs(40)))
    tok = fx.tokenizer()

    def loader() -> Any:
        pipe = pp.read_jsonl(str(path)).shuffle(16, seed=3).preference(tok, max_length=200)
        pipe = pipe.bucket(batch_size=4, buffer_size=16).pad() if layout == "pad" else pipe.pack(512, batch_size=2)
        return pipe.loader()

    check_loader_resume(loader, epochs=2, steps=range(0, 60, 3))


def test_preference_refuses_a_state_saved_with_other_settings():
    tok, rows = fx.tokenizer(), pairs(8)
    loader = pp.from_iterable(rows).preference(tok, max_length=300).batch(2).pad().loader()
    next(iter(loader))
    state = loader.state_dict()
    other = pp.from_iterable(rows).preference(tok, max_length=200).batch(2).pad().loader()
    other.load_state_dict(state)
    with pytest.raises(StateMismatchError, match=r"^preference state doesn't match .*'max_length' found 300 instead"):
        next(iter(other))


def test_preference_is_the_same_with_any_number_of_threads():
    tok, rows = fx.tokenizer(), pairs(30)
    one = padded(pp.from_iterable(rows).preference(tok, num_threads=1), n=4)
    assert one == padded(pp.from_iterable(rows).preference(tok, num_threads=3), n=4)
