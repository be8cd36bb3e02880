"""What padpipe's command lines share: ``--help`` that shows every default, and user errors as one line.

A command builds its options with :func:`parser`, defines ``main(argv) -> int`` that raises on bad input as the
library does, and ends with ``sys.exit(_command.run(main, prog=PROG))`` (:func:`run` says what a user error prints).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import textwrap
from collections.abc import Callable, Sequence

USER_ERRORS: tuple[type[BaseException], ...] = (ValueError, OSError, ImportError)
"""Errors that mean bad input, not a bug: bad values, ``DataError``, missing files, missing packages."""
USAGE_EXIT = 2
"""The exit code of a user mistake (``argparse``'s own for a bad option)."""
INTERRUPTED_EXIT = 130
TRACEBACK_ENV = "PADPIPE_TRACEBACK"
EPILOG = f"Errors in the input print one line; set {TRACEBACK_ENV}=1 to see their traceback."


def show_log_lines() -> None:
    """Print the ``padpipe`` logger's INFO lines (progress off a terminal) on standard error, unless logging is
    configured already: a command line calls this first, so a job log shows the progress lines it promises.

    Example:
        >>> show_log_lines()  # doctest: +SKIP
        >>> logging.getLogger("padpipe").info("inspect: tokenizing: 20,000 rows, done")  # doctest: +SKIP
        inspect: tokenizing: 20,000 rows, done
    """
    logger = logging.getLogger("padpipe")
    if logger.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger.addHandler(handler)
    if logger.getEffectiveLevel() > logging.INFO:
        logger.setLevel(logging.INFO)


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Help that appends ``(default: X)`` to every option that has a default, keeps line breaks in
    descriptions and never breaks a long word (a path stays whole, to copy)."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(" ".join(text.split()), width, break_long_words=False, break_on_hyphens=False)

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if not action.option_strings or "(default" in text or default is None or default is False:
            return text
        if default is argparse.SUPPRESS:
            return text
        shown = " ".join(map(str, default)) if isinstance(default, (list, tuple)) else str(default)
        return f"{text} (default: {shown.replace('%', '%%')})"


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (not the usage block), exit status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(USAGE_EXIT, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def parser(prog: str, description: str) -> argparse.ArgumentParser:
    """An argument parser named ``prog`` (as the user types it) with :class:`HelpFormatter`.

    Example:
        >>> p = parser("python -m padpipe.demo", "Compare padding strategies.")
        >>> _ = p.add_argument("--seed", type=int, default=0, help="shuffle seed")
        >>> "--seed SEED  shuffle seed (default: 0)" in p.format_help()
        True
    """
    return Parser(prog=prog, description=description, epilog=EPILOG, formatter_class=HelpFormatter)


def run(main: Callable[[Sequence[str] | None], int], argv: Sequence[str] | None = None, *, prog: str) -> int:
    """Call ``main(argv)``; a user error prints ``prog: error: message`` (one line) on stderr and returns 2.

    Args:
        main: The command: parses ``argv`` (``None``: ``sys.argv[1:]``) and returns an exit code.
        argv: The arguments.
        prog: The command's name in messages.

    Returns:
        ``main``'s exit code, 2 after a user error, 130 after Ctrl-C.

    Example:
        >>> def main(argv):
        ...     raise FileNotFoundError("No such file or folder: 'data.parquet'.")
        >>> run(main, [], prog="python -m padpipe.demo")  # prints the message on stderr
        2
    """
    try:
        return main(argv)
    except USER_ERRORS as exc:
        if os.environ.get(TRACEBACK_ENV, "") not in ("", "0"):
            raise
        message = " ".join(str(exc).split()) or type(exc).__name__
        print(f"{prog}: error: {message}", file=sys.stderr)
        return USAGE_EXIT
    except KeyboardInterrupt:
        return INTERRUPTED_EXIT
