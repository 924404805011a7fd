"""Optional dependencies: cheap availability flags and an import that names the pip extra.

The ``HAS_*`` flags only ask :func:`importlib.util.find_spec`, so ``import mixle`` never pays
for importing zarr, h5py, fsspec or jax. The real import happens in the adapter that needs
it, through :func:`require`.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from types import ModuleType

__all__ = [
    "EXTRAS",
    "HAS_AIOHTTP",
    "HAS_ARRAY_RECORD",
    "HAS_BLOSC2",
    "HAS_DASK",
    "HAS_FSSPEC",
    "HAS_DATASETS",
    "HAS_H5PY",
    "HAS_HDF5PLUGIN",
    "HAS_ICECHUNK",
    "HAS_IMAGECODECS",
    "HAS_JAX",
    "HAS_MATPLOTLIB",
    "HAS_NIBABEL",
    "HAS_NUMCODECS",
    "HAS_OBSTORE",
    "HAS_PYARROW",
    "HAS_SQLALCHEMY",
    "HAS_TIFFFILE",
    "HAS_TQDM",
    "HAS_ZARR",
    "has",
    "imported",
    "not_opened_note",
    "require",
]

#: Which ``mixle[...]`` extra installs each optional module.
EXTRAS: dict[str, str] = {
    "zarr": "zarr",
    "numcodecs": "zarr",
    "h5py": "hdf5",
    "hdf5plugin": "hdf5plugin",
    "fsspec": "remote",
    "aiohttp": "remote",
    "jax": "jax",
    "dask": "dask",
    "distributed": "dask",
    "pyarrow": "tabular",
    "sqlalchemy": "sql",
    "matplotlib": "plot",
    "tqdm": "progress",
    "datasets": "hf",
    "array_record": "arrayrecord",
    "tifffile": "tiff",
    "imagecodecs": "tiff",
    "nibabel": "nifti",
    "blosc2": "blosc2",
    "icechunk": "icechunk",
}


def has(name: str) -> bool:
    """Return whether module ``name`` can be imported, without importing it."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


HAS_ZARR = has("zarr")
HAS_NUMCODECS = has("numcodecs")
HAS_H5PY = has("h5py")
HAS_HDF5PLUGIN = has("hdf5plugin")
HAS_FSSPEC = has("fsspec")
HAS_AIOHTTP = has("aiohttp")
HAS_OBSTORE = has("obstore")
HAS_JAX = has("jax")
HAS_DASK = has("dask")
HAS_PYARROW = has("pyarrow")
HAS_SQLALCHEMY = has("sqlalchemy")
HAS_MATPLOTLIB = has("matplotlib")
HAS_TQDM = has("tqdm")
HAS_DATASETS = has("datasets")
HAS_ARRAY_RECORD = has("array_record")
HAS_TIFFFILE = has("tifffile")
HAS_IMAGECODECS = has("imagecodecs")
HAS_NIBABEL = has("nibabel")
HAS_BLOSC2 = has("blosc2")
HAS_ICECHUNK = has("icechunk")


def require(name: str, extra: str | None = None, *, feature: str | None = None) -> ModuleType:
    """Import and return optional module ``name``.

    Parameters
    ----------
    name
        The module to import, e.g. ``"zarr"``.
    extra
        The ``mixle[...]`` extra that installs it; looked up in :data:`EXTRAS` when omitted.
    feature
        What needs the module (e.g. ``"ZarrArraySource"``), used in the error message.

    Raises
    ------
    ImportError
        When the module is missing; the message names the command that fixes it,
        ``pip install -e ".[extra]"`` in a clone of the mixle repository (the name ``mixle``
        on the package index belongs to an unrelated project).
    """
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        extra = extra or EXTRAS.get(name.split(".")[0], "all")
        what = f"{feature} needs {name}" if feature else f"{name} is required"
        raise ImportError(
            f'{what}, which is not installed: pip install -e ".[{extra}]" in a clone of the mixle '
            "repository (the name mixle on the package index belongs to an unrelated project)"
        ) from exc


def imported(name: str) -> ModuleType | None:
    """Module ``name`` if it is already fully imported, else ``None``; imports nothing.

    A module another thread is still importing is in ``sys.modules`` half made (zarr
    without ``zarr.Array`` yet): it counts as not imported. Code that only asks "is this
    object a zarr array?" uses it, since such an object exists only once zarr is imported.
    """
    module = sys.modules.get(name)
    if module is None or getattr(getattr(module, "__spec__", None), "_initializing", False):
        return None
    return module


def not_opened_note(library: str | None) -> str:
    """How a repr says a source is not opened yet, and why when ``library`` is missing here.

    ``library`` is the module a backend needs (``"zarr"``, ``"h5py"``...); its ``HAS_*``
    flag decides.
    """
    if library is not None and not globals().get(f"HAS_{library.upper()}", True):
        return f"not opened: {library} is not installed here"
    return "not opened yet"
