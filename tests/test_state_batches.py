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
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import padpipe as pp
from padpipe.batch_spec import batch_problem
from padpipe.state import CHECKSUM_KEY, StateMismatchError
from padpipe.state_walk import show
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
    return forged(state, path_to(state, lambda d: "ring" in d), lambda s: s.update(held=[batch]))


def in_window(state: dict, edit) -> dict:
    return forged(state, path_to(state, lambda d: "window" in d), lambda s: edit(s["window"][0]))


def in_held(state: dict, edit) -> dict:
    return forged(state, path_to(state, lambda d: "ring" in d), lambda s: edit(s["held"][0]))


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
    stage = "LossTokens" if where == "window" else "EqualSteps lockstep"
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
    refused(pipe, in_held(held, edit), rf"^EqualSteps lockstep state is invalid: 'held' .*{pattern}")


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


def leaves(value, path=()):
    """Every leaf of a state, with its path (dict keys and list indices)."""
    if isinstance(value, dict):
        return [leaf for k, v in value.items() if k != CHECKSUM_KEY for leaf in leaves(v, (*path, k))]
    if isinstance(value, list) and value:
        return [leaf for i, v in enumerate(value) for leaf in leaves(v, (*path, i))]
    return [(path, value)]


WRONG = [None, "x", [], {}, 1.5, True, -1, 10**30, torch.zeros(3), torch.zeros(2, 2, dtype=torch.long), b"x"]


def rest(loader) -> list:
    return [{k: v.tolist() if isinstance(v, torch.Tensor) else v for k, v in b.items()} for b in loader]


@pytest.fixture(scope="module")
def searched(pipe, held):
    """A state holding batches in equal steps and in the accumulation window, and the batches that follow it."""
    state = copy.deepcopy(held)
    window = pipe.loader(accumulation_steps=3)
    it = iter(window)
    next(it)
    saved = copy.deepcopy(window.state_dict())
    return [(state, {}), (saved, {"accumulation_steps": 3})]


@pytest.mark.slow  # seconds alone
@settings(max_examples=200, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_any_leaf_of_a_resealed_state_given_a_wrong_type_is_refused_with_one_line_or_changes_nothing(
    pipe, searched, data
):
    """Every leaf of every stage's state (batches held included) given another type, dtype or shape, with checksums
    recomputed as an attacker would."""
    state, options = searched[data.draw(st.integers(0, len(searched) - 1), label="state")]
    expected = rest(_resumed(pipe, state, options))
    paths = leaves(state)
    path, value = paths[data.draw(st.integers(0, len(paths) - 1), label="leaf")]
    wrong = data.draw(st.sampled_from([w for w in WRONG if not _same(w, value)]), label=f"value at {path}")
    crafted = forged(state, path[:-1], lambda parent: parent.__setitem__(path[-1], copy.deepcopy(wrong)))
    try:
        got = rest(_resumed(pipe, crafted, options))
    except StateMismatchError as exc:
        assert "\n" not in str(exc) and len(str(exc)) < 500, str(exc)[:600]
        return
    assert got == expected, f"a state with {show(wrong)} at {path} resumed with other batches"


def _resumed(pipe, state, options):
    loader = pipe.loader(**options)
    loader.load_state_dict(state)
    return loader


def _same(a, b) -> bool:
    """Whether ``a`` is of ``b``'s kind (a value changed in range is the checksum's to catch, not a wrong type)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape and a.dtype == b.dtype
    return type(a) is type(b) and not (isinstance(a, int) and abs(a) > 2**64)
