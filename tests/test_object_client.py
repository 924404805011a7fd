"""The obstore client (mixle.reading.object_client): storage_options mapped, every answer
checked before use, servers that ignore Range, limits, retries, secrets, fork safety.

Objects are served by a Range-honouring HTTP server and a moto S3 server on 127.0.0.1;
what the client returns is compared with the bytes of the file served."""

from __future__ import annotations

import asyncio
import os
import pickle
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("obstore")

from mixle.reading import RemoteReadError, ranges, set_retry_policy
from mixle.reading.faults import CorruptChunkError, RangeMismatchError, is_transient
from mixle.reading.object_client import (
    ObjectClient,
    ObstoreUnsupported,
    check_backend,
    choose_client,
)
from mixle.testing_servers import MotoS3Server, RangeHTTPServer
from mixle.utils.redact import is_safe_error

DATA = bytes(range(256)) * 400  # 102,400 bytes, every range distinct enough


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("objects")
    (root / "d").mkdir()
    (root / "d" / "obj").write_bytes(DATA)
    (root / "d" / "empty").write_bytes(b"")
    return root


@pytest.fixture(scope="module")
def http(folder: Path) -> Iterator[RangeHTTPServer]:
    with RangeHTTPServer(folder) as server:
        yield server


@pytest.fixture(scope="module")
def s3(folder: Path) -> Iterator[MotoS3Server]:
    with MotoS3Server() as server:
        server.upload(folder, "objects")
        yield server


@pytest.fixture(autouse=True)
def quick_retries() -> Iterator[None]:
    old = set_retry_policy(attempts=3, base_delay=0.001, max_delay=0.002)
    yield
    set_retry_policy(
        attempts=old.attempts,
        base_delay=old.base_delay,
        max_delay=old.max_delay,
        timeout=old.timeout,
        deadline=old.deadline,
    )


def clients(http: RangeHTTPServer, s3: MotoS3Server) -> list[tuple[Any, ObjectClient]]:
    one = choose_client(f"{http.url}/d", None)
    two = choose_client("s3://objects/d", s3.storage_options())
    assert one is not None and two is not None
    return [(http, one), (s3, two)]


SPANS = [(10, 50), (0, None), (-16, None), (102_390, 102_500), (5, None), (7, 7)]


def expected(span: tuple[int, int | None]) -> bytes:
    start, end = span
    return DATA[start:] if end is None else DATA[start:end]


@pytest.mark.parametrize("span", SPANS)
def test_every_span_equals_the_served_bytes_sync_and_async(http, s3, span) -> None:
    for server, client in clients(http, s3):
        server.faults.reset()
        assert client.fetch_sync("obj", span) == expected(span)
        assert asyncio.run(client.fetch("obj", span)) == expected(span)
        assert server.requests == (0 if span == (7, 7) else 2)  # one GET each, no HEAD


def test_empty_objects_and_missing_ones(http, s3) -> None:
    for _, client in clients(http, s3):
        assert client.fetch_sync("empty", (0, None)) == b""
        with pytest.raises(FileNotFoundError, match="nope: no such object"):
            client.fetch_sync("nope", (0, None))
        assert client.size_sync("obj") == len(DATA)


@pytest.mark.parametrize("fault", ["shift", "truncate"])
def test_a_wrong_range_is_a_mismatch_never_bytes(http, s3, fault) -> None:
    for server, client in clients(http, s3):
        server.faults.range_fault = fault
        try:
            with pytest.raises(RangeMismatchError) as info:
                client.fetch_sync("obj", (10, 50))
            assert is_transient(info.value)
            with pytest.raises(RemoteReadError, match=r"obj \(chunk k\) failed after 3 tries"):
                client.read("obj", (10, 50), url=f"{client.display}/obj", name="k")
            del info
        finally:
            server.faults.range_fault = None


