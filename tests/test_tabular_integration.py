"""Record sources through the Loader, MPEncodedData (workers read their own rows) and JAX,
and the docs/tabular.md tutorial (including the table-volume join) run as a test."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import mixle
from mixle.data.spec import validate_batch
from mixle.utils.parallel.multiprocessing import MPEncodedData

ROOT = Path(__file__).resolve().parents[1]


def _csv(tmp_path: Path, n: int = 50) -> Path:
    path = tmp_path / "rows.csv"
    path.write_text("id,value,name\n" + "".join(f"{i},{i / 2},n{i}\n" for i in range(n)))
    return path


@pytest.fixture(autouse=True)
def _cache_in_tmp(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("MIXLE_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))


def _id_sum(shard: dict[str, np.ndarray]) -> int:
    return int(shard["id"].sum())


def _ids(shard: dict[str, np.ndarray]) -> list[int]:
    return shard["id"].tolist()


def test_loader_batches_are_get_batch_of_the_shuffled_indices(tmp_path: Path) -> None:
    src = mixle.read_csv(_csv(tmp_path))
    loader = mixle.Loader(src, batch_size=8, shuffle=True, seed=3, num_epochs=2, num_threads=2)
    spec = loader.element_spec()
    seen = []
    for batch in loader:
        validate_batch(batch, spec, allow_short=True)
        rows = loader.last_indices
        np.testing.assert_array_equal(batch["id"], rows)
        assert batch["name"].tolist() == [f"n{i}" for i in rows]
        seen.extend(rows.tolist())
    assert sorted(seen) == sorted(list(range(50)) * 2)


@pytest.mark.parametrize("kind", ["csv", "parquet", "sqlite"])
def test_mpencoded_workers_read_their_own_rows(tmp_path: Path, kind: str) -> None:
    path = _csv(tmp_path)
    if kind == "csv":
        src: Any = mixle.read_csv(path, ["id", "value"])
    elif kind == "parquet":
        import pyarrow.csv as pacsv
        import pyarrow.parquet as pq

        pq.write_table(pacsv.read_csv(path), tmp_path / "rows.parquet", row_group_size=7)
        src = mixle.read_parquet(tmp_path / "rows.parquet")
    else:
        import sqlite3

        with sqlite3.connect(tmp_path / "rows.db") as con:
            con.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, value REAL)")
            con.executemany("INSERT INTO t VALUES (?, ?)", [(i, i / 2) for i in range(50)])
        con.close()
        src = mixle.read_sql("t", tmp_path / "rows.db")
    with MPEncodedData(src, num_workers=2, read_in="auto", timeout=120) as enc:
        assert enc.stats["read_in"] == "workers" and enc.stats["driver_bytes_read"] == 0
        assert enc.map_reduce(_id_sum) == sum(range(50))
        assert enc.map(_ids) == [list(range(0, 50, 2)), list(range(1, 50, 2))]
