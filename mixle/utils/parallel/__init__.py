"""Worker-resident encoded shards of indexable data, with map/reduce over them.

``MPEncodedData`` runs local worker processes; ``DaskEncodedData`` runs on a Dask cluster;
``encoded_data(data, backend=...)`` picks one by name. Backend modules are imported on
first use, so importing this package stays cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from mixle.utils.parallel.registry import (
    available_backends,
    encoded_data,
    register_encoded_data_backend,
)

if TYPE_CHECKING:
    from mixle.utils.parallel.base import EncodedData
    from mixle.utils.parallel.dask_backend import DaskEncodedData
    from mixle.utils.parallel.multiprocessing import MPEncodedData

__all__ = [
    "DaskEncodedData",
    "EncodedData",
    "MPEncodedData",
    "available_backends",
    "encoded_data",
    "register_encoded_data_backend",
]

_LAZY = {
    "EncodedData": "mixle.utils.parallel.base",
    "MPEncodedData": "mixle.utils.parallel.multiprocessing",
    "DaskEncodedData": "mixle.utils.parallel.dask_backend",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
