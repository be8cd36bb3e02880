"""Retry transient storage errors with exponential backoff, then fail with a DataError naming the file.

Readers wrap every open, list and read in it: a *transient* error (:func:`is_transient`) is retried after
``backoff``, ``2 * backoff``, ... (capped, with jitter) until ``retries`` or ``max_seconds`` are used up. Errors
about the data, and access denied, are never retried.

Example:
    >>> policy = Retry.of(3)
    >>> call(policy, "s3://bucket/a.parquet: open", lambda: 42)
    42
"""

from __future__ import annotations

import errno
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from padpipe.errors import DataError

T = TypeVar("T")

_ERRNOS = "EIO ECONNRESET ECONNABORTED ECONNREFUSED ETIMEDOUT EPIPE EAGAIN EHOSTUNREACH ENETUNREACH ENETDOWN"
TRANSIENT_ERRNOS = frozenset(getattr(errno, name) for name in _ERRNOS.split())
TRANSIENT_STATUS = frozenset({408, 425, 429})
TRANSIENT_NAMES = frozenset(  # network errors of the storage clients not derived from ConnectionError/TimeoutError
    "ClientConnectionError ClientPayloadError ServerDisconnectedError ServerTimeoutError "  # aiohttp
    "HTTPClientError ConnectionClosedError EndpointConnectionError ReadTimeoutError ConnectTimeoutError "  # botocore
    "IncompleteRead ResponseParserError ChunkedEncodingError FSTimeoutError".split()
)
PERMANENT = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError, FileExistsError)
GIVE_UP_FIX = "if the store is only busy, allow more with retries=pp.Retry(retries=..., max_seconds=...)."
DENIED_FIX = "check the credentials (storage_options) and the file's permissions."


