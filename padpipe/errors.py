"""Errors for bad input data: each names the file, row or column, and what was expected."""

from __future__ import annotations


class DataError(ValueError):
    """Input data that cannot be used: unreadable file, missing column, bad row.

    Example:
        >>> raise DataError("train.jsonl row 7: column 'text' is None; expected a string.")
        Traceback (most recent call last):
        ...
        padpipe.errors.DataError: train.jsonl row 7: column 'text' is None; expected a string.
    """


def positive(name: str, value: object, *, allow_none: bool = False) -> None:
    """Raise ``ValueError``/``TypeError`` unless ``value`` is a positive int (or ``None`` if allowed).

    Example:
        >>> positive("batch_size", 0)
        Traceback (most recent call last):
        ...
        ValueError: `batch_size` must be greater than zero, but is 0 instead.
    """
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"`{name}` must be an int, but is {value!r} of type {type(value).__name__} instead.")
    if value <= 0:
        raise ValueError(f"`{name}` must be greater than zero, but is {value} instead.")


def one_of(name: str, value: object, choices: tuple) -> None:
    """Raise ``ValueError`` unless ``value`` is one of ``choices``.

    Example:
        >>> one_of("side", "up", ("left", "right"))
        Traceback (most recent call last):
        ...
        ValueError: `side` must be one of ('left', 'right'), but is 'up' instead.
    """
    if value not in choices:
        raise ValueError(f"`{name}` must be one of {choices!r}, but is {value!r} instead.")
