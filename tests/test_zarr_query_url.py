"""A zarr URL with a query string (a presigned ``https://host/a.zarr?token=...``) opens."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qsl

import numpy as np
import pytest

zarr = pytest.importorskip("zarr")
pytest.importorskip("aiohttp")

import mixle  # noqa: E402
from mixle import testing_servers  # noqa: E402
from mixle.testing_servers import RangeHTTPServer  # noqa: E402

pytestmark = pytest.mark.usefixtures("fast_retries")

TOKEN = "s3cr%2Ft0ken%3D"
QUERY = f"token={TOKEN}&X-Sig=abc%20def&empty="
PAIRS = [("token", "s3cr/t0ken="), ("X-Sig", "abc def"), ("empty", "")]
LAYOUTS = {
    "v3.zarr": {},
    "v2.zarr": {"zarr_format": 2},
    "sharded.zarr": {"shards": (6, 10), "compressors": None},  # inner chunks as ranges
}


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, np.ndarray]]:
    root = tmp_path_factory.mktemp("query")
    data = np.arange(12 * 10, dtype="int32").reshape(12, 10)
    truth = {}
    for name, options in LAYOUTS.items():
        path = str(root / name)
        array = zarr.create_array(path, shape=data.shape, chunks=(3, 5), dtype="int32", **options)
        array[...] = data
        truth[name] = np.asarray(zarr.open_array(path, mode="r")[...])
    return root, truth


@pytest.fixture
def seen(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every request target (path and query) the test server is sent."""
    targets: list[str] = []
    handler = testing_servers._RangeHandler
    for method in ("do_GET", "do_HEAD"):
        original = getattr(handler, method)

        def record(self, original=original) -> None:  # type: ignore[no-untyped-def]
            targets.append(self.path)
            original(self)

        monkeypatch.setattr(handler, method, record)
    return targets


@pytest.fixture
def server(written) -> Iterator[RangeHTTPServer]:
    with RangeHTTPServer(written[0]) as served:
        yield served


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_every_key_goes_before_the_query_and_values_equal_zarrs(name, written, server, seen):
    source = mixle.read_zarr(f"{server.url}/{name}?{QUERY}")
    np.testing.assert_array_equal(np.asarray(source[...]), written[1][name])
    np.testing.assert_array_equal(np.asarray(source[4:9, 2:7]), written[1][name][4:9, 2:7])
    assert seen
    for target in seen:  # the key in the path, the query's pairs at the end
        path, _, query = target.partition("?")
        assert path.startswith(f"/{name}/"), target
        assert parse_qsl(query, keep_blank_values=True) == PAIRS, target
    assert TOKEN not in repr(source)
    source.close()


def test_a_missing_array_behind_a_query_is_named_without_the_token(server, seen):
    with pytest.raises(FileNotFoundError) as raised:
        mixle.read_zarr(f"{server.url}/nothing.zarr?{QUERY}")
    message = str(raised.value)
    assert "nothing.zarr" in message and TOKEN not in message and "s3cr" not in message
    assert all(target.startswith("/nothing.zarr/") for target in seen), seen


def test_a_query_in_the_url_and_params_in_storage_options_is_refused(server):
    with pytest.raises(ValueError, match="query string and storage_options has params") as raised:
        mixle.read_zarr(f"{server.url}/v3.zarr?{QUERY}", storage_options={"params": {"a": "b"}})
    assert TOKEN not in str(raised.value) and "s3cr" not in str(raised.value)


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_inspect_reads_a_store_behind_a_query_as_without_it(name, server, seen):
    from dataclasses import asdict

    from mixle.inspection import inspect_store

    plain = inspect_store(f"{server.url}/{name}")
    seen.clear()
    behind = inspect_store(f"{server.url}/{name}?{QUERY}")
    assert asdict(behind.root) == asdict(plain.root)
    assert seen and all(
        parse_qsl(t.partition("?")[2], keep_blank_values=True) == PAIRS for t in seen
    )
    assert all(t.startswith(f"/{name}") for t in seen), seen
    assert TOKEN not in repr(behind) and "s3cr" not in repr(behind)
