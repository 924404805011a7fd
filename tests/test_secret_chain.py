"""No secret anywhere in what remote reads raise: message, repr, args, chain, attributes."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
from _remote_fixtures import retries, write_stores

import mixle
from mixle.testing_servers import FaultPlan, MotoS3Server, RangeHTTPServer

pytestmark = pytest.mark.usefixtures("frozen_heap")  # full gc collections scan this module only

MARK = "s3cr3t"  # every secret below contains it; nothing mixle raises may
PASSWORD = f"pw-{MARK}"
TOKEN = f"tok-{MARK}"
HEADERS = {"headers": {"Authorization": f"Bearer hdr-{MARK}"}}
#: Attributes where network clients keep the request or response an error came from.
_ATTRS = (
    "request_info",
    "headers",
    "url",
    "real_url",
    "history",
    "response",
    "filename",
    "filename2",
    "strerror",
    "__notes__",
)


def leaks(exc: BaseException) -> list[str]:
    """Where ``MARK`` shows in ``exc``: its text, args, attributes and whole chain."""
    found: list[str] = []
    seen: set[int] = set()
    stack: list[tuple[str, Any, int]] = [("error", exc, 0)]
    while stack:
        where, obj, depth = stack.pop()
        if obj is None or id(obj) in seen or depth > 8:
            continue
        seen.add(id(obj))
        for show in (str, repr):
            try:
                text = show(obj)
            except Exception as failure:  # an attribute that cannot be shown is no leak
                text = type(failure).__name__
            if MARK in text:
                found.append(f"{where}: {text[:160]}")
        if isinstance(obj, (str, bytes, int, float, bool)):
            continue
        children: list[tuple[str, Any]] = []
        if isinstance(obj, BaseException):
            children += [("__cause__", obj.__cause__), ("__context__", obj.__context__)]
            children += [(f"args[{k}]", a) for k, a in enumerate(obj.args)]
            children += [(name, v) for name, v in getattr(obj, "__dict__", {}).items()]
        if isinstance(obj, dict) or hasattr(obj, "items"):
            with contextlib.suppress(Exception):  # not a mapping after all
                children += [(f"[{k!r}]", v) for k, v in list(obj.items())]
        elif isinstance(obj, (list, tuple, set)):
            children += [(f"[{k}]", v) for k, v in enumerate(obj)]
        children += [(name, getattr(obj, name, None)) for name in _ATTRS]
        stack += [(f"{where}.{name}", child, depth + 1) for name, child in children]
    return found


def raised(action: Callable[[], Any]) -> BaseException:
    """The error ``action()`` raises (it must raise), warnings checked for secrets too."""
    errors: list[BaseException] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            action()
        except Exception as exc:
            errors.append(exc)
    for warning in caught:
        assert MARK not in str(warning.message), warning
    assert errors, "expected an error"
    _drop_tracebacks(errors[0])
    return errors[0]


def _drop_tracebacks(exc: BaseException | None) -> None:
    """Cut every traceback of the chain: frames holding h5py objects, kept in a reference
    cycle, would be finalised later on whatever thread collects them, maybe fsspec's I/O
    thread while h5py holds its lock (a deadlock: h5py issue 2019)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        exc.__traceback__ = None
        _drop_tracebacks(exc.__cause__)
        exc = exc.__context__


@pytest.fixture(autouse=True)
def quick() -> Iterator[None]:
    with retries(attempts=2, base_delay=0.001, max_delay=0.002, timeout=0.4):
        yield


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("secrets")
    write_stores(folder)
    data = np.arange(64 * 64 * 64, dtype="float32").reshape(64, 64, 64)
    with h5py.File(folder / "big.h5", "w") as f:  # 1 MiB: reads past the first block
        f.create_dataset("contiguous", data=data)
        f.create_dataset("gzip", data=data, chunks=(16, 16, 16), compression="gzip")
    return folder