@pytest.mark.parametrize("fault", ["html", "whole"])
def test_a_server_ignoring_range_costs_one_remembered_head(http, s3, fault) -> None:
    for server, client in clients(http, s3):
        ranges._IGNORED_RANGE_SIZES.clear()  # what an earlier test remembered
        server.faults.range_fault = fault
        server.faults.reset()
        try:
            assert client.fetch_sync("obj", (10, 50)) == DATA[10:50]
            assert client.fetch_sync("obj", (60, 90)) == DATA[60:90]
            assert asyncio.run(client.fetch("obj", (-5, None))) == DATA[-5:]
        finally:
            server.faults.range_fault = None
        # each try: the refused ranged GET, the whole GET; the size asked once
        assert server.requests == 3 * 2 + 1


def test_a_whole_answer_of_another_length_is_refused(http) -> None:
    client = choose_client(f"{http.url}/d", None)
    assert client is not None
    http.faults.range_fault = "html"
    http.faults.unranged = True  # the plain GET gets the HTML page too
    try:
        with pytest.raises(RangeMismatchError, match="ignored Range and sent"):
            client.fetch_sync("obj", (10, 50), size=len(DATA))
    finally:
        http.faults.range_fault, http.faults.unranged = None, False


def test_limits_refuse_before_the_body(http, s3) -> None:
    for _, client in clients(http, s3):
        with pytest.raises(CorruptChunkError, match="more than the 1000 bytes"):
            client.fetch_sync("obj", (0, None), limit=1000)
        assert client.fetch_sync("obj", (0, 1000), limit=1000) == DATA[:1000]


def test_transient_failures_are_retried_and_permanent_ones_are_not(http, s3) -> None:
    for server, client in clients(http, s3):
        server.faults.fail_every = 2  # every second request: 503
        server.faults.reset()
        try:
            for k in range(4):
                got = client.read("obj", (k, k + 10), url=client.display, name=str(k))
                assert got == DATA[k : k + 10]
        finally:
            server.faults.fail_every = 0
        with pytest.raises(FileNotFoundError):
            client.read("gone", (0, None), url=client.display, name="gone")


def test_drops_and_stalls_are_transient_and_bounded(http) -> None:
    client = choose_client(f"{http.url}/d", None)
    assert client is not None
    http.faults.drop_every = 1
    try:
        with pytest.raises(OSError, match="connection failed") as info:
            client.fetch_sync("obj", (0, 10))
        assert is_transient(info.value)
        del info
    finally:
        http.faults.drop_every = 0
    old = set_retry_policy(timeout=0.3, attempts=2)
    http.faults.stall, http.faults.stall_for = "headers", 5.0
    fresh = choose_client(f"{http.url}/d", None)  # a store with the new timeout
    assert fresh is not None
    try:
        with pytest.raises(RemoteReadError, match="failed after 2 tries"):
            fresh.read("obj", (0, 10), url=fresh.display, name="stall")
    finally:
        http.faults.stall = None
        http.faults.release()
        set_retry_policy(timeout=old.timeout, attempts=old.attempts)


def test_secrets_stay_out_of_messages_and_chains(s3) -> None:
    options = s3.storage_options(secret="not-the-secret-at-all")  # refused by moto? no: any
    client = choose_client("s3://objects/d", options)
    assert client is not None
    assert "not-the-secret" not in repr(client) and "mixle-test-key" not in repr(client)
    s3.faults.fail_every = 1
    try:
        with pytest.raises(RemoteReadError) as info:
            client.read("obj", (0, 10), url=client.display, name="k")
        assert is_safe_error(info.value, options)
        assert "not-the-secret" not in str(info.value)
        assert info.value.__cause__ is None
        del info
    finally:
        s3.faults.fail_every = 0


