"""How reports spell sizes, shapes, codecs and fill values."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = [
    "BLOSC_SHUFFLE",
    "count_text",
    "fill_text",
    "filter_label",
    "format_bytes",
    "patch_text",
    "plain_value",
    "shape_text",
    "spell_codec",
    "spell_value",
    "times_text",
]

#: Blosc's shuffle modes by number (numcodecs and the HDF5 blosc filter use numbers).
BLOSC_SHUFFLE = {-1: "auto", 0: "noshuffle", 1: "shuffle", 2: "bitshuffle"}


def format_bytes(n: float) -> str:
    """``n`` bytes in binary units: ``"512 B"``, ``"64 KiB"``, ``"1.5 GiB"``."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            text = f"{value:.0f}" if unit == "B" or value == int(value) else f"{value:.3g}"
            return f"{text} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def times_text(x: float) -> str:
    """A read amplification as text: ``"3.41x"``, ``"4,096x"``."""
    return f"{x:,.0f}x" if x >= 100 else f"{x:.3g}x"


def shape_text(shape: Sequence[int]) -> str:
    """A shape as text: ``"(64, 64)"``, ``"(4,)"``."""
    return "(" + ", ".join(str(int(s)) for s in shape) + ("," if len(shape) == 1 else "") + ")"


def patch_text(patch: Sequence[int]) -> str:
    """A patch shape as text: ``"32^3"`` for cubes, else ``"8x64x64"``."""
    if len(set(patch)) == 1 and len(patch) > 1:
        return f"{patch[0]}^{len(patch)}"
    return "x".join(str(p) for p in patch)


def plain_value(value: Any) -> Any:
    """A fill value as JSON-able data (non-finite floats as ``"NaN"``/``"Infinity"``)."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, complex):
        return [plain_value(value.real), plain_value(value.imag)]
    if isinstance(value, bytes):
        return value.decode("latin-1")
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def count_text(n: float, noun: str, plural: str | None = None) -> str:
    """``n`` and ``noun`` in agreement: ``"1 chunk"``, ``"4.08 chunks"``, ``"0 chunks"``.

    Non-integral counts are shown to three significant digits; only a count that reads as
    exactly ``1`` takes the singular.
    """
    number = f"{n:,}" if isinstance(n, int) else f"{n:.3g}"
    if number == "1":
        return f"1 {noun}"
    return f"{number} {plural if plural is not None else noun + 's'}"


def fill_text(value: Any, dtype: str) -> str:
    """A report's fill value as NumPy prints it: ``nan``, ``-inf``, ``0.0``, ``(nan+1j)``.

    Reports keep non-finite floats JSON-able (``"NaN"``, ``"Infinity"``, see
    :func:`plain_value`); for float and complex dtypes these are turned back into numbers.
    """
    if value is None:
        return "none"
    try:
        kind = np.dtype(dtype).kind
    except TypeError:
        kind = ""
    if kind and kind in "fc":
        numbers = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
        if isinstance(value, list) and len(value) == 2:
            real, imag = (numbers.get(v, v) if isinstance(v, str) else v for v in value)
            return repr(complex(real, imag))
        if isinstance(value, str) and value in numbers:
            return repr(numbers[value])
    return repr(value)


def filter_label(name: bytes) -> str:
    """An HDF5 filter's registered name without the URL its authors appended.

    Plugins register names such as ``"bitshuffle; see https://github.com/kiyo-masui/bitshuffle"``
    or ``"blosc (http://blosc.org)"``; the report shows ``"bitshuffle"``, ``"blosc"``.
    """
    text = name.decode("ascii", "replace").strip("\x00 ")
    text = re.split(r";|\(?\s*\b(?:https?://|www\.)|\bsee\s", text, maxsplit=1)[0]
    return text.strip(" ,:-(") or "filter"


def spell_codec(name: str, config: dict[str, Any]) -> str:
    """``name(key=value, ...)``; nested codec lists spelled the same way."""
    parts = [f"{k}={spell_value(v)}" for k, v in config.items()]
    return f"{name}({', '.join(parts)})" if parts else name


def spell_value(value: Any) -> str:
    """One configuration value as text (codec dicts and codec lists spelled out)."""
    if isinstance(value, dict) and "name" in value:
        return spell_codec(value["name"], dict(value.get("configuration") or {}))
    if isinstance(value, (list, tuple)):
        if value and all(isinstance(v, dict) and "name" in v for v in value):
            return "[" + " -> ".join(spell_value(v) for v in value) + "]"
        return shape_text(value) if all(isinstance(v, int) for v in value) else str(list(value))
    return str(getattr(value, "value", value))
