"""Encoded-data backends by name: ``encoded_data(data, backend=...)`` and a plug-in registry.

Built-in backends are ``"multiprocessing"`` (alias ``"mp"``) and ``"dask"``; their modules
are imported only when a handle is built. Further engines (Ray, MPI) register a factory
with :func:`register_encoded_data_backend`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

__all__ = [
    "BackendFactory",
    "available_backends",
    "encoded_data",
    "register_encoded_data_backend",
]

#: ``factory(data, encoder, **options) -> handle`` with ``map``, ``map_reduce``, ``close``...
BackendFactory = Callable[..., Any]

_BUILTIN: dict[str, str] = {
    "multiprocessing": "mixle.utils.parallel.multiprocessing:MPEncodedData",
    "mp": "mixle.utils.parallel.multiprocessing:MPEncodedData",
    "dask": "mixle.utils.parallel.dask_backend:DaskEncodedData",
}
_REGISTERED: dict[str, BackendFactory] = {}


def register_encoded_data_backend(
    name: str, factory: BackendFactory, *, replace: bool = False
) -> None:
    """Make ``encoded_data(data, backend=name)`` call ``factory(data, encoder, **options)``.

    Parameters
    ----------
    name
        The backend's name; a non-empty string.
    factory
        Builds the handle; it should return an
        :class:`~mixle.utils.parallel.base.EncodedData` or an object with the same methods.
    replace
        Allow replacing a backend registered under ``name`` (built-ins included).

    Raises
    ------
    TypeError
        When ``name`` is not a non-empty string or ``factory`` is not callable.
    ValueError
        When ``name`` is taken and ``replace`` is false.
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"name={name!r} must be a non-empty string")
    if not callable(factory):
        raise TypeError(
            f"factory={factory!r} must be callable as factory(data, encoder, **options)"
        )
    if not replace and (name in _REGISTERED or name in _BUILTIN):
        raise ValueError(
            f"name={name!r} is already a registered encoded-data backend; pass replace=True "
            "to replace it or pick another name"
        )
    _REGISTERED[name] = factory


def available_backends() -> list[str]:
    """Names ``encoded_data`` accepts, sorted."""
    return sorted(set(_BUILTIN) | set(_REGISTERED))


def _factory(name: str) -> BackendFactory:
    if name in _REGISTERED:
        return _REGISTERED[name]
    if name in _BUILTIN:
        module, attr = _BUILTIN[name].split(":")
        return getattr(importlib.import_module(module), attr)  # type: ignore[no-any-return]
    raise ValueError(
        f"backend={name!r} is not a registered encoded-data backend; use one of "
        f"{', '.join(map(repr, available_backends()))} or register_encoded_data_backend()"
    )


def encoded_data(
    data: Any, encoder: Any = None, *, backend: str = "multiprocessing", **options: Any
) -> Any:
    """Build worker-resident encoded shards of ``data`` with the named backend.

    ``options`` go to the backend (``num_workers``, ``read_in``, ``timeout``, ``client``...).
    """
    return _factory(backend)(data, encoder, **options)
