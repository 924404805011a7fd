"""What a user's callable accepts, read from its signature."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

__all__ = ["takes_rng"]


def takes_rng(fn: Callable[..., Any]) -> bool:
    """Whether ``transform`` wants ``(batch, rng)``: two required positional parameters, or
    a second positional parameter named ``rng``.

    A callable whose signature cannot be read (some builtins) or that takes ``*args`` gets
    the batch alone, as before two-argument transforms existed.
    """
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return False
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    positional = [p for p in params if p.kind in kinds]
    required = [p for p in positional if p.default is inspect.Parameter.empty]
    return len(required) >= 2 or (len(positional) >= 2 and positional[1].name == "rng")
