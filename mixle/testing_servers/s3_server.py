"""The S3 test server: moto on 127.0.0.1 behind a middleware that counts and botches requests.

Needs ``pip install "moto[server]"`` (and boto3 for :meth:`MotoS3Server.client`).
"""

from __future__ import annotations

import os
import re
import urllib.request
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from mixle.testing_servers.faults import _RANGE, ERROR_PAGE, FaultPlan
from mixle.testing_servers.http_server import _Serving

__all__ = ["MotoS3Server"]

#: The total size in a served ``Content-Range`` (``bytes a-b/total``).
_SERVED = re.compile(r"^bytes \d+-\d+/(\d+)$")


class MotoS3Server(_Serving):
    """A moto S3 server on 127.0.0.1 (``pip install "moto[server]"``), counting requests.

    Parameters
    ----------
    faults
        Counts requests and injects failures (``503 SlowDown``; drops answer ``503`` too).

    Notes
    -----
    moto keeps buckets in process-wide state; :meth:`stop` resets it.
    """

    #: Credentials the test server accepts (any value works; these are not secrets).
    KEY = "mixle-test-key"
    SECRET = "mixle-test-secret"

    def __init__(self, faults: FaultPlan | None = None) -> None:
        self.faults = FaultPlan() if faults is None else faults

    @property
    def endpoint_url(self) -> str:
        """Where S3 clients connect, such as ``http://127.0.0.1:43124``."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def requests(self) -> int:
        """Requests received since the last ``faults.reset()``."""
        return self.faults.requests

    def storage_options(self, **extra: Any) -> dict[str, Any]:
        """fsspec ``storage_options`` for ``s3://`` URLs served here (s3fs)."""
        options: dict[str, Any] = {
            "key": self.KEY,
            "secret": self.SECRET,
            "client_kwargs": {"endpoint_url": self.endpoint_url, "region_name": "us-east-1"},
        }
        options.update(extra)
        return options

    def client(self) -> Any:
        """A boto3 S3 client for this server (to create buckets and upload)."""
        import boto3  # type: ignore[import-untyped]

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id=self.KEY,
            aws_secret_access_key=self.SECRET,
            region_name="us-east-1",
        )

    def upload(self, folder: str | os.PathLike[str], bucket: str, prefix: str = "") -> str:
        """Create ``bucket`` (if needed) and upload every file below ``folder``; the URL."""
        client = self.client()
        existing = {b["Name"] for b in client.list_buckets().get("Buckets", [])}
        if bucket not in existing:
            client.create_bucket(Bucket=bucket)
        root = Path(folder)
        for file in sorted(p for p in root.rglob("*") if p.is_file()):
            key = "/".join(filter(None, [prefix.strip("/"), file.relative_to(root).as_posix()]))
            client.put_object(Bucket=bucket, Key=key, Body=file.read_bytes())
        client.close()
        return f"s3://{bucket}/{prefix.strip('/')}".rstrip("/")

    def start(self) -> MotoS3Server:
        """Start serving in a background thread."""
        from moto.server import DomainDispatcherApplication, create_backend_app
        from werkzeug.serving import WSGIRequestHandler, make_server

        class Quiet(WSGIRequestHandler):
            def log(self, type: str, message: str, *args: Any) -> None:
                pass

        app = _FaultyApp(DomainDispatcherApplication(create_backend_app), self.faults)
        self._serve(make_server("127.0.0.1", 0, app, threaded=True, request_handler=Quiet))
        return self

    def stop(self) -> None:
        """Reset moto's state and stop serving."""
        if self._thread is not None:
            request = urllib.request.Request(f"{self.endpoint_url}/moto-api/reset", method="POST")
            with urllib.request.urlopen(request, timeout=10):
                pass
        self._halt()

    def __enter__(self) -> MotoS3Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class _FaultyApp:
    """WSGI middleware: count requests, fail some with ``503 SlowDown``, botch ranges."""

    def __init__(self, app: Callable[..., Iterable[bytes]], faults: FaultPlan) -> None:
        self._app, self._faults = app, faults

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        path = environ.get("PATH_INFO", "")
        if path.startswith("/moto-api"):
            return self._app(environ, start_response)
        action = self._faults.record(
            environ.get("REQUEST_METHOD", ""), path, environ.get("HTTP_RANGE", "")
        )
        try:
            if action is not None:
                body = b"<Error><Code>InternalError</Code><Message>injected</Message></Error>"
                start_response(
                    f"{self._faults.fail_status} Injected",
                    [("Content-Type", "application/xml"), ("Content-Length", str(len(body)))],
                )
                return [body]
            spec = environ.get("HTTP_RANGE", "")
            get = environ.get("REQUEST_METHOD") == "GET"
            fault = self._faults.range_action(path, spec) if spec and get else None
            if fault is None:
                return self._app(environ, start_response)
            return self._botch(fault, spec, environ, start_response)
        finally:
            self._faults.finished()

    def _botch(
        self, fault: str, spec: str, environ: dict[str, Any], start_response: Callable[..., Any]
    ) -> Any:
        """Answer one ranged GET wrongly, as :class:`FaultPlan` ``range_fault`` says."""
        if fault == "html":
            start_response(
                "200 OK", [("Content-Type", "text/html"), ("Content-Length", str(len(ERROR_PAGE)))]
            )
            return [ERROR_PAGE]
        environ = dict(environ)
        match = _RANGE.match(spec.strip())
        if fault == "whole" or match is None:
            environ.pop("HTTP_RANGE", None)  # moto then sends the whole object with 200
            return self._app(environ, start_response)
        first, last = match.groups()
        by = self._faults.shift
        if fault == "shift":  # a suffix grows by ``by`` bytes: it starts that much earlier
            if first == "":
                environ["HTTP_RANGE"] = f"bytes=-{int(last) + by}"
            else:
                after = "" if last == "" else str(int(last) + by)
                environ["HTTP_RANGE"] = f"bytes={int(first) + by}-{after}"
            return self._app(environ, start_response)
        # truncate: half the range under a Content-Range that claims all of it
        if first != "" and last == "":  # "bytes=a-": moto's own answer, its body cut in half
            return self._halved(environ, start_response)
        if first == "":
            environ["HTTP_RANGE"] = f"bytes=-{max(1, int(last) // 2)}"
        else:
            environ["HTTP_RANGE"] = f"bytes={first}-{int(first) + (int(last) - int(first)) // 2}"

        def claim(status: str, headers: list[tuple[str, str]], *args: Any) -> Any:
            fixed = []
            for name, value in headers:
                served = _SERVED.match(value) if name.lower() == "content-range" else None
                if served is not None:
                    total = int(served.group(1))
                    a = total - int(last) if first == "" else int(first)
                    b = total - 1 if first == "" or last == "" else int(last)
                    value = f"bytes {max(0, a)}-{min(b, total - 1)}/{total}"
                fixed.append((name, value))
            return start_response(status, fixed, *args)

        return self._app(environ, claim)

    def _halved(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        """moto's answer with the first half of its body, its headers (but the length) kept."""
        answer: list[Any] = []

        def keep(status: str, headers: list[tuple[str, str]], *args: Any) -> Any:
            answer[:] = [status, headers]
            return lambda data: None

        served = self._app(environ, keep)
        try:
            body = b"".join(served)
        finally:
            if hasattr(served, "close"):
                served.close()
        half = body[: len(body) // 2]
        status, headers = answer
        length = str(len(half))
        start_response(
            status, [(n, length if n.lower() == "content-length" else v) for n, v in headers]
        )
        return [half]