@dataclass(frozen=True)
class Retry:
    """How transient storage errors are retried.

    Attributes:
        retries: Retries after the first attempt (0: fail at once).
        backoff: Seconds before the first retry; doubled for each next one.
        max_backoff: Longest wait between two attempts.
        max_seconds: Give up when the next wait would end more than this long after the first
            failure, even if retries are left.

    Example:
        >>> Retry.of(2)
        Retry(retries=2, backoff=0.5, max_backoff=10.0, max_seconds=120.0)
    """

    retries: int = 5
    backoff: float = 0.5
    max_backoff: float = 10.0
    max_seconds: float = 120.0

    def __post_init__(self) -> None:
        if isinstance(self.retries, bool) or not isinstance(self.retries, int) or self.retries < 0:
            raise ValueError(f"`retries` must be a non-negative int, but is {self.retries!r} instead.")
        for name in ("backoff", "max_backoff", "max_seconds"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"`{name}` must be a non-negative number, but is {value!r} instead.")

    @staticmethod
    def of(value: int | Retry) -> Retry:
        """The policy for a reader's ``retries`` argument: a count of retries or a :class:`Retry`."""
        if isinstance(value, Retry):
            return value
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"`retries` must be an int or a Retry, but is {value!r} instead.")
        return Retry(retries=value)

    def wait(self, failures: int) -> float:
        """Seconds to wait after the ``failures``-th failure in a row (1-based), with +-25% jitter."""
        return min(self.max_backoff, self.backoff * 2 ** (failures - 1)) * random.uniform(0.75, 1.25)


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` looks like a passing storage/network fault worth retrying.

    Transient: ``ConnectionError``, ``TimeoutError``, an ``OSError`` with a network or I/O errno
    (s3fs reports unrecognized S3 errors as ``EIO``), an HTTP status 5xx/408/429 on the error or
    its cause, and the network errors of aiohttp/botocore/requests by name. Not transient: missing
    files and permissions, ``DataError``, and pyarrow's own errors about the bytes it decoded.
    """
    if isinstance(exc, (DataError, *PERMANENT)):
        return False
    chain = [err for err in (exc, exc.__cause__) if err is not None]
    for err in chain:  # an HTTP status decides when there is one
        status = _http_status(err)
        if status is not None:
            return status >= 500 or status in TRANSIENT_STATUS
    for err in chain:
        if isinstance(err, (ConnectionError, TimeoutError)):
            return True
        if any(cls.__name__ in TRANSIENT_NAMES for cls in type(err).__mro__):
            return True
        if isinstance(err, OSError) and err.errno in TRANSIENT_ERRNOS:
            return True
    return False


class Attempts:
    """Consecutive failures of one operation (reading from one position, opening one file).

    Args:
        policy: The retry policy.
        sleep: The wait function (tests pass a recorder).

    Example:
        >>> attempts = Attempts(Retry(retries=1, backoff=0))
        >>> attempts.failed(ConnectionResetError("reset"), "s3://b/a.jsonl: read")  # waits, returns
        >>> attempts.failed(ConnectionResetError("reset"), "s3://b/a.jsonl: read")
        Traceback (most recent call last):
        ...
        padpipe.errors.DataError: s3://b/a.jsonl: read: gave up after 2 attempts in 0.0 s (retries=1); last error: ConnectionResetError: reset; if the store is only busy, allow more with retries=pp.Retry(retries=..., max_seconds=...).
    """  # noqa: E501

    def __init__(self, policy: Retry, *, sleep: Callable[[float], None] = time.sleep) -> None:
        self.policy = policy
        self._sleep = sleep
        self._count = 0
        self._first = 0.0

    @property
    def count(self) -> int:
        """Failures since the last success."""
        return self._count

    def failed(self, exc: BaseException, what: str) -> None:
        """Record a transient failure of ``what``: wait before the next attempt, or raise ``DataError``."""
        now = time.monotonic()
        if self._count == 0:
            self._first = now
        self._count += 1
        delay = self.policy.wait(self._count)
        if self._count > self.policy.retries or now + delay - self._first > self.policy.max_seconds:
            count, self._count = self._count, 0
            raise DataError(
                f"{what}: gave up after {count} attempts in {now - self._first:.1f} s "
                f"(retries={self.policy.retries}); last error: {type(exc).__name__}: {one_line(exc)}; "
                f"{GIVE_UP_FIX}"
            ) from exc
        self._sleep(delay)

    def succeeded(self) -> None:
        """Forget the failures: the next one starts a fresh count."""
        self._count = 0


def call(
    policy: Retry, what: str, fn: Callable[..., T], *args: object, on_retry: Callable[[], None] | None = None
) -> T:
    """``fn(*args)``, retried on transient errors; ``what`` names the file and step in the final error.

    Args:
        policy: The retry policy.
        what: The file and step, for the error message.
        fn: The operation.
        *args: Its arguments.
        on_retry: Called before each retry (to count retries in stats).

    Example:
        >>> call(Retry(retries=0), "a.parquet: read the footer", int, "7")
        7
    """
    attempts = Attempts(policy)
    while True:
        try:
            return fn(*args)
        except PermissionError as exc:
            raise denied(what, exc) from exc
        except Exception as exc:
            if not is_transient(exc):
                raise
            attempts.failed(exc, what)
            if on_retry is not None:
                on_retry()


def denied(what: str, exc: BaseException) -> DataError:
    """The error for a read the store refused (``PermissionError``, an HTTP 403): permanent, never retried.

    Example:
        >>> print(denied("s3://b/a.parquet: read the footer", PermissionError("Access Denied")))
        s3://b/a.parquet: read the footer: access denied (PermissionError: Access Denied); check the credentials (storage_options) and the file's permissions.
    """  # noqa: E501
    return DataError(f"{what}: access denied ({type(exc).__name__}: {one_line(exc)}); {DENIED_FIX}")


def one_line(exc: BaseException) -> str:
    """``str(exc)`` on one line, without a final period: a storage client's message may span several lines.

    Example:
        >>> one_line(OSError("Please reduce\\n  your request rate."))
        'Please reduce your request rate'
    """
    return " ".join(str(exc).split()).rstrip(".")


def _http_status(err: BaseException) -> int | None:
    """The HTTP status an error carries (aiohttp ``status``, requests/httpx ``response``, botocore dict)."""
    for value in (getattr(err, "status", None), getattr(err, "status_code", None)):
        if isinstance(value, int):
            return value
    response = getattr(err, "response", None)
    if isinstance(response, dict):  # botocore ClientError
        value = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return value if isinstance(value, int) else None
    value = getattr(response, "status_code", None)
    return value if isinstance(value, int) else None
