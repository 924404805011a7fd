"""Argument checks shared across mixle, with errors that name the argument and value."""

from __future__ import annotations

import operator

import numpy as np

__all__ = ["parse_int"]


def parse_int(value: object, name: str) -> int:
    """Return ``value`` as an int; Python and NumPy integers pass, bools and floats do not.

    Raises
    ------
    TypeError
        Naming ``name`` and the value.
    """
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name}={value!r} must be an int, not a bool")
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"{name}={value!r} must be an int") from None
