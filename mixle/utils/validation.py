"""Argument checks shared across mixle, with errors that name the argument and value."""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence

import numpy as np

__all__ = ["parse_choice", "parse_int", "parse_timeout"]


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


def parse_choice(value: object, name: str, choices: Sequence[str]) -> str:
    """Return ``value`` if it is one of the strings ``choices``.

    Raises
    ------
    ValueError
        Naming ``name``, the value and every accepted choice.
    """
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name}={value!r} must be one of {', '.join(map(repr, choices))}")
    return value


def parse_timeout(timeout: object, name: str = "timeout") -> float | None:
    """Validate a timeout in seconds: ``None`` (no limit) or a positive finite number."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name}={timeout!r} must be a number of seconds or None")
    value = float(timeout)
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{name}={timeout!r} must be a positive, finite number of seconds")
    return value
