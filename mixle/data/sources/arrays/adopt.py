"""Turn whatever array a user hands us into an :class:`ArraySource`."""

from __future__ import annotations

import mmap
from typing import Any

import numpy as np

from mixle.data.schema import Schema
from mixle.data.sources.arrays.base import ArrayMeta, ArraySource
from mixle.data.sources.arrays.hdf5.source import HDF5ArraySource
from mixle.data.sources.arrays.memmap.source import MemmapArraySource
from mixle.data.sources.arrays.zarr.source import ZarrArraySource
from mixle.data.structure import EXCHANGEABLE, SampleStructure
from mixle.utils.optional_deps import imported

__all__ = ["ArrayLikeSource", "as_array_source"]


class ArrayLikeSource(ArraySource):
    """Any N-D array-like with ``.shape`` and basic ``__getitem__`` (ndarray, dask...).

    Pickling pickles the wrapped object itself, so in-memory arrays travel with their data.
    """

    def __init__(
        self, array: Any, *, structure: SampleStructure = EXCHANGEABLE, schema: Schema | None = None
    ) -> None:
        if not _is_array_like(array):
            raise TypeError(f"array={type(array).__name__} must have .shape and N-D __getitem__")
        self._init_state({"array": array}, structure, schema)
        self._live()

    def _location(self) -> str:
        assert self._args is not None
        return f"<{type(self._args['array']).__name__}>"

    def _open(self) -> Any:
        assert self._args is not None
        return self._args["array"]

    def _describe(self, handle: Any) -> ArrayMeta:
        shape = tuple(int(s) for s in handle.shape)
        dtype = getattr(handle, "dtype", None)
        if dtype is None:
            dtype = np.asarray(handle[(0,) * len(shape)]).dtype if all(shape) else np.float64
        return ArrayMeta(shape=shape, dtype=np.dtype(dtype))


def _is_array_like(obj: Any) -> bool:
    shape = getattr(obj, "shape", None)
    return isinstance(shape, tuple) and hasattr(obj, "__getitem__")


def as_array_source(
    obj: Any,
    *,
    name: str = "array",
    structure: SampleStructure = EXCHANGEABLE,
    schema: Schema | None = None,
) -> ArraySource:
    """Return ``obj`` as an :class:`ArraySource`, wrapping live arrays so they pickle small.

    h5py datasets, zarr arrays and whole-file ``np.memmap`` objects become sources that
    pickle by reference (path, not data); other array-likes are wrapped as they are.
    ``structure`` and ``schema`` apply only when ``obj`` is wrapped here.

    Raises
    ------
    TypeError
        When ``obj`` is neither a source nor an N-D array-like; the message uses ``name``.
    """
    if isinstance(obj, ArraySource):
        return obj
    h5py = imported("h5py")
    if h5py is not None and isinstance(obj, h5py.Dataset):
        return HDF5ArraySource.from_dataset(obj, structure=structure, schema=schema)
    zarr = imported("zarr")
    if zarr is not None and isinstance(obj, zarr.Array):
        return ZarrArraySource.from_array(obj, structure=structure, schema=schema)
    if isinstance(obj, np.memmap) and isinstance(obj.base, mmap.mmap) and obj.filename:
        return MemmapArraySource.from_memmap(obj, structure=structure, schema=schema)
    if _is_array_like(obj):
        return ArrayLikeSource(obj, structure=structure, schema=schema)
    raise TypeError(
        f"{name}={type(obj).__name__} is not an array: pass a mixle source (read_zarr, "
        "read_hdf5, read_memmap, read_npy) or an N-D array-like with .shape and __getitem__ "
        "(numpy array, zarr array, h5py dataset)"
    )
