"""Versioned, checked, plain-data node state: what it holds and what resume checks is docs/state.md.

A stage declares its state once, as a :class:`StateSchema`: its ``version``, the ``settings`` that must match,
each field's :class:`Spec` (the specs live in :mod:`padpipe.state_specs`; a stage imports them from here, with the
schema), and a CRC-32 ``checksum`` over them all. Every failure is a :class:`StateMismatchError` naming the stage and
the key.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from padpipe.state_specs import Array, Bool, Child, Int, Invalid, ListOf, Optional, Plain, Rng, Spec, Str
from padpipe.state_walk import crc, deeper_than, key_text, show

VERSION_KEY = "version"
SETTINGS_KEY = "settings"
CHECKSUM_KEY = "checksum"
MISSING = "<missing>"
MAX_DEPTH = 32
"""Most levels of lists and dicts a stage's own values nest (a nested state or buffer counts apart)."""
__all__ = [  # the stage protocol: the schema, its errors and helpers, and the specs its fields are declared with
    "CHECKSUM_KEY", "MAX_DEPTH", "SETTINGS_KEY", "VERSION_KEY", "Array", "Bool", "Child", "Int", "Invalid", "ListOf",
    "Loaded", "Optional", "Plain", "Rng", "Spec", "StateMismatchError", "StateSchema", "Str", "check_state", "checksum",
    "invalid", "load_value", "make_state", "plain", "seal", "unseal",
]  # fmt: skip


class StateMismatchError(ValueError):
    """A state dict does not belong to this pipeline (other version, seed, input or batch policy), or is corrupt."""


# -- plain data -------------------------------------------------------------------------------------
def plain(value: Any) -> Any:
    """``value`` as plain state data: tuples become lists, numpy scalars and arrays become ints and tensors.

    Raises ``TypeError`` for anything else that is not plain (a programming error in a stage).

    Example:
        >>> plain({"a": (1, np.int64(2)), "b": np.arange(2)})
        {'a': [1, 2], 'b': tensor([0, 1])}
    """
    if value is None or isinstance(value, (bool, int, float, str, torch.Tensor)):
        return value
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return torch.from_numpy(np.array(value, copy=True))
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, Mapping):
        if CHECKSUM_KEY in value:  # sealed by make_state or seal: plain already
            return value
        return {_key(k): plain(v) for k, v in value.items()}
    raise TypeError(f"state values must be plain data, but {type(value).__name__} {value!r:.80} is not.")


def _key(key: Any) -> str:
    if not isinstance(key, str):
        raise TypeError(f"state keys must be strings, but {key!r} is a {type(key).__name__}.")
    return key


def checksum(value: Mapping[str, Any]) -> str:
    """The CRC-32 of a state dict's values (its own ``checksum`` entry left out), as 8 hex digits.

    Tensors count by dtype, shape and raw bytes (any dtype, ``bfloat16`` included); a nested dict that has a
    ``checksum`` counts by it.

    Example:
        >>> checksum({"epoch": 1}) == checksum({"epoch": 1}) != checksum({"epoch": 2})
        True
    """
    return f"{crc({k: v for k, v in value.items() if k != CHECKSUM_KEY}, sealed=CHECKSUM_KEY):08x}"


def seal(value: Mapping[str, Any]) -> dict[str, Any]:
    """``value`` with its :func:`checksum` added under ``"checksum"`` (for buffers inside a state).

    Example:
        >>> seal({"n": 1})
        {'n': 1, 'checksum': '...'}
    """
    out = dict(value)
    out[CHECKSUM_KEY] = checksum(out)
    return out


def make_state(*, version: int, settings: Mapping[str, Any], **fields: Any) -> dict[str, Any]:
    """Build a sealed state dict with the version and the settings to check on resume.

    Example:
        >>> make_state(version=1, settings={"seed": 0}, epoch=3)
        {'version': 1, 'settings': {'seed': 0}, 'epoch': 3, 'checksum': '...'}
    """
    return seal({VERSION_KEY: version, SETTINGS_KEY: plain(settings), **plain(fields)})


def _same(found: Any, expected: Any) -> bool:
    """``found == expected`` for plain data, where a tensor equals nothing (and ``==`` on it never runs)."""
    if isinstance(found, torch.Tensor) or isinstance(expected, torch.Tensor):
        return False
    if isinstance(found, Mapping) and isinstance(expected, Mapping):
        return set(found) == set(expected) and all(_same(found[k], expected[k]) for k in expected)
    if isinstance(found, (list, tuple)) and isinstance(expected, (list, tuple)):
        return len(found) == len(expected) and all(_same(a, b) for a, b in zip(found, expected))
    return (type(found) is type(expected) or _number(found) and _number(expected)) and found == expected


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# -- checking ---------------------------------------------------------------------------------------
def invalid(stage: str, key: str, expected: str, found: Any) -> StateMismatchError:
    """The error for a bad value under ``key``: "``stage`` state is invalid: 'key' must be ..., but is ... instead."

    Example:
        >>> invalid("ParquetReader", "unit", "an int from 0 to 6", -5)
        StateMismatchError("ParquetReader state is invalid: 'unit' must be an int from 0 to 6, but is -5 instead.")
    """
    return StateMismatchError(f"{stage} state is invalid: {show(key, 160)} must be {expected}, but is {found} instead.")


