"""Opening a zarr store over S3 carries mixle's request timeout (botocore's config)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _remote_fixtures import retries

zarr = pytest.importorskip("zarr")
pytest.importorskip("s3fs")
pytest.importorskip("moto")

import mixle  # noqa: E402
from mixle.reading import RemoteReadError, set_retry_policy  # noqa: E402
from mixle.reading.faults import RemoteTimeoutError  # noqa: E402
from mixle.testing_servers import MotoS3Server  # noqa: E402

BUCKET = "open-timeouts"


@pytest.fixture(autouse=True)
def policy() -> Iterator[None]:
    with retries(attempts=2, base_delay=0.001, max_delay=0.004, timeout=12):
        yield


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[MotoS3Server, str, Any]]:
    root = tmp_path_factory.mktemp("s3open")
    data = np.arange(60, dtype="int32").reshape(6, 10)
    array = zarr.create_array(
        str(Path(root) / "a.zarr"), shape=data.shape, chunks=(3, 5), dtype="int32"
    )
    array[...] = data
    truth = np.asarray(zarr.open_array(str(Path(root) / "a.zarr"), mode="r")[...])
    with MotoS3Server() as server:
        yield server, server.upload(root, BUCKET), truth


def _open_config(source: Any) -> dict[str, Any]:
    """The botocore config of the s3fs file system zarr opened the store with."""
    source._live()
    return dict(source._handle.store.fs.config_kwargs)


def test_read_zarr_over_s3_gives_botocore_the_policy_timeout(served):
    server, url, truth = served
    # s3fs's botocore config: the fsspec path (obstore's timeouts: test_zarr_obstore_faults.py)
    options = server.storage_options()
    source = mixle.read_zarr(f"{url}/a.zarr", storage_options=options, backend="fsspec")
    config = _open_config(source)
    assert config["connect_timeout"] == config["read_timeout"] == 12
    assert np.array_equal(np.asarray(source[...]), truth)


def test_a_timeout_in_the_users_config_kwargs_wins(served):
    server, url, truth = served
    options = server.storage_options(config_kwargs={"read_timeout": 3})
    # s3fs's botocore config: the fsspec path (obstore's timeouts: test_zarr_obstore_faults.py)
    source = mixle.read_zarr(f"{url}/a.zarr", storage_options=options, backend="fsspec")
    config = _open_config(source)
    assert config["read_timeout"] == 3 and config["connect_timeout"] == 12
    assert options["config_kwargs"] == {"read_timeout": 3}  # the user's dict is not changed
    assert np.array_equal(np.asarray(source[...]), truth)


def test_opening_a_zarr_on_a_silent_s3_endpoint_gives_up_in_bounded_time(silent):
    set_retry_policy(attempts=1, timeout=0.5)
    options = {
        "key": "k",
        "secret": "s3cret-value",
        "endpoint_url": silent,
        "config_kwargs": {"retries": {"max_attempts": 1}},
    }
    done: dict[str, BaseException] = {}

    def run() -> None:
        try:
            mixle.read_zarr(f"s3://{BUCKET}/a.zarr", storage_options=options)
        except BaseException as exc:  # handed to the test's thread
            done["error"] = exc

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(60)  # only catches a hang: botocore's default waits 60 s per try
    assert not worker.is_alive(), "opening a zarr on a silent S3 endpoint did not give up"
    error = done["error"]
    assert isinstance(error, (RemoteReadError, RemoteTimeoutError, OSError)), repr(error)
    assert "s3cret-value" not in str(error)


def test_a_chained_url_gives_its_s3_target_the_policy_timeout() -> None:
    """``simplecache::s3://...``: fsspec takes the target's options keyed by its protocol."""
    import fsspec

    from mixle.reading.fs_options import timed_storage_options

    user = {"s3": {"anon": True, "config_kwargs": {"read_timeout": 3}}}
    options = timed_storage_options("simplecache::s3://bucket/a.zarr", user)
    assert options["s3"]["config_kwargs"] == {"read_timeout": 3, "connect_timeout": 12}
    assert user["s3"]["config_kwargs"] == {"read_timeout": 3}  # the user's dict is not changed
    fs, _ = fsspec.url_to_fs("simplecache::s3://bucket/a.zarr", **options)
    assert fs.fs.config_kwargs == {"read_timeout": 3, "connect_timeout": 12}
    assert timed_storage_options("simplecache::memory://a.zarr", None) == {}
