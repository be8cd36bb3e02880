"""Batches held in a crafted state (checksums recomputed) are refused as one line, never yielded or crashed on.

Issue 39's four: a held batch whose ``input_ids`` is a list (``AttributeError``), ``load_state_dict([])``
(``IndexError``), ``input_ids`` as floats and ``labels`` cut to half the rows of ``input_ids`` (both
accepted and yielded). Then a search of the same kind: every key of a held batch given another
type, dtype or shape, and keys that disagree with each other, in each place a state holds batches
(equal steps' read-ahead, the window of accumulation steps, a checkpoint's fetch-ahead).
"""

from __future__ import annotations

import copy
import functools
import tracemalloc

import pytest
import torch

import padpipe as pp
from padpipe.batch_spec import batch_problem
from padpipe.state import StateMismatchError
from tests.test_state_attacks import forged, path_to, refused

KEYS = ("input_ids", "position_ids", "labels", "seq_idx", "cu_seq_lens_q", "cu_seq_lens_k")


@pytest.fixture(scope="module")
def pipe() -> pp.Pipeline:
    rows = [{"text": "hello world " * (1 + i % 5), "id": i} for i in range(60)]
    return pp.from_iterable(rows, chunk_rows=8).tokenize(pp.examples.tokenizer()).pack(32, batch_size=2)


@pytest.fixture(scope="module")
def window(pipe) -> dict:
    """A state after one step of three accumulation steps: two packed batches held in its window."""
    loader = pipe.loader(accumulation_steps=3)
    next(iter(loader))
    return copy.deepcopy(loader.state_dict())


@pytest.fixture(scope="module")
def held(pipe) -> dict:
    """A state whose equal steps hold a packed batch read ahead (as a rank does at an epoch's tail)."""
    loader = pipe.loader()
    it = iter(loader)
    next(it)
    batch = next(it)
    state = copy.deepcopy(loader.state_dict())
    return forged(state, path_to(state, lambda d: "held" in d), lambda s: s.update(held=[batch]))


def in_window(state: dict, edit) -> dict:
    return forged(state, path_to(state, lambda d: "window" in d), lambda s: edit(s["window"][0]))


def in_held(state: dict, edit) -> dict:
    return forged(state, path_to(state, lambda d: "held" in d), lambda s: edit(s["held"][0]))


def halved(t: torch.Tensor) -> torch.Tensor:
    return t[: max(len(t) // 2, 1)].clone() if len(t) > 1 else torch.cat([t, t])


ISSUE = {
    "input_ids as a list": (lambda b: b.update(input_ids=b["input_ids"].tolist()), r"`input_ids` is a tensor"),
    "input_ids as floats": (lambda b: b.update(input_ids=b["input_ids"].float()), r"`input_ids` is an integer"),
    "labels of half the rows": (lambda b: b.update(labels=halved(b["labels"])), r"`labels` has the batch's 2 rows"),
}


@pytest.mark.parametrize("where", ["window", "held"])
@pytest.mark.parametrize("case", list(ISSUE))
def test_the_issues_crafted_batches_are_refused_with_one_line(pipe, window, held, where, case):
    edit, pattern = ISSUE[case]
    state, options = (
        (in_window(window, edit), {"accumulation_steps": 3}) if where == "window" else (in_held(held, edit), {})
    )
    stage = "LossTokens" if where == "window" else "EqualSteps"
    refused(
        pipe,
        state,
        rf"^{stage} state is invalid: '{where}' must be a list of items, each a batch whose {pattern}",
        **options,
    )


@pytest.mark.parametrize("state", [[], ()])
def test_an_empty_list_of_states_is_refused_with_one_line(pipe, state):
    loader = pipe.loader()
    with pytest.raises(
        StateMismatchError, match=r"^PipelineLoader state is invalid: .* but is an empty list instead\.$"
    ):
        loader.load_state_dict(state)


def corruptions(key: str, value: torch.Tensor) -> dict:
    """Another type, dtype or shape for ``value`` (the batch's ``key``), each one a batch must not hold."""
    out = {
        "list": value.tolist(),
        "string": "x",
        "None": None,
        "0-d": value.reshape(-1)[0].clone(),
        "bool": value.bool(),
        "complex": value.to(torch.complex64),
    }
    if key != "labels":
        out["float"] = value.float()
    if key in ("cu_seq_lens_q", "cu_seq_lens_k"):
        out["short of the tokens"] = value[:-1].clone()
        out["2-d"] = value[None].clone()
    else:
        out["half the rows"] = halved(value)
        out["twice the rows"] = torch.cat([value, value])
        if key != "input_ids":
            out["other columns"] = value[:, :-1].clone()
    if key == "input_ids":
        out["negative ids"] = value - value.max() - 1
    return out


CASES = [(key, name) for key in KEYS for name in corruptions(key, torch.ones(2, 4, dtype=torch.long))]


@pytest.mark.parametrize(("key", "name"), CASES)
def test_every_key_of_a_held_batch_with_another_type_dtype_or_shape_is_refused(pipe, window, key, name):
    batch = functools.reduce(lambda v, k: v[k], path_to(window, lambda d: "window" in d), window)["window"][0]
    bad = corruptions(key, batch[key])[name]
    assert batch_problem({**batch, key: bad}) is not None
    state = in_window(window, lambda b: b.update({key: bad}))
    refused(
        pipe,
        state,
        r"^LossTokens state is invalid: 'window' must be a list of items, each a batch",
        accumulation_steps=3,
    )


@pytest.mark.parametrize(
    ("edit", "pattern"),
    [
        (lambda b: b.update(is_filler=torch.tensor(1)), r"`is_filler` is a 0-d bool tensor"),
        (lambda b: b.update(is_repeat=torch.ones(2, dtype=torch.bool)), r"`is_repeat` is a 0-d bool tensor"),
        (lambda b: b.update(num_items_in_batch=torch.tensor(1.5)), r"`num_items_in_batch` is a 0-d integer"),
        (lambda b: b.update(id=["a"]), r"`id` has the batch's 2 rows"),
        (lambda b: b.update({7: 1}), r"keys are strings"),
        (lambda b: b.update(attention_mask=torch.ones(2, 3)), r"`attention_mask` has the shape of `input_ids`"),
    ],
)
def test_marks_and_columns_that_disagree_with_the_batch_are_refused(pipe, held, edit, pattern):
    refused(pipe, in_held(held, edit), rf"^EqualSteps state is invalid: 'held' .*{pattern}")


def test_a_checkpoints_fetch_ahead_batch_is_checked_too(pipe):
    loader = pipe.loader()
    loader.keep_untrained(1)
    it = iter(loader)
    next(it), next(it)
    saved = loader.checkpoint(untrained=1)
    state = forged(
        saved, ("ranks", 0), lambda part: part["ahead"][0].update(input_ids=part["ahead"][0]["input_ids"].float())
    )
    refused(
        pipe,
        state,
        r"^PipelineLoader checkpoint state is invalid: 'ranks\[0\]\.ahead' must be a list of items, each a batch whose `input_ids` is an integer",
    )


def test_checking_a_large_held_batch_takes_memory_linear_in_it(pipe, held):
    big = {"input_ids": torch.zeros(64, 4096, dtype=torch.long), "labels": torch.zeros(32, 4096, dtype=torch.long)}
    state = in_held(held, lambda b: (b.clear(), b.update(big)))
    tracemalloc.start()
    try:
        refused(pipe, state, r"`labels` has the batch's 64 rows")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 50_000_000
