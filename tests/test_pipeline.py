"""The fluent facade checks every argument when the stage is added, not later in loader()."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import padpipe as pp


def _tokens() -> pp.Pipeline:
    return pp.from_iterable([{"text": "a b"}]).tokenize(pp.examples.tokenizer())


@pytest.mark.parametrize(
    "add, error, message",
    [
        (lambda p: p.batch(2, drop_last="yes"), TypeError, r"^`drop_last` must be a bool, but is 'yes' instead\.$"),
        (lambda p: p.bucket(2, drop_last=1), TypeError, r"^`drop_last` must be a bool, but is 1 instead\.$"),
        (lambda p: p.bucket(2, shuffle="no"), TypeError, r"^`shuffle` must be a bool, but is 'no' instead\.$"),
        (lambda p: p.batch(2).pad(pad_id=True), TypeError, r"^`pad_id` must be an int, but is True instead\.$"),
        (
            lambda p: p.batch(2).pad(label_pad_id="x"),
            TypeError,
            r"^`label_pad_id` must be an int, but is 'x' instead\.$",
        ),
    ],
)
def test_pipeline_raises_error_when_a_stage_argument_has_the_wrong_type(
    add: Callable[[pp.Pipeline], Any], error: type, message: str
) -> None:
    with pytest.raises(error, match=message):
        add(_tokens())  # at once, before any loader() builds the nodes


def test_pipeline_accepts_well_typed_stage_arguments() -> None:
    pipe = _tokens().bucket(2, drop_last=False, shuffle=False).pad(pad_id=0, label_pad_id=-1)
    batch = next(iter(pipe.loader()))
    assert batch["input_ids"].tolist() == [[2, 81, 82, 3]]


def test_pad_raises_error_when_padding_cannot_fit_the_bucket_budget():
    pipe = pp.from_iterable([{"text": "a"}]).tokenize(pp.examples.tokenizer()).bucket(max_tokens=64)
    with pytest.raises(ValueError, match=r"^`max_tokens` must be at least `pad_to_length`=128 \(every row"):
        pipe.pad(pad_to_length=128)
    with pytest.raises(ValueError, match=r"^`max_tokens` must be at least `pad_to_multiple_of`=128 \(the shortest"):
        pipe.pad(pad_to_multiple_of=128)
