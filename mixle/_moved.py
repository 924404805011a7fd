"""Module paths from before the layout of ``docs/architecture.md``, kept importable.

Each old path is the new module itself (``sys.modules`` holds the same object under both
names), so old imports, pickles that name an old path and ``monkeypatch`` by an old dotted
name keep working. Installed by ``import mixle``.
"""

from __future__ import annotations

import importlib
import sys

MOVED: dict[str, str] = {
    "mixle.data.hashing": "mixle.data.index_math.hashing",
    "mixle.data.permutation": "mixle.data.index_math.permutation",
    "mixle.data.sharding": "mixle.data.index_math.sharding",
    "mixle.utils.parallel.sharding": "mixle.data.index_math.sharding",
    "mixle.data.indexing": "mixle.data.sources.indexing",
    "mixle.data.placement": "mixle.data.sampling.placement",
    "mixle.data.padding": "mixle.data.sampling.padding",
    "mixle.data.patch_args": "mixle.data.sampling.patch_args",
    "mixle.data.patch_sampler": "mixle.data.sampling.patch_sampler",
    "mixle.data.grid": "mixle.data.sampling.grid",
    "mixle.data.stitch": "mixle.data.sampling.stitch",
    "mixle.data.weighted": "mixle.data.sampling.weighted",
    "mixle.data.aligned": "mixle.data.sampling.aligned",
    "mixle.data.sources.base": "mixle.data.sources.arrays.base",
    "mixle.data.sources.adopt": "mixle.data.sources.arrays.adopt",
    "mixle.data.sources.zarr_source": "mixle.data.sources.arrays.zarr.source",
    "mixle.data.sources.zarr_chunks": "mixle.data.sources.arrays.zarr.chunks",
    "mixle.data.sources.zarr_codecs": "mixle.data.sources.arrays.zarr.codecs",
    "mixle.data.sources.zarr_shards": "mixle.data.sources.arrays.zarr.shards",
    "mixle.data.sources.zarr_vlen": "mixle.data.sources.arrays.zarr.vlen",
    "mixle.data.sources.zarr_limits": "mixle.data.sources.arrays.zarr.limits",
    "mixle.data.sources.zarr_outer_shards": "mixle.data.sources.arrays.zarr.outer_shards",
    "mixle.data.sources.hdf5_source": "mixle.data.sources.arrays.hdf5.source",
    "mixle.data.sources.hdf5_access": "mixle.data.sources.arrays.hdf5.access",
    "mixle.data.sources.hdf5_chunks": "mixle.data.sources.arrays.hdf5.chunks",
    "mixle.data.sources.hdf5_remote": "mixle.data.sources.arrays.hdf5.remote",
    "mixle.data.sources.memmap_source": "mixle.data.sources.arrays.memmap.source",
    "mixle.data.sources.memmap_check": "mixle.data.sources.arrays.memmap.check",
    "mixle.data.sources.columns": "mixle.data.sources.records.columns",
    "mixle.data.sources.text_source": "mixle.data.sources.records.text.text_source",
    "mixle.data.sources.csv_source": "mixle.data.sources.records.text.csv_source",
    "mixle.data.sources.jsonl_source": "mixle.data.sources.records.text.jsonl_source",
    "mixle.data.sources.row_index": "mixle.data.sources.records.text.row_index",
    "mixle.data.sources.parquet_source": "mixle.data.sources.records.parquet_source",
    "mixle.data.sources.sql_source": "mixle.data.sources.records.sql.sql_source",
    "mixle.data.sources.sql_connect": "mixle.data.sources.records.sql.sql_connect",
    "mixle.data.sources.dataframe_source": "mixle.data.sources.records.dataframe_source",
}


def install() -> None:
    """Register every old path in :data:`MOVED` as an alias of its new module."""
    for old, new in MOVED.items():
        module = importlib.import_module(new)
        sys.modules.setdefault(old, module)
        parent, _, leaf = old.rpartition(".")
        setattr(importlib.import_module(parent), leaf, module)
