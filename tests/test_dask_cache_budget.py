"""DaskEncodedData workers share one job's default chunk-cache budget per host; a set one wins."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from _encoded_helpers import local_dask_client

from mixle.reading import DEFAULT_CHUNK_CACHE_BYTES, MIN_WORKER_CHUNK_CACHE_BYTES
from mixle.reading.process_cache import chunk_cache, set_chunk_cache_bytes

distributed = pytest.importorskip("distributed", reason="needs mixle[dask]")
from mixle.utils.parallel.dask_backend import DaskEncodedData, scheduler_workers  # noqa: E402

#: Hang guard for every call in this module; no test relies on it for timing.
T = 60


def budget(shard: object) -> int:
    """The chunk-cache budget of the Dask worker process holding ``shard``."""
    return chunk_cache().budget


@pytest.fixture(scope="module", params=[2, 4])
def client(request) -> Iterator[distributed.Client]:
    """``request.param`` single-threaded worker processes, all on 127.0.0.1 (one host).

    One cluster per size for the module (starting one takes seconds): a test that sets a
    budget in the workers puts theirs back, so every test finds workers with none set.
    """
    with local_dask_client(request.param, timeout=T) as dask_client:
        yield dask_client


def _worker_budgets(client: distributed.Client, read_in: str) -> list[int]:
    workers = len(scheduler_workers(client))
    data = list(range(3 * workers))
    with DaskEncodedData(data, client=client, read_in=read_in, timeout=T) as enc:
        assert enc.num_workers == workers and len(set(enc.homes)) == workers
        return enc.map(budget, timeout=T)


@pytest.mark.parametrize("read_in", ["workers", "driver"])
def test_workers_on_one_host_share_the_default_budget(client, read_in):
    workers = len(scheduler_workers(client))
    share = max(MIN_WORKER_CHUNK_CACHE_BYTES, DEFAULT_CHUNK_CACHE_BYTES // workers)
    driver = chunk_cache().budget
    assert _worker_budgets(client, read_in) == [share] * workers
    assert chunk_cache().budget == driver  # the driver keeps its own budget


def test_a_budget_set_in_the_driver_is_every_workers_budget(client):
    workers = len(scheduler_workers(client))
    chosen = 48 * 1024 * 1024 + 4096
    set_chunk_cache_bytes(chosen)
    try:
        assert _worker_budgets(client, "workers") == [chosen] * workers
    finally:
        set_chunk_cache_bytes(None)
        client.run(set_chunk_cache_bytes, None)  # the workers' too: the next test reuses them
