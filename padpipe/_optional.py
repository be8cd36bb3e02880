"""Optional dependencies: import one when it is needed, or fail with the ``pip install`` line that adds it.

What each extra adds is docs/install.md's table.
"""

from __future__ import annotations

import importlib
from types import ModuleType

EXTRAS: dict[str, str] = {
    "datasets": "hf",
    "transformers": "hf",
    "huggingface_hub": "hf",
    "s3fs": "s3",
    "matplotlib": "chart",
    "accelerate": "accelerate",
    "lightning": "lightning",
}
"""The padpipe extra that installs each optional package (others are installed by name)."""


class MissingDependencyError(ModuleNotFoundError):
    """An optional package is not installed; the message says what needs it and how to install it.

    A ``ModuleNotFoundError`` (so an ``ImportError``) with ``name`` set to the missing package.
    """


def install_line(package: str) -> str:
    """The ``pip install`` command that brings ``package``: its padpipe extra (or the package alone).

    Example:
        >>> install_line("datasets")
        "pip install 'padpipe[hf]' (or: pip install datasets)"
        >>> install_line("gcsfs")
        'pip install gcsfs'
    """
    extra = EXTRAS.get(package)
    return f"pip install 'padpipe[{extra}]' (or: pip install {package})" if extra else f"pip install {package}"


def missing(package: str, purpose: str) -> MissingDependencyError:
    """The error for ``purpose`` needing ``package``, which is not installed.

    Example:
        >>> str(missing("s3fs", "reading 's3://bucket/train.parquet'"))
        "reading 's3://bucket/train.parquet' needs the s3fs package, which is not installed: pip install 'padpipe[s3]' (or: pip install s3fs)"
    """  # noqa: E501
    return MissingDependencyError(
        f"{purpose} needs the {package} package, which is not installed: {install_line(package)}", name=package
    )


def require(module: str, purpose: str) -> ModuleType:
    """Import ``module``, or raise :class:`MissingDependencyError` naming ``purpose`` and the install line.

    Only a missing ``module`` itself is turned into that error: an installed package that fails
    to import (one of *its* dependencies missing, a broken install) raises its own error.

    Args:
        module: The module to import (``"datasets"``, ``"transformers"``).
        purpose: What needs it, for the message (``"pp.from_hf()"``).

    Example:
        >>> require("json", "reading JSON").__name__
        'json'
        >>> require("no_such_package", "pp.frobnicate()")
        Traceback (most recent call last):
        ...
        padpipe._optional.MissingDependencyError: pp.frobnicate() needs the no_such_package package, which is not installed: pip install no_such_package
    """  # noqa: E501
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name is None or not (module == exc.name or module.startswith(exc.name + ".")):
            raise  # the package is there, but something it imports is not
        raise missing(module.partition(".")[0], purpose) from None