def load_value(stage: str, key: str, value: Any, spec: Spec) -> Any:
    """``spec.load(value)``, its failure raised as a :class:`StateMismatchError` naming ``stage`` and ``key``.

    For checks that depend on other loaded values (a row index against the unit's row count).

    Example:
        >>> load_value("shuffle", "chunk_rows", -1, Int(0))
        Traceback (most recent call last):
        ...
        padpipe.state.StateMismatchError: shuffle state is invalid: 'chunk_rows' must be an int >= 0, but is -1 instead.
    """
    try:
        return spec.load(value)
    except Invalid as exc:
        raise invalid(stage, key, exc.expected, exc.found if exc.found is not None else show(value)) from None
    except StateMismatchError as exc:  # a nested buffer's own check names what is wrong inside it
        raise StateMismatchError(f"{stage} state is invalid: {key!r}: {exc}") from None


def check_state(
    stage: str,
    state: Any,
    *,
    version: int,
    settings: Mapping[str, Any],
    fields: Mapping[str, Spec] | None = None,
    check: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Check a state dict given to ``reset`` fully; return its fields as loaded by their specs.

    Checks, in order: a dict with a ``version`` equal to ``version`` and a ``settings`` dict; each of ``settings`` equal
    to the saved one; with ``fields``, exactly these keys besides version, settings and checksum,
    each taken by its :class:`Spec`; ``check``; the checksum. Everything else raises
    :class:`StateMismatchError` naming ``stage`` and the key.

    Args:
        stage: Stage name for the message, e.g. ``"Bucketizer"``.
        state: The state dict given to ``reset``.
        version: The stage's current state format version.
        settings: The settings that must match, as saved by :func:`make_state`.
        fields: The stage's own keys and what each must be; ``None`` checks no fields.
        check: Checks between loaded fields (a row index against its unit's rows), given the
            loaded fields; raises with :func:`load_value` or :func:`invalid`.

    Example:
        >>> check_state("bucket", make_state(version=1, settings={"seed": 0}), version=1, settings={"seed": 1})
        Traceback (most recent call last):
        ...
        padpipe.state.StateMismatchError: bucket state doesn't match this pipeline: setting 'seed' found 0 instead of 1.
        >>> check_state("bucket", make_state(version=1, settings={}, pos=-1), version=1, settings={},
        ...             fields={"pos": Int(0)})
        Traceback (most recent call last):
        ...
        padpipe.state.StateMismatchError: bucket state is invalid: 'pos' must be an int >= 0, but is -1 instead.
    """
    if not isinstance(state, Mapping):
        raise StateMismatchError(
            f"{stage} state must be a dict saved by padpipe, but is a {type(state).__name__} instead."
        )
    if VERSION_KEY not in state:
        raise StateMismatchError(
            f"{stage} state is not a padpipe state dict: found keys {show(sorted(state, key=key_text), 300)}."
        )
    if not _same(state[VERSION_KEY], version):
        raise StateMismatchError(
            f"{stage} state doesn't match this pipeline: version found {show(state[VERSION_KEY])} instead of "
            f"{version!r}."
        )
    if SETTINGS_KEY not in state:
        raise StateMismatchError(f"{stage} state is invalid: key {SETTINGS_KEY!r} is missing.")
    for key, value in state.items():  # nothing below walks deeper (no RecursionError, whatever a state holds)
        if deeper_than(value, MAX_DEPTH, sealed=CHECKSUM_KEY) is not None:
            raise invalid(stage, key, f"plain data nested at most {MAX_DEPTH} levels deep", "nested deeper")
    saved = state[SETTINGS_KEY]
    if not isinstance(saved, Mapping):
        raise invalid(stage, SETTINGS_KEY, "a dict", show(saved))
    for key, expected in plain(settings).items():
        found = saved.get(key, MISSING)
        if not _same(found, expected):
            raise StateMismatchError(
                f"{stage} state doesn't match this pipeline: setting {key!r} found {show(found, 300)} instead of "
                f"{expected!r}."
            )
    loaded: dict[str, Any] = {}
    if fields is not None:
        own = {VERSION_KEY, SETTINGS_KEY, CHECKSUM_KEY}
        for key in fields:
            if key not in state:
                raise StateMismatchError(f"{stage} state is invalid: key {key!r} is missing.")
        extra = sorted(set(state) - set(fields) - own, key=key_text)
        if extra:
            raise StateMismatchError(f"{stage} state is invalid: unexpected key {show(extra[0])}.")
    found_sum = state.get(CHECKSUM_KEY, MISSING)
    if found_sum == MISSING:
        raise StateMismatchError(f"{stage} state is invalid: key {CHECKSUM_KEY!r} is missing.")
    if fields is not None:
        for key, spec in fields.items():
            loaded[key] = load_value(stage, key, state[key], spec)
    if check is not None:
        check(loaded)
    expected_sum = checksum(state)
    if found_sum != expected_sum:
        raise StateMismatchError(
            f"{stage} state is invalid: its checksum is {show(found_sum)}, but its values give {expected_sum!r}; "
            "it was changed after it was saved."
        )
    return loaded


class StateSchema:
    """A stage's state, declared once: its name, version and what each of its keys must be.

    :meth:`make` saves exactly these keys (another set is a programming error) and :meth:`check`
    loads exactly these keys back, with every check :func:`check_state` makes. The loaded fields
    read as attributes, so a key is spelled in the declaration and where it is used, never as a
    separate constant.

    Args:
        stage: Stage name for messages, e.g. ``"Bucketizer"``.
        version: The state format version; another version is refused.
        **fields: Each key's :class:`Spec`.

    Example:
        >>> STATE = StateSchema("Count", 1, epoch=Int(0), pos=Int(0))
        >>> saved = STATE.make({"seed": 0}, epoch=2, pos=5)
        >>> loaded = STATE.check(saved, {"seed": 0}); loaded.epoch, loaded.pos
        (2, 5)
        >>> STATE.check(saved, {"seed": 1})
        Traceback (most recent call last):
        ...
        padpipe.state.StateMismatchError: Count state doesn't match this pipeline: setting 'seed' found 0 instead of 1.
    """

    def __init__(self, stage: str, version: int, **fields: Spec) -> None:
        for key, spec in fields.items():
            if not isinstance(spec, Spec):
                raise TypeError(f"state key {key!r} of {stage} must be declared with a Spec, but is {spec!r}.")
        self.stage, self.version, self.fields = stage, version, dict(fields)

    def make(self, settings: Mapping[str, Any], **values: Any) -> dict[str, Any]:
        """The sealed state of these ``values`` (every declared key, no other) and ``settings``."""
        if set(values) != set(self.fields):
            missing, extra = sorted(set(self.fields) - set(values)), sorted(set(values) - set(self.fields))
            raise TypeError(f"{self.stage} state: keys missing {missing}, undeclared {extra}.")
        return make_state(version=self.version, settings=settings, **values)

    def check(
        self,
        state: Any,
        settings: Mapping[str, Any],
        *,
        specs: Mapping[str, Spec] | None = None,
        check: Callable[[Loaded], None] | None = None,
        stage: str | None = None,
    ) -> Loaded:
        """``state``'s fields as loaded by their specs, after every check of :func:`check_state`.

        Args:
            state: The state dict given to ``reset``.
            settings: The settings that must match.
            specs: Declared keys whose spec depends on this stage's settings (a buffer no longer
                than its size), given here instead of the declared one.
            check: Checks between loaded fields, as in :func:`check_state`.
            stage: The name in messages, where a subclass shares this schema (default: the declared one).
        """
        unknown = sorted(set(specs or {}) - set(self.fields))
        if unknown:
            raise TypeError(f"{self.stage} state: specs given for undeclared keys {unknown}.")
        fields = {**self.fields, **(specs or {})}
        between = None if check is None else lambda values: check(Loaded(values))
        loaded = check_state(
            stage or self.stage, state, version=self.version, settings=settings, fields=fields, check=between
        )
        return Loaded(loaded)


class Loaded:
    """The fields of a checked state, read as attributes (``loaded.epoch``) or by key (``loaded["epoch"]``).

    Not a dict, so a field may have any name (``items``, ``keys``) without meeting a dict method.
    """

    __slots__ = ("_fields",)

    def __init__(self, fields: Mapping[str, Any]) -> None:
        self._fields = dict(fields)

    def __getattr__(self, key: str) -> Any:
        try:
            return self._fields[key]
        except KeyError:
            raise AttributeError(f"no state field {key!r}; the fields are {sorted(self._fields)}") from None

    def __getitem__(self, key: str) -> Any:
        return self._fields[key]


def unseal(what: str, value: Any, keys: Sequence[str]) -> Mapping[str, Any]:
    """Check that ``value`` is a sealed dict with exactly ``keys`` (plus its checksum) and the right checksum.

    Raises ``StateMismatchError`` with ``what`` in the message (the caller adds stage and key).

    Example:
        >>> unseal("a token chunk", seal({"ids": 1}), ["ids"])["ids"]
        1
    """
    if not isinstance(value, Mapping) or set(value) != {*keys, CHECKSUM_KEY}:
        raise StateMismatchError(f"expected {what} with keys {sorted(keys)!r} and a checksum, found {show(value)}")
    if value[CHECKSUM_KEY] != checksum(value):
        raise StateMismatchError(f"{what}'s checksum doesn't match its values; it was changed after it was saved")
    return value