def test_storage_options_map_to_obstore_config() -> None:
    s3 = choose_client(
        "s3://bucket/prefix/x.zarr/",
        {
            "key": "AKID",
            "secret": "SECRET",
            "token": "TOKEN",
            "client_kwargs": {"endpoint_url": "http://127.0.0.1:9", "region_name": "eu-west-1"},
            "config_kwargs": {"max_pool_connections": 50, "read_timeout": 7},
            "use_listings_cache": False,
        },
    )
    assert s3 is not None and s3.kind == "S3Store" and s3.url == "s3://bucket/prefix/x.zarr"
    assert dict(s3.config) == {
        "access_key_id": "AKID",
        "secret_access_key": "SECRET",
        "session_token": "TOKEN",
        "endpoint": "http://127.0.0.1:9",
        "region": "eu-west-1",
    }
    assert s3.client_options["allow_http"] is True
    assert s3.client_options["read_timeout"].total_seconds() == 7
    anon = choose_client("s3://bucket/x", {"anon": True})
    assert anon is not None and anon.config == {"skip_signature": True}
    web = choose_client("https://host/a/b.zarr", {"headers": {"Authorization": "Bearer t"}})
    assert web is not None and web.client_options == {
        "default_headers": {"Authorization": "Bearer t"}
    }
    gcs = choose_client("gs://bucket/x.zarr", {"token": "anon"})
    assert gcs is not None and gcs.kind == "GCSStore" and gcs.config == {"skip_signature": True}
    az = choose_client("az://container/x.zarr", {"account_name": "acct", "sas_token": "sv=1"})
    assert az is not None and az.config == {"account_name": "acct", "sas_key": "sv=1"}


@pytest.mark.parametrize(
    ("url", "options", "why"),
    [
        ("s3://b/x", {"profile": "dev"}, "storage_options profile= has no obstore equivalent"),
        ("s3://b/x", {"client_kwargs": {"verify": False}}, r"client_kwargs=\{'verify'"),
        ("https://h/x?sig=1", None, "a query string"),
        ("https://h/x", {"params": {"a": "1"}}, "a query string"),
        ("memory://x", None, "the scheme 'memory' is not one obstore reads"),
        ("/local/path", None, "not a URL obstore reads"),
        ("simplecache::s3://b/x", None, "not a URL obstore reads"),
        ("https://user:pw@h/x", None, "user info in the URL"),
    ],
)
def test_what_obstore_cannot_read_falls_back_or_is_refused(url, options, why) -> None:
    assert choose_client(url, options, "auto") is None
    assert choose_client(url, options, "fsspec") is None
    with pytest.raises(ObstoreUnsupported, match=why) as info:
        choose_client(url, options, "obstore")
    assert "pw" not in str(info.value) and "sig=1" not in str(info.value)
    del info


def test_backend_values_are_checked() -> None:
    assert check_backend("fsspec") == "fsspec"
    for bad in ("rust", None, 1, "Auto"):
        with pytest.raises(ValueError, match=r"backend=.* is not one of 'auto', 'obstore'"):
            check_backend(bad)
    with pytest.raises(ValueError, match="backend='s3fs'"):
        choose_client("s3://b/x", None, "s3fs")


def test_a_client_pickles_and_reads_in_the_new_process(http) -> None:
    client = choose_client(f"{http.url}/d", {"headers": {"X-Test": "1"}})
    assert client is not None
    again = pickle.loads(pickle.dumps(client))
    assert again.url == client.url and again.client_options == client.client_options
    assert again.fetch_sync("obj", (0, 8)) == DATA[:8]