#: How a served source is made to fail after it opened.
FAULTS = {
    "403": lambda server: (
        setattr(server.faults, "fail_status", 403) or setattr(server.faults, "fail_every", 1)
    ),
    "dead": lambda server: setattr(server.faults, "dead", True),
    "stalled": lambda server: setattr(server.faults, "stall", "body"),
    "refused": lambda server: server.stop(),
}
#: (path under the served folder, dataset or None for zarr).
HTTP_SOURCES = {
    "zarr": ("v3.zarr", None),
    "zarr-sharded": ("sharded.zarr", None),
    "hdf5-chunked": ("big.h5?token=" + TOKEN, "gzip"),
    "hdf5-contiguous": ("big.h5?token=" + TOKEN, "contiguous"),
}


def _open(url: str, dataset: str | None, options: dict[str, Any] | None) -> Any:
    if dataset is None:
        return mixle.read_zarr(url, storage_options=options)
    return mixle.read_hdf5(url, dataset, storage_options=options)


@pytest.mark.parametrize("fault", list(FAULTS))
@pytest.mark.parametrize("source", list(HTTP_SOURCES))
@pytest.mark.parametrize("auth", ["header", "userinfo"])
def test_http_read_failures_carry_no_secret(auth, source, fault, root):
    path, dataset = HTTP_SOURCES[source]
    server = RangeHTTPServer(root, FaultPlan()).start()
    try:
        base = server.url
        options: dict[str, Any] | None = HEADERS
        if auth == "userinfo":  # aiohttp refuses both at once: credentials in the URL alone
            base, options = base.replace("://", f"://user:{PASSWORD}@"), None
        src = _open(f"{base}/{path}", dataset, options)
        FAULTS[fault](server)
        error = raised(lambda: src[...])
        src.close()
    finally:
        server.stop()
    assert isinstance(error, OSError), repr(error)
    assert leaks(error) == []


@pytest.mark.parametrize("dataset", ["gzip", "contiguous"])
def test_an_hdf5_file_removed_while_open_raises_without_secrets(dataset, root, tmp_path):
    (tmp_path / "gone.h5").write_bytes((root / "big.h5").read_bytes())
    with RangeHTTPServer(tmp_path) as server:
        src = _open(f"{server.url}/gone.h5?token={TOKEN}", dataset, HEADERS)
        (tmp_path / "gone.h5").unlink()
        error = raised(lambda: src[...])
        src.close()
    assert isinstance(error, FileNotFoundError) and "gone.h5" in str(error)
    assert leaks(error) == []


@pytest.mark.parametrize("kind", ["zarr", "hdf5"])
def test_opening_what_is_not_there_raises_without_secrets(kind, root):
    name, dataset = ("missing.zarr", None) if kind == "zarr" else ("missing.h5", "x")
    with RangeHTTPServer(root) as server:
        error = raised(lambda: _open(f"{server.url}/{name}?token={TOKEN}", dataset, HEADERS))
    assert isinstance(error, FileNotFoundError)
    assert leaks(error) == []


def test_a_zarr_url_with_every_kind_of_credential_raises_without_secrets(root):
    with RangeHTTPServer(root) as server:
        url = server.url.replace("://", f"://user:{PASSWORD}@") + f"/v3.zarr?token={TOKEN}"
        error = raised(lambda: _open(url, None, HEADERS)[...])
    assert leaks(error) == []


@pytest.mark.parametrize("fault", ["403", "dead"])
def test_s3_read_failures_carry_no_secret(fault, root):
    with MotoS3Server() as server:
        url = server.upload(root, "secrets")
        options = server.storage_options(
            secret=f"key-{MARK}", config_kwargs={"retries": {"max_attempts": 1}}
        )
        sources = [
            _open(f"{url}/v3.zarr", None, options),
            _open(f"{url}/sharded.zarr", None, options),
            _open(f"{url}/big.h5", "gzip", options),
            _open(f"{url}/big.h5", "contiguous", options),
        ]
        FAULTS[fault](server)
        errors = [raised(lambda src=src: src[...]) for src in sources]
        for src in sources:
            src.close()
    for error in errors:
        assert isinstance(error, OSError), repr(error)
        assert leaks(error) == []
