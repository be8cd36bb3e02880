"""Versioned node state: every stage saves the settings resume depends on and checks them back."""

from __future__ import annotations

from typing import Any, Mapping

VERSION_KEY = "version"
SETTINGS_KEY = "settings"
SOURCE_KEY = "source"


class StateMismatchError(ValueError):
    """A state dict does not belong to this pipeline (other version, seed, paths or batch policy)."""


def check_state(stage: str, state: Mapping[str, Any], *, version: int, settings: Mapping[str, Any]) -> None:
    """Raise :class:`StateMismatchError` unless ``state`` was saved by a stage with these settings.

    Args:
        stage: Stage name for the message, e.g. ``"bucket"``.
        state: The state dict given to ``reset``.
        version: The stage's current state format version.
        settings: The settings that must match, as saved by :func:`make_state`.

    Example:
        >>> check_state("bucket", {"version": 1, "settings": {"seed": 0}}, version=1, settings={"seed": 1})
        Traceback (most recent call last):
        ...
        padpipe._state.StateMismatchError: bucket state doesn't match this pipeline: setting 'seed' found 0 instead of 1.
    """
    if not isinstance(state, Mapping) or VERSION_KEY not in state:
        raise StateMismatchError(f"{stage} state is not a padpipe state dict: found keys {sorted(state)!r}.")
    if state[VERSION_KEY] != version:
        raise StateMismatchError(
            f"{stage} state doesn't match this pipeline: version found {state[VERSION_KEY]!r} instead of {version!r}."
        )
    saved = state.get(SETTINGS_KEY, {})
    for key, expected in settings.items():
        found = saved.get(key, "<missing>")
        if found != expected:
            raise StateMismatchError(
                f"{stage} state doesn't match this pipeline: setting {key!r} found {found!r} instead of {expected!r}."
            )


def make_state(*, version: int, settings: Mapping[str, Any], **fields: Any) -> dict[str, Any]:
    """Build a state dict with the version and the settings to check on resume.

    Example:
        >>> make_state(version=1, settings={"seed": 0}, epoch=3)
        {'version': 1, 'settings': {'seed': 0}, 'epoch': 3}
    """
    return {VERSION_KEY: version, SETTINGS_KEY: dict(settings), **fields}
