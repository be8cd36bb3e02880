"""What happens after an error: a pipeline that raised stays failed until it is reset (docs/state.md).

A stage that raised in ``next()`` may have consumed input it has not emitted, so :class:`FailureLatch`, at the
root of every built pipeline, raises the same exception again on every later ``next()`` and ``state_dict()``,
until ``reset()`` (a new epoch, or a state saved before the error).
"""

from __future__ import annotations

from types import TracebackType
from typing import Any

from torchdata.nodes import BaseNode


class FailureLatch(BaseNode):
    """Pass items, states and resets through unchanged; after an error, re-raise it until the next reset.

    Args:
        source: The pipeline's root node.

    Example:
        >>> from torchdata.nodes import IterableWrapper
        >>> class Bad(IterableWrapper):
        ...     def next(self):
        ...         raise ValueError("row 3 is bad")
        >>> node = FailureLatch(Bad([1]))
        >>> for _ in range(2):
        ...     try:
        ...         next(node)
        ...     except ValueError as e:
        ...         print(e)
        row 3 is bad
        row 3 is bad
    """

    def __init__(self, source: BaseNode) -> None:
        super().__init__()
        self.source = source
        self._error: BaseException | None = None
        self._traceback: TracebackType | None = None

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        super().reset(initial_state)
        self._error = self._traceback = None
        try:
            self.source.reset(initial_state)
        except BaseException as error:  # a half-applied state is no better than a failed next()
            self._fail(error)
            raise

    def next(self) -> Any:
        if self._error is not None:
            raise self._error.with_traceback(self._traceback)
        try:
            return next(self.source)
        except StopIteration:
            raise
        except BaseException as error:
            self._fail(error)
            raise

    def get_state(self) -> dict[str, Any]:
        if self._error is not None:
            raise RuntimeError(
                f"the pipeline failed with {type(self._error).__name__}: {self._error}; a state saved after that "
                "would not resume exactly. Load a state saved before the error, or start a new epoch."
            ) from self._error
        return self.source.state_dict()

    def _fail(self, error: BaseException) -> None:
        if not isinstance(error, GeneratorExit):
            self._error, self._traceback = error, error.__traceback__