FORK_CHILD = textwrap.dedent(
    """
    import os, sys
    from mixle.reading.object_client import choose_client, obstore_usable
    from mixle.testing_servers import RangeHTTPServer
    with RangeHTTPServer(sys.argv[1]) as http:
        before = os.fork()
        if before == 0:  # forked before obstore ran: usable in the child
            ok = False
            try:
                client = choose_client(http.url + "/d", None)
                ok = client is not None and client.fetch_sync("obj", (0, 4)) == bytes(range(4))
            finally:  # never the server's shutdown: its thread is the parent's
                os._exit(0 if ok else 3)
        assert os.waitpid(before, 0)[1] == 0
        client = choose_client(http.url + "/d", None)
        assert client.fetch_sync("obj", (0, 4)) == bytes(range(4))
        after = os.fork()
        if after == 0:  # forked after: refused, never a hang
            ok = False
            try:
                usable = obstore_usable() is None or choose_client(http.url + "/d", None)
                client.fetch_sync("obj", (0, 4))
            except RuntimeError as exc:
                ok = not usable and "forked from one where obstore" in str(exc)
            finally:
                os._exit(0 if ok else 4)
        assert os.waitpid(after, 0)[1] == 0
        print("ok")
    """
)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork is POSIX")
def test_a_process_forked_after_obstore_ran_does_not_use_it(folder) -> None:
    out = subprocess.run(
        [sys.executable, "-c", FORK_CHILD, str(folder)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


# -- what a second review found -------------------------------------------------------------


class LyingServer:
    """HTTP on 127.0.0.1 answering every request the same way (``mode``), counting bytes.

    ``"huge"``: ``206`` with ``Content-Range: bytes 0-9/10`` and a 100 MB body.
    ``"no-head"``: ignores ``Range`` (``200`` with the whole object) and refuses ``HEAD``.
    """

    HUGE = 100_000_000

    def __init__(self, mode: str) -> None:
        import socket
        import threading

        self.mode, self.sent = mode, 0
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        import threading

        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: Any) -> None:
        with conn, conn.makefile("rb") as f:
            while True:
                head = b""
                while not head.endswith(b"\r\n\r\n"):
                    byte = f.read(1)
                    if not byte:
                        return
                    head += byte
                try:
                    if self.mode == "huge":
                        conn.sendall(
                            b"HTTP/1.1 206 Partial Content\r\nContent-Range: bytes 0-9/10\r\n"
                            + f"Content-Length: {self.HUGE}\r\n\r\n".encode()
                        )
                        block = b"A" * 1_000_000
                        for _ in range(self.HUGE // len(block)):
                            conn.sendall(block)
                            self.sent += len(block)
                    elif head.startswith(b"HEAD"):
                        conn.sendall(
                            b"HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\n\r\n"
                        )
                    else:
                        conn.sendall(
                            f"HTTP/1.1 200 OK\r\nContent-Length: {len(DATA)}\r\n\r\n".encode()
                            + DATA
                        )
                except OSError:
                    return

    def close(self) -> None:
        self.sock.close()


def test_a_body_longer_than_its_content_range_is_not_downloaded() -> None:
    server = LyingServer("huge")
    try:
        client = choose_client(server.url, None)
        assert client is not None
        with pytest.raises(RangeMismatchError, match="claims 10 bytes but brought more"):
            client.fetch_sync("obj", (0, None), limit=10)
        assert server.sent < LyingServer.HUGE // 4  # dropped once past the range
    finally:
        server.close()


def test_a_server_refusing_head_and_ignoring_range(http) -> None:
    server = LyingServer("no-head")
    try:
        client = choose_client(server.url, None)
        assert client is not None
        assert client.fetch_sync("obj", (0, None)) == DATA  # binary, as long as it says
        with pytest.raises(RangeMismatchError, match="whose size a HEAD could not learn"):
            client.fetch_sync("obj", (2, 5))
    finally:
        server.close()


def test_the_plain_get_after_an_ignored_range_is_retried_like_any_request(http) -> None:
    client = choose_client(f"{http.url}/d", None)
    assert client is not None
    ranges._IGNORED_RANGE_SIZES.clear()
    http.faults.range_fault, http.faults.fail_every = "whole", 2  # every plain GET: 503
    http.faults.reset()
    try:
        with pytest.raises(OSError, match="503") as info:
            client.fetch_sync("obj", (10, 50))
        assert is_transient(info.value) and info.value.__context__ is None
        del info
    finally:
        http.faults.range_fault, http.faults.fail_every = None, 0


def test_errors_carry_no_obstore_error_on_their_chain(http) -> None:
    client = choose_client(f"{http.url}/d", None)
    assert client is not None
    with pytest.raises(FileNotFoundError) as info:
        client.fetch_sync("nope", (0, 10))
    assert info.value.__context__ is None and info.value.__cause__ is None
    del info
    bad = ObjectClient("s3://bucket", "S3Store", {"endpoint": 5}, {}, {"key": "sekrit-key"})
    with pytest.raises(ValueError, match="obstore refused the storage_options") as refused:
        bad.store()
    assert refused.value.__context__ is None
    del refused


def test_option_values_s3fs_reads_as_not_given_or_anonymous() -> None:
    import botocore

    none = choose_client(
        "s3://b/x",
        {
            "key": None,
            "secret": None,
            "client_kwargs": {"region_name": None},
            "config_kwargs": {"connect_timeout": None},
        },
    )
    assert none is not None and dict(none.config) == {}
    unsigned = choose_client(
        "s3://b/x", {"config_kwargs": {"signature_version": botocore.UNSIGNED}}
    )
    assert unsigned is not None and unsigned.config == {"skip_signature": True}
    for odd in ({"config_kwargs": {"connect_timeout": "soon"}}, {"key": "AKID\n"}):
        assert choose_client("s3://b/x", odd) is None  # fsspec reads those
        with pytest.raises(ObstoreUnsupported):
            choose_client("s3://b/x", odd, "obstore")
    default = choose_client("gs://b/x", {"token": "google_default"})
    assert default is not None and default.config == {}
    for flow in ("cache", "browser", "cloud"):
        assert choose_client("gs://b/x", {"token": flow}) is None
    assert choose_client("s3://b/d//x", None) is None  # a key obstore cannot address
    assert choose_client("s3://b/d/./x", None) is None


def test_versions_ignore_etag_quoting() -> None:
    from mixle.reading.object_client import object_version

    assert object_version({"e_tag": 'W/"abc"'}) == object_version({"e_tag": "abc"})
    assert object_version({"e_tag": '"abc"'}) != object_version({"e_tag": '"abd"'})


def test_credentials_only_in_an_aws_profile_keep_s3_on_fsspec(tmp_path, monkeypatch) -> None:
    """botocore (s3fs) reads ~/.aws; obstore does not: 'auto' must not trade a working
    read for a credentials error."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_PROFILE", "AWS_DEFAULT_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("AWS_SHARED_CREDENTIALS_FILE", raising=False)
    monkeypatch.delenv("AWS_CONFIG_FILE", raising=False)
    assert choose_client("s3://b/x", None) is not None  # no profile: obstore's own chain
    (tmp_path / ".aws").mkdir()
    (tmp_path / ".aws" / "credentials").write_text("[default]\naws_access_key_id = A\n")
    assert choose_client("s3://b/x", None) is None
    with pytest.raises(ObstoreUnsupported, match="from a profile"):
        choose_client("s3://b/x", None, "obstore")
    assert choose_client("s3://b/x", {"key": "A", "secret": "B"}) is not None
    assert choose_client("s3://b/x", {"anon": True}) is not None
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "A")
    assert choose_client("s3://b/x", None) is not None


def test_a_hash_in_the_url_keeps_it_on_fsspec() -> None:
    """urlsplit cuts the path at '#': obstore read s3://b/run (another array) for
    s3://b/run#2.zarr, where fsspec reads the key as written."""
    assert choose_client("s3://b/run#2.zarr", None) is None
    with pytest.raises(ObstoreUnsupported, match="a '#' in the URL"):
        choose_client("s3://b/run#2.zarr", None, "obstore")


def test_a_just_modified_object_has_no_size_mtime_version() -> None:
    import datetime

    from mixle.reading.object_client import object_version

    now = datetime.datetime.now(datetime.timezone.utc)
    old = now - datetime.timedelta(minutes=5)
    assert object_version({"size": 3, "last_modified": now}) is None  # same-second rewrites
    assert object_version({"size": 3, "last_modified": old}) == object_version(
        {"size": 3, "last_modified": old}
    )
    assert object_version({"size": 3, "last_modified": now, "e_tag": "x"}) == "etag:x"


def test_refused_option_values_are_not_repeated() -> None:
    for options in (
        {"config_kwargs": {"connect_timeout": "SUPERSECRETVALUE"}},
        {"config_kwargs": {"signature_version": "SUPERSECRETVALUE"}},
        {"config_kwargs": {"s3": {"addressing_style": "SUPERSECRETVALUE"}}},
    ):
        with pytest.raises(ObstoreUnsupported) as info:
            choose_client("s3://b/x", options, "obstore")
        assert "SUPERSECRETVALUE" not in str(info.value)
        del info
