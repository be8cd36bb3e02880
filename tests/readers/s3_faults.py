"""A fault-injecting HTTP proxy in front of a local S3 server: real faults on the wire, on 127.0.0.1 only.

:class:`FaultProxy` forwards every request to the server and answers with its response, except
where its plan says otherwise for an object read (a ``GET`` with a ``Range`` header):

* ``"slowdown"``: a ``503 SlowDown`` error, as S3 sends when a prefix is read too fast;
* ``"drop"``: the server's status and headers (the full ``Content-Length``), half of the body,
  then the connection closed, as a connection lost mid-object;
* ``"deny"``: a ``403 AccessDenied`` error (a permanent failure).

Example:
    >>> plan = Plan({("a.parquet", 1): "slowdown", ("a.parquet", 2): "drop"})
    >>> [plan("GET", "/bucket/a.parquet", "bytes=0-99") for _ in range(4)], plan.reads
    (['pass', 'slowdown', 'drop', 'pass'], {'a.parquet': 4})
"""

from __future__ import annotations

import http.client
import socket
import threading
from collections.abc import Callable, Collection
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

ERROR = (
    '<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code><Message>{message}</Message>'
    "<Resource>{path}</Resource><RequestId>fault-proxy</RequestId></Error>"
)
ERRORS = {
    "slowdown": (503, "SlowDown", "Please reduce your request rate."),
    "deny": (403, "AccessDenied", "Access Denied"),
}
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "proxy-connection"}


class Plan:
    """Which object reads fail, and how: the ``n``-th read of a file (0-based), or every read of some files.

    Args:
        faults: ``{(object name, n): action}``: the ``n``-th read of that object (the end of its
            path) is answered with ``action`` (``"slowdown"`` or ``"drop"``).
        deny: Objects every read of which is answered ``403 AccessDenied``.
        always: Objects every read of which is answered ``503 SlowDown``.

    A plan counts each object's reads (``reads``) and records the faults it sent (``injected``).
    """

    def __init__(
        self,
        faults: dict[tuple[str, int], str] | None = None,
        *,
        deny: Collection[str] = (),
        always: Collection[str] = (),
    ) -> None:
        self.faults, self.deny, self.always = dict(faults or {}), set(deny), set(always)
        self.reads: dict[str, int] = {}
        self.injected: list[tuple[str, str, str]] = []  # (action, object, range) of each fault sent
        self._lock = threading.Lock()

    def __call__(self, method: str, path: str, byte_range: str | None) -> str:
        if method != "GET" or byte_range is None:
            return "pass"
        name = path.split("?")[0].rsplit("/", 1)[-1]
        with self._lock:
            n = self.reads.get(name, 0)
            self.reads[name] = n + 1
            if name in self.deny:
                action = "deny"
            elif name in self.always:
                action = "slowdown"
            else:
                action = self.faults.get((name, n), "pass")
            if action != "pass":
                self.injected.append((action, name, byte_range))
        return action


class FaultProxy:
    """A threaded HTTP proxy on 127.0.0.1 in front of ``upstream``, failing the reads ``plan`` picks.

    Args:
        upstream: The S3 server, ``http://127.0.0.1:PORT``.
        plan: ``(method, path, range header or None) -> "pass" | "slowdown" | "drop" | "deny"``.

    Use as a context manager; ``endpoint`` is the URL to give the S3 client.
    """

    def __init__(self, upstream: str, plan: Callable[[str, str, str | None], str]) -> None:
        target = urlsplit(upstream)
        if target.hostname != "127.0.0.1":
            raise ValueError(f"`upstream` must be on 127.0.0.1, but is {upstream!r} instead.")
        self.plan = plan
        host, port = target.hostname, target.port or 80

        class Handler(_Forward):
            upstream_address = (host, port)
            decide = staticmethod(plan)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        """The proxy's URL."""
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> FaultProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)


class _Forward(BaseHTTPRequestHandler):
    """Forward one request (keep-alive, HTTP/1.1) or answer it with the fault the plan picks."""

    protocol_version = "HTTP/1.1"
    upstream_address: tuple[str, int]
    decide: Callable[[str, str, str | None], str]

    def log_message(self, format: str, *args: object) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        self._handle()

    do_HEAD = do_PUT = do_POST = do_DELETE = do_GET

    def _handle(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        action = self.decide(self.command, self.path, self.headers.get("Range"))
        if action in ERRORS:
            status, code, message = ERRORS[action]
            self._send(
                status,
                [("Content-Type", "application/xml")],
                ERROR.format(code=code, message=message, path=self.path).encode(),
            )
            return
        connection = http.client.HTTPConnection(*self.upstream_address, timeout=30)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
            connection.request(self.command, self.path, body=body, headers=headers)
            response = connection.getresponse()
            data = response.read()
            kept = [(k, v) for k, v in response.getheaders() if k.lower() not in HOP_BY_HOP]
            size = int(response.getheader("Content-Length") or len(data))  # a HEAD's is the object's size
        finally:
            connection.close()
        if action == "drop" and len(data) >= 2:
            self._send(response.status, kept, data[: len(data) // 2], length=size)
            self.connection.shutdown(socket.SHUT_RDWR)  # the rest never comes
            self.close_connection = True
            return
        self._send(response.status, kept, data, length=size)

    def _send(self, status: int, headers: list[tuple[str, str]], data: bytes, *, length: int | None = None) -> None:
        self.send_response_only(status)
        for key, value in headers:
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(data) if length is None else length))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)
        self.wfile.flush()
