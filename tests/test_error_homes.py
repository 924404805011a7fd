"""Every mixle error lives in mixle.errors (exported from mixle); old import paths still work."""

from __future__ import annotations

import ast
import importlib
import inspect
import warnings

import pytest

import mixle
import mixle.errors

# name -> (its exact base classes, the module it was defined in before it moved)
HOMES: dict[str, tuple[tuple[str, ...], str]] = {
    "ParquetReadError": (("ValueError", "OSError"), "mixle.data.sources.records.parquet_source"),
    "RowIndexCacheWarning": (("RuntimeWarning",), "mixle.data.sources.records.text.row_index"),
    "MetadataLimitError": (("ValueError",), "mixle.inspection.limits"),
    "InvalidMetadataError": (("UnsupportedStoreError",), "mixle.inspection.limits"),
    "NpyHeaderTooLargeError": (("UnsupportedStoreError",), "mixle.inspection.npy_files"),
    "UnsupportedStoreError": (("ValueError",), "mixle.inspection.report"),
    "DiskFullError": (("OSError",), "mixle.cli._demo_disk"),
    "RemoteReadError": (("OSError",), "mixle.reading.faults"),
    "RemoteTimeoutError": (("RemoteReadError",), "mixle.reading.faults"),
    "CorruptChunkError": (("ValueError",), "mixle.reading.faults"),
    "RangeMismatchError": (("OSError",), "mixle.reading.faults"),
    "LoaderStateError": (("ValueError",), "mixle.loading.state"),
    "VlenLimitError": (("CorruptChunkError",), "mixle.data.sources.arrays.zarr.vlen"),
}
#: The public paths the docs and users name, which must be the same class too.
PUBLIC_PATHS = {
    "InvalidMetadataError": "mixle.inspection",
    "MetadataLimitError": "mixle.inspection",
    "NpyHeaderTooLargeError": "mixle.inspection",
    "UnsupportedStoreError": "mixle.inspection",
    "RemoteReadError": "mixle.reading",
    "RemoteTimeoutError": "mixle.reading",
    "CorruptChunkError": "mixle.reading",
    "RangeMismatchError": "mixle.reading",
    "LoaderStateError": "mixle.loading",
}


@pytest.mark.parametrize("name", sorted(HOMES))
def test_each_error_is_defined_in_mixle_errors_with_its_bases(name):
    cls = getattr(mixle.errors, name)
    assert name in mixle.errors.__all__
    assert cls.__module__ == "mixle.errors"
    assert tuple(base.__name__ for base in cls.__bases__) == HOMES[name][0]
    assert inspect.getdoc(cls)  # documented on the errors API page


@pytest.mark.parametrize("name", sorted(HOMES))
def test_each_error_is_exported_from_mixle(name):
    assert name in mixle.__all__
    assert getattr(mixle, name) is getattr(mixle.errors, name)


def test_except_clauses_written_for_the_builtins_still_catch_them():
    e = mixle.errors
    with pytest.raises(OSError, match="bad footer"):
        raise e.ParquetReadError("bad footer", path="f.parquet")
    with pytest.raises(ValueError, match="bad page"):
        raise e.ParquetReadError("bad page", path="f.parquet", row_group=2)
    with pytest.raises(ValueError, match="is null"):
        raise e.InvalidMetadataError("zarr.json is null")
    with pytest.raises(e.UnsupportedStoreError):
        raise e.NpyHeaderTooLargeError("header of 4 GiB")
    with pytest.raises(OSError, match="stalled"):
        raise e.RemoteTimeoutError("stalled")
    assert not issubclass(e.RemoteTimeoutError, TimeoutError)  # fsspec would rewrap one
    with pytest.warns(RuntimeWarning):
        warnings.warn("not written", e.RowIndexCacheWarning, stacklevel=1)
    error = e.DiskFullError("no space")
    error.errno = 28
    assert isinstance(error, OSError) and error.errno == 28


def test_mixle_errors_defines_them_and_imports_nothing_so_any_layer_may_import_it():
    tree = ast.parse(inspect.getsource(mixle.errors))
    defined = {n.name for n in tree.body if isinstance(n, ast.ClassDef)}
    assert set(HOMES) <= defined
    imports = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert [getattr(n, "module", None) for n in imports] == ["__future__"]


@pytest.mark.parametrize("name", sorted(HOMES))
def test_the_old_import_path_is_the_same_class(name):
    old = importlib.import_module(HOMES[name][1])
    assert getattr(old, name) is getattr(mixle.errors, name)


@pytest.mark.parametrize("name", sorted(PUBLIC_PATHS))
def test_the_public_subpackage_path_is_the_same_class(name):
    package = importlib.import_module(PUBLIC_PATHS[name])
    assert getattr(package, name) is getattr(mixle.errors, name)


def test_the_jax_adapters_errors_live_in_mixle_errors_without_jax():
    # defined in mixle.errors (which imports nothing), so catching them needs no jax import
    for name, bases in (
        ("DtypePolicyError", ("TypeError",)),
        ("DtypeOverflowError", ("DtypePolicyError", "OverflowError")),
        ("DeviceMemoryError", ("MemoryError",)),
    ):
        cls = getattr(mixle.errors, name)
        assert cls.__module__ == "mixle.errors" and name in mixle.errors.__all__
        assert tuple(base.__name__ for base in cls.__bases__) == bases
        pytest.importorskip("jax")
        assert getattr(importlib.import_module("mixle.jax"), name) is cls
        if name != "DeviceMemoryError":
            assert getattr(importlib.import_module("mixle.jax.convert"), name) is cls
