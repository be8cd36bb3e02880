"""A local S3 server for tests and benchmarks: moto's server mode on 127.0.0.1, counting the requests it serves.

:class:`LocalS3` starts ``moto.server.ThreadedMotoServer`` on a free loopback port in a thread of
this process, sets the fake credentials boto needs (no network, no metadata service) and stops it
on exit. Every request is counted by kind at the server, so the requests of DataLoader worker
processes are counted too: ``list`` (a GET on a bucket: one page of ListObjects), ``get`` (a GET of
an object or a range of it), ``head`` and ``put``. Needs ``moto[server]`` and ``s3fs`` (the dev extras).

Example:
    >>> with LocalS3() as s3:  # doctest: +SKIP
    ...     s3.fs.pipe("bucket/a.jsonl", b'{"x": 1}\\n')
    ...     pp.read_jsonl("s3://bucket/", storage_options=s3.options)
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import urllib.request
from typing import Any

import moto.moto_server.threaded_moto_server as moto_threaded
import s3fs
from moto.core import DEFAULT_ACCOUNT_ID
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
from moto.s3.models import s3_backends
from werkzeug.serving import make_server

ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
    "NO_PROXY": "127.0.0.1",
}


class LocalS3:
    """A moto S3 server on ``127.0.0.1`` (free port) with a bucket, for ``with``; see the module docs.

    Args:
        bucket: The bucket made on start.

    Attributes:
        endpoint: ``http://127.0.0.1:<port>``.
        options: ``storage_options`` for padpipe's readers (and ``s3fs.S3FileSystem``).
        fs: An ``s3fs.S3FileSystem`` on the server, to write objects with.
        counts: Requests served so far, by kind (``list``, ``get``, ``head``, ``put``, ``other``).
    """

    def __init__(self, bucket: str = "bucket") -> None:
        self.bucket = bucket
        self.counts: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()
        self._saved_env: dict[str, str | None] = {}
        self._server: Any = None

    def __enter__(self) -> LocalS3:
        for name, value in {**ENV, "AWS_PROFILE": None}.items():
            self._saved_env[name] = os.environ.get(name)
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        logging.getLogger("werkzeug").setLevel(logging.ERROR)
        self._server = _CountingServer(self._count, ip_address="127.0.0.1", port=0, verbose=False)
        self._server.start()
        host, port = self._server.get_host_and_port()
        self.endpoint = f"http://{host}:{port}"
        self.options = {"key": "testing", "secret": "testing", "client_kwargs": {"endpoint_url": self.endpoint}}
        self.fs = s3fs.S3FileSystem(**self.options)
        self.fs.mkdir(self.bucket)
        return self

    def __exit__(self, *exc: Any) -> None:
        reset_moto(self.endpoint)  # moto's backend is one per process: leave no bucket to the next server
        self._server.stop()
        for name, value in self._saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value

    def put_many(self, objects: dict[str, bytes]) -> None:
        """Store ``{"bucket/key": bytes}`` straight into the server's backend (thousands a second; no HTTP).

        What the server then serves is what an S3 PUT would have stored (size, ETag, modification time).
        """
        backend = s3_backends[DEFAULT_ACCOUNT_ID]["aws"]
        for path, data in objects.items():
            bucket, key = path.split("/", 1)
            backend.put_object(bucket, key, data)

    def requests(self) -> dict[str, int]:
        """A copy of :attr:`counts`."""
        with self._lock:
            return dict(self.counts)

    def _count(self, environ: dict[str, Any]) -> None:
        method, path = environ.get("REQUEST_METHOD", ""), environ.get("PATH_INFO", "").strip("/")
        key_given = "/" in path
        kind = {"GET": "get" if key_given else "list", "HEAD": "head", "PUT": "put"}.get(method, "other")
        with self._lock:
            self.counts[kind] += 1


class _CountingServer(moto_threaded.ThreadedMotoServer):
    """moto's threaded server with a WSGI wrapper that counts each request before moto serves it."""

    def __init__(self, count: Any, **options: Any) -> None:
        super().__init__(**options)
        self._count = count

    def _server_entry(self) -> None:
        app = DomainDispatcherApplication(create_backend_app)

        def counted(environ: dict[str, Any], start_response: Any) -> Any:
            self._count(environ)
            return app(environ, start_response)

        self._server = make_server(self._ip_address, self._port, counted, True, request_handler=MotoRequestHandler)
        self._server_ready_event.set()
        self._server.serve_forever()


def reset_moto(endpoint: str) -> None:
    """Empty moto's in-process backend (shared by every moto server of this process) through ``endpoint``."""
    request = urllib.request.Request(f"{endpoint}/moto-api/reset", method="POST")
    with urllib.request.urlopen(request, timeout=30):
        pass
