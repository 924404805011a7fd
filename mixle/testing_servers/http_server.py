"""The HTTP test server: files under a folder on 127.0.0.1, honouring ``Range`` requests.

:class:`RangeHTTPServer` counts and botches requests as its
:class:`~mixle.testing_servers.faults.FaultPlan` says; the start/stop plumbing here
(``_Serving``) is shared with :class:`~mixle.testing_servers.s3_server.MotoS3Server`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from mixle.testing_servers.faults import _RANGE, ERROR_PAGE, FaultPlan, shifted

__all__ = ["RangeHTTPServer"]


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
