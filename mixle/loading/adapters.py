"""Adapters a Loader hands itself to (JAX), registered from above instead of imported.

The adapters sit above the Loader in the layer order of ``docs/architecture.md``, so the
Loader never imports them: an adapter's package registers its builder here when it is
imported (``mixle.jax`` registers :meth:`mixle.jax.JaxLoader.from_loader`), and
:func:`adapt` imports that package by name the first time a Loader asks for it, so
``Loader.to_jax()`` works whether or not the user imported ``mixle.jax`` first.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

__all__ = ["adapt", "register_adapter"]

#: Adapter name -> the package that registers it on import.
ADAPTER_PACKAGES: dict[str, str] = {"jax": "mixle.jax"}

_builders: dict[str, Callable[..., Any]] = {}


def register_adapter(name: str, build: Callable[..., Any]) -> None:
    """Register ``build(loader, **options)`` as adapter ``name`` (its package does this)."""
    _builders[name] = build


def adapt(name: str, loader: Any, **options: Any) -> Any:
    """``loader`` handed to adapter ``name`` with ``options``, its package imported on use.

    Raises
    ------
    ValueError
        ``name`` is no adapter's name.
    ImportError
        The adapter's optional dependency is not installed (its package says which extra).
    """
    if name not in _builders:
        if name not in ADAPTER_PACKAGES:
            raise ValueError(f"adapter={name!r} is not one of {sorted(ADAPTER_PACKAGES)}")
        importlib.import_module(ADAPTER_PACKAGES[name])  # registers itself on import
    return _builders[name](loader, **options)
