"""Servers on 127.0.0.1 for testing remote reads: HTTP with Range requests, and S3 (moto).

Both count the requests they answer and can fail on purpose (every k-th request a 503 or
a dropped connection), and can answer byte-range requests wrongly the way misbehaving
servers and proxies do (a shifted range, a truncated body, an HTML error page served with
``200``, the whole object instead of the range), so a pipeline's behaviour against flaky
object stores can be tested without a network:

    with RangeHTTPServer(folder) as server:
        src = mixle.read_zarr(f"{server.url}/volume.zarr")
        ...
        print(server.requests, "requests")

Both are context managers that stop cleanly (their threads joined, sockets closed).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import socket
import sys
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

__all__ = ["ERROR_PAGE", "FaultPlan", "MotoS3Server", "RangeHTTPServer", "shifted"]

_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")
#: The total size in a served ``Content-Range`` (``bytes a-b/total``).
_SERVED = re.compile(r"^bytes \d+-\d+/(\d+)$")


class FaultPlan:
    """Counts requests and decides which ones fail: thread-safe.

    Parameters
    ----------
    fail_every
        Every ``fail_every``-th request (1-based) gets ``fail_status`` (0: never).
    drop_every
        Every ``drop_every``-th request has its connection closed with no answer (0: never).
    fail_status
        The HTTP status of failed requests (a 5xx by default).
    delay
        Seconds each served request is held before it is answered (a slow store), so
        that :attr:`peak_inflight` shows how many requests a client keeps in flight.
    range_fault
        How ranged ``GET`` requests are answered wrongly (``None``: never):
        ``"shift"`` serves the range ``shift`` bytes later (earlier where it would pass the
        end) with an honest ``Content-Range``; ``"truncate"`` sends half the body under a
        ``Content-Range`` claiming all of it (a matching ``Content-Length``); ``"html"``
        answers ``200`` with an HTML error page; ``"whole"`` ignores ``Range`` and sends the
        whole object with ``200``.
    range_rate
        Fraction of ranged ``GET`` requests that get ``range_fault`` (``1.0``: all; ``0.25``:
        every fourth, counted, not drawn at random).
    range_once
        Answer each distinct request (path and ``Range``) wrongly at most once: its retry
        gets the right bytes, whatever the timing of other requests.
    shift
        Bytes a ``"shift"`` moves the range by.
    unranged
        Answer ``GET`` requests without ``Range`` with the ``"html"`` fault too (a whole
        object fetched as a plain ``GET``); the other faults only apply to ranges.
    stall
        How matching ``GET`` requests stall (``None``: never): ``"headers"`` holds the
        request before anything is sent; ``"body"`` sends the headers and half the body,
        then holds. A held request waits ``stall_for`` seconds or until :meth:`release`
        (or the server stops), then finishes its answer.
    stall_match
        Only ``GET`` requests whose path contains this text stall (``""``: every one).
    stall_for
        Seconds a stalled request is held at most.
    stall_once
        Stall each distinct request (path and ``Range``) at most once: its retry is served,
        whatever the timing of other requests.
    """

    RANGE_FAULTS = ("shift", "truncate", "html", "whole")
    STALLS = ("headers", "body")

    def __init__(
        self,
        fail_every: int = 0,
        drop_every: int = 0,
        fail_status: int = 503,
        delay: float = 0.0,
        range_fault: str | None = None,
        range_rate: float = 1.0,
        range_once: bool = False,
        shift: int = 4,
        unranged: bool = False,
        stall: str | None = None,
        stall_match: str = "",
        stall_for: float = 60.0,
        stall_once: bool = False,
    ) -> None:
        if stall is not None and stall not in self.STALLS:
            raise ValueError(f"stall={stall!r} must be one of {self.STALLS} or None")
        self._lock = threading.Lock()
        self.stall, self.stall_match, self.stall_for = stall, stall_match, stall_for
        self.stall_once = stall_once
        self.stalled = 0
        self._stalled_seen: set[tuple[str, str]] = set()
        self._released = threading.Event()
        self.fail_every, self.drop_every, self.fail_status = fail_every, drop_every, fail_status
        self.delay = delay
        self.dead = False
        self.range_fault, self.range_rate, self.range_once = range_fault, range_rate, range_once
        self.shift, self.unranged = shift, unranged
        self.range_faults = 0
        self._ranged = 0
        self._seen: set[tuple[str, str]] = set()
        self._count = 0
        self._inflight = 0
        self.peak_inflight = 0
        self.by_path: Counter[str] = Counter()
        self.log: list[tuple[str, str, str]] = []

    def record(self, method: str, path: str, byte_range: str) -> str | None:
        """Count one request; returns ``"fail"``, ``"drop"`` or ``None`` (serve it).

        Every call must be followed by :meth:`finished` once the request is answered.
        """
        with self._lock:
            self._count += 1
            n = self._count
            self._inflight += 1
            self.peak_inflight = max(self.peak_inflight, self._inflight)
            self.by_path[path] += 1
            self.log.append((method, path, byte_range))
        if self.dead:
            return "drop"
        if self.drop_every and n % self.drop_every == 0:
            return "drop"
        if self.fail_every and n % self.fail_every == 0:
            return "fail"
        if self.delay > 0:
            time.sleep(self.delay)
        return None

    def range_action(self, path: str, byte_range: str) -> str | None:
        """For one ranged ``GET``: the fault to answer it with, or ``None`` (serve it right)."""
        fault = self.range_fault
        if fault is None:
            return None
        if fault not in self.RANGE_FAULTS:
            raise ValueError(f"range_fault={fault!r} must be one of {self.RANGE_FAULTS} or None")
        with self._lock:
            self._ranged += 1
            n = self._ranged
            hit = int(n * self.range_rate) > int((n - 1) * self.range_rate)
            if self.range_once:
                first = (path, byte_range) not in self._seen
                self._seen.add((path, byte_range))
                hit = hit and first
            if hit:
                self.range_faults += 1
        return fault if hit else None

    def stall_action(self, method: str, path: str, byte_range: str = "") -> str | None:
        """For one request: ``"headers"``, ``"body"`` (stall there) or ``None``."""
        if self.stall is None or method != "GET" or self.stall_match not in path:
            return None
        with self._lock:
            if self.stall_once:
                if (path, byte_range) in self._stalled_seen:
                    return None
                self._stalled_seen.add((path, byte_range))
            self.stalled += 1
        return self.stall

    def hold(self) -> None:
        """Hold a stalled request: ``stall_for`` seconds or until :meth:`release`."""
        self._released.wait(self.stall_for)

    def release(self) -> None:
        """Let every held request (and every later stalled one) finish at once."""
        self._released.set()

    def finished(self) -> None:
        """One request recorded by :meth:`record` was answered (or dropped)."""
        with self._lock:
            self._inflight -= 1

    @property
    def requests(self) -> int:
        """Requests answered (or failed on purpose) since the last :meth:`reset`."""
        return self._count

    def reset(self) -> None:
        """Zero the counters (fault settings stay)."""
        with self._lock:
            self._count = 0
            self.peak_inflight = self._inflight
            self.by_path.clear()
            self.log.clear()
            self.range_faults = 0
            self._ranged = 0
            self._seen.clear()
            self._stalled_seen.clear()


class _ClosingServer(ThreadingHTTPServer):
    """A threaded server that, on close, ends its open keep-alive connections too."""

    daemon_threads = True
    block_on_close = True
    # a batch opens dozens of connections at once: with the default backlog of 5, loopback
    # drops SYNs and the client waits a second for the retransmit (a connect timeout)
    request_queue_size = 256

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.open_sockets: set[socket.socket] = set()
        self.sockets_lock = threading.Lock()
        super().__init__(*args, **kwargs)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self.sockets_lock:
            self.open_sockets.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self.sockets_lock:
            self.open_sockets.discard(request)
        super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Report a failed request, except a client that hung up (a cancelled request)."""
        error = sys.exc_info()[1]
        gone = isinstance(error, OSError) and error.errno == errno.ENOTCONN  # hung up first
        if isinstance(error, ConnectionError) or gone:
            return
        super().handle_error(request, client_address)

    def end_connections(self) -> None:
        with self.sockets_lock:
            sockets = list(self.open_sockets)
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


