"""The DPO recipe on the shipped pairs and chat tokenizer: every pair packed once, member by member, or padded in TRL's
layout; members cut to fit a row; resume; options refused at once; the command line."""

from __future__ import annotations

import collections
import gzip
import json
import re
from typing import Any

import pytest

import padpipe as pp
from padpipe.recipes.dpo import dpo, main
from tests.contract import check_loader_resume

pytest.importorskip("transformers")

TOK = pp.examples.chat_tokenizer()
with gzip.open(pp.examples.PREFERENCES_JSONL, "rt") as _f:
    ROWS = [json.loads(line) for line, _ in zip(_f, range(60))]


def members(rows: list[dict[str, Any]]) -> dict[tuple[int, bool], list[int]]:
    """Each pair's members by ``(id, chosen)``: the template's ids of prompt + completion."""
    out = {}
    for row in rows:
        for chosen, key in ((True, "chosen"), (False, "rejected")):
            ids = TOK.apply_chat_template(row["prompt"] + row[key], tokenize=True, return_dict=True)["input_ids"]
            out[row["id"], chosen] = list(ids)
    return out


def test_dpo_packs_every_pair_once_member_by_member(tmp_path):
    pipe = dpo(pp.from_iterable(ROWS), TOK, seq_len=4096, batch_size=2, keep=("id",))
    expected, seen = members(ROWS), collections.Counter()
    for batch in pipe.loader():
        flat, chosen, bounds = batch["input_ids"].flatten(), batch["chosen"].flatten(), batch["cu_seq_lens_q"].tolist()
        ids = iter(i for row in batch["id"] for i in row)
        for a, b in zip(bounds, bounds[1:]):
            if bool(chosen[a]):
                pair = next(ids)
                c = bounds[bounds.index(b) + 1]
                assert flat[a:b].tolist() == expected[pair, True] and flat[b:c].tolist() == expected[pair, False]
                seen[pair] += 1
    assert seen == collections.Counter(r["id"] for r in ROWS)


def test_dpo_cuts_members_to_half_a_row_so_every_pair_fits():
    loader = dpo(pp.from_iterable(ROWS), TOK, seq_len=512, batch_size=4).loader()
    batches = list(loader)
    stats = loader.stats()
    assert stats.counters["preference.prompt_cut"] > 0
    assert stats.counters["preference.rows"] + sum(stats.skipped.values()) == len(ROWS)
    for batch in batches:  # every member (a sequence with completion tokens) fits half a row
        bounds, mask = batch["cu_seq_lens_q"].tolist(), batch["completion_mask"].flatten()
        assert all(b - a <= 256 for a, b in zip(bounds, bounds[1:]) if mask[a:b].any())


def test_dpo_pads_pairs_in_trls_layout():
    batch = next(iter(dpo(pp.from_iterable(ROWS), TOK, mode="pad", batch_size=4).loader()))
    assert batch["chosen"].tolist() == [True] * 4 + [False] * 4
    assert batch["id"][:4].tolist() == batch["id"][4:].tolist()
    expected = members(ROWS)
    for i in range(8):
        real = batch["attention_mask"][i].bool()
        assert batch["input_ids"][i][real].tolist() == expected[int(batch["id"][i]), bool(batch["chosen"][i])]


def test_dpo_resumes_exactly(tmp_path):
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS[:40]))
    check_loader_resume(lambda: dpo(str(path), TOK, seq_len=1024, batch_size=2, shuffle_buffer=16).loader(), epochs=2)


def test_dpo_raises_error_when_options_do_not_fit():
    with pytest.raises(ValueError, match=r"^`max_length` must be at most seq_len // 2 = 512 with mode='pack'"):
        dpo(ROWS, TOK, seq_len=1024, max_length=600)
    with pytest.raises(ValueError, match=r"^`keep` is for mode='pack'"):
        dpo(pp.from_iterable(ROWS), TOK, mode="pad", keep=("id",))
    with pytest.raises(ValueError, match=r"^`mode` must be one of"):
        dpo(pp.from_iterable(ROWS), TOK, mode="bucket")  # type: ignore[arg-type]


@pytest.mark.slow  # seconds alone
def test_dpo_cli_prints_pairs_efficiency_cuts_and_drops(capsys):
    assert main(["--data", "preferences", "--tokenizer", "chat", "--seq-len", "256", "--max-batches", "2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("dpo pack seq_len=256, max_length=128:\nbatch 0: input_ids [8, 256] int64")
    assert re.search(r"^2 batches, \d+ pairs, \d+ tokens in 4096 slots: packing efficiency", out, re.M)
    assert re.search(r"^prompt cut to max_length: [1-9]\d* pairs", out, re.M)
    assert re.search(r"^dropped: \d+ pairs?\n  preference.too_long \d+: its completions do not fit", out, re.M)
    assert main(["--data", "preferences", "--tokenizer", "chat", "--mode", "pad", "--max-batches", "1"]) == 0
    assert "attention_mask [16, " in capsys.readouterr().out
