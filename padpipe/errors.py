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


def non_negative(name: str, value: object) -> None:
    """Raise ``ValueError`` unless ``value`` is an int >= 0 (``True``/``False`` are not).

    Example:
        >>> non_negative("num_workers", -1)
        Traceback (most recent call last):
        ...
        ValueError: `num_workers` must be an int >= 0, but is -1 instead.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"`{name}` must be an int >= 0, but is {value!r} instead.")


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


def check_bool(name: str, value: object) -> None:
    """Raise ``TypeError`` unless ``value`` is a bool.

    Example:
        >>> check_bool("shuffle", "no")
        Traceback (most recent call last):
        ...
        TypeError: `shuffle` must be a bool, but is 'no' instead.
    """
    if not isinstance(value, bool):
        raise TypeError(f"`{name}` must be a bool, but is {value!r} instead.")


def check_int(name: str, value: object) -> None:
    """Raise ``TypeError`` unless ``value`` is an int (``True``/``False`` are not).

    Example:
        >>> check_int("pad_id", True)
        Traceback (most recent call last):
        ...
        TypeError: `pad_id` must be an int, but is True instead.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"`{name}` must be an int, but is {value!r} instead.")


def check_seed(seed: object) -> None:
    """Raise unless ``seed`` is a non-negative int (what ``numpy.random.default_rng`` accepts).

    Example:
        >>> check_seed(-1)
        Traceback (most recent call last):
        ...
        ValueError: `seed` must be a non-negative int, but is -1 instead.
    """
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"`seed` must be an int, but is {seed!r} of type {type(seed).__name__} instead.")
    if seed < 0:
        raise ValueError(f"`seed` must be a non-negative int, but is {seed} instead.")