class _Serving:
    """Start/stop plumbing shared by the two servers."""

    _server: Any
    _thread: threading.Thread | None = None

    def _serve(self, server: Any) -> None:
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    def _halt(self) -> None:
        if self._thread is None:
            return
        self._server.shutdown()
        if hasattr(self._server, "end_connections"):
            self._server.end_connections()
        self._server.server_close()
        self._thread.join()
        self._thread = None

    @property
    def port(self) -> int:
        """The port the server listens on (127.0.0.1)."""
        return int(self._server.server_address[1])


class RangeHTTPServer(_Serving):
    """Serve files under ``root`` over HTTP/1.1 on 127.0.0.1, honouring ``Range`` requests.

    Single ranges (``bytes=a-b``, ``bytes=a-``) and suffix ranges (``bytes=-n``) get a
    ``206``; unsatisfiable ones a ``416``; missing files a ``404``. ``faults`` (a
    :class:`FaultPlan`, by default one that never fails) counts every request.

    Parameters
    ----------
    root
        Folder whose files are served (``http://127.0.0.1:port/<relative path>``).
    faults
        Counts requests and injects failures; change its attributes while serving.
    """

    def __init__(self, root: str | os.PathLike[str], faults: FaultPlan | None = None) -> None:
        self.root = Path(root).resolve()
        self.faults = FaultPlan() if faults is None else faults

    @property
    def url(self) -> str:
        """Base URL, such as ``http://127.0.0.1:43123``."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def requests(self) -> int:
        """Requests received since the last ``faults.reset()``."""
        return self.faults.requests

    def start(self) -> RangeHTTPServer:
        """Start serving in a background thread."""
        handler = type("Handler", (_RangeHandler,), {"root": self.root, "faults": self.faults})
        self._serve(_ClosingServer(("127.0.0.1", 0), handler))
        return self

    def stop(self) -> None:
        """Stop serving, end open connections and join the threads."""
        self.faults.release()
        self._halt()

    def __enter__(self) -> RangeHTTPServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


#: What a ``"html"`` range fault answers with ``200``: an error page, as proxies send.
ERROR_PAGE = (
    b"<!DOCTYPE html><html><head><title>503 Service Unavailable</title></head><body>"
    b"<h1>Service Unavailable</h1><p>The server is temporarily unable to service your "
    b"request. Please try again later.</p></body></html>\n"
)


def shifted(start: int, end: int, size: int, by: int) -> tuple[int, int]:
    """``[start, end)`` moved ``by`` bytes later, or earlier where later passes ``size``."""
    if end + by <= size:
        return start + by, end + by
    step = min(by, start) or 1  # a range that fills the object moves by one byte at least
    return (start - step, end - step) if start >= step else (start + step, min(size, end + step))


class _RangeHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # headers and body go out in separate writes: with Nagle's algorithm the body waits for
    # the client's delayed ACK of the headers, 40 ms per request on loopback
    disable_nagle_algorithm = True
    root: Path
    faults: FaultPlan

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def do_GET(self) -> None:
        self._answer(body=True)

    def _answer(self, body: bool) -> None:
        path = self.path.split("?", 1)[0]
        action = self.faults.record(self.command, path, self.headers.get("Range", ""))
        self._stall = self.faults.stall_action(self.command, path, self.headers.get("Range", ""))
        if self._stall == "headers":
            self.faults.hold()
        try:
            self._serve_file(path, action, body)
        finally:
            self.faults.finished()

    def _serve_file(self, path: str, action: str | None, body: bool) -> None:
        if action == "drop":
            self.close_connection = True
            with contextlib.suppress(OSError):  # the client may have hung up already
                self.connection.shutdown(socket.SHUT_RDWR)
            return
        if action == "fail":
            return self._plain(self.faults.fail_status, b"injected failure", body)
        file = (self.root / path.lstrip("/")).resolve()
        if not file.is_relative_to(self.root) or not file.is_file():
            return self._plain(404, b"not found", body)
        data = file.read_bytes()
        size = len(data)
        spec = self.headers.get("Range")
        if spec is None:
            plain = self.command == "GET" and self.faults.unranged
            if plain and self.faults.range_fault == "html" and self.faults.range_action(path, ""):
                return self._send(200, ERROR_PAGE, {"Content-Type": "text/html"}, body)
            return self._send(200, data, {"Accept-Ranges": "bytes"}, body)
        match = _RANGE.match(spec.strip())
        if match is None or match.group(1) == match.group(2) == "":
            return self._plain(416, b"bad range", body)
        first, last = match.groups()
        if first == "":  # suffix: the last n bytes
            start, end = max(0, size - int(last)), size
        else:
            start, end = int(first), size if last == "" else min(size, int(last) + 1)
        if start >= size or start >= end:
            return self._send(416, b"", {"Content-Range": f"bytes */{size}"}, body)
        fault = self.faults.range_action(path, spec) if self.command == "GET" else None
        if fault == "html":
            return self._send(200, ERROR_PAGE, {"Content-Type": "text/html"}, body)
        if fault == "whole":
            return self._send(200, data, {"Accept-Ranges": "bytes"}, body)
        claimed = (start, end)
        if fault == "shift":
            start, end = shifted(start, end, size, self.faults.shift)
            claimed = (start, end)
        elif fault == "truncate":
            end = start + (end - start) // 2
        headers = {
            "Content-Range": f"bytes {claimed[0]}-{claimed[1] - 1}/{size}",
            "Accept-Ranges": "bytes",
        }
        self._send(206, data[start:end], headers, body)

    def _plain(self, status: int, text: bytes, body: bool) -> None:
        self._send(status, text, {"Content-Type": "text/plain"}, body)

    def _send(self, status: int, data: bytes, headers: dict[str, str], body: bool) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if not body:
            return
        if getattr(self, "_stall", None) == "body" and len(data) > 1:
            self.wfile.write(data[: len(data) // 2])
            self.wfile.flush()
            self.faults.hold()
            data = data[len(data) // 2 :]
        self.wfile.write(data)


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
