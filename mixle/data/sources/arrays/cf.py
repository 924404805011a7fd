"""CF packing of stored values (``scale_factor``, ``add_offset``, fill values), decoded as xarray.

netCDF files and xarray-written zarr stores often keep floats packed into small integers
(``value = stored * scale_factor + add_offset``) and mark missing values with ``_FillValue``
or ``missing_value``. :class:`CFDecoding` is the pure, per-chunk form of xarray's
``CFMaskCoder`` followed by ``CFScaleOffsetCoder`` (``xarray.coding.variables``): the same
``_Unsigned`` reinterpretation, the same fill values turned into NaN, the same dtype
promotion (``_choose_float_dtype``), the same arithmetic, so every element and the dtype
equal ``xr.open_dataset(..., mask_and_scale=True, decode_times=False)``.

The attributes come from the format as xarray's backend hands them to its coders:
:func:`zarr_cf_attributes` (format 2: the array's ``fill_value`` is the ``_FillValue``, as
xarray reads format 2; format 3: the ``_FillValue`` attribute, base64-encoded for floats) and
:func:`hdf5_cf_attributes` (netCDF-4 and plain HDF5: one-element attribute arrays as their
element and text as ``str``, as h5netcdf reads them; HDF5's own fill value is not the CF one).

Notes
-----
Times are not decoded: ``units`` such as ``"days since 2000-01-01"`` leave the numbers as
numbers (xarray's ``decode_times=False``). Where xarray fails or gives an object array, this
module either decodes the evident meaning or raises a ``ValueError`` naming the attribute and
the variable, never a different value: a one-element list as ``scale_factor`` is that
number; ``_Unsigned="false"`` converts the ``_FillValue`` bit for bit; a format-3 float
``_FillValue`` may also be a plain number or ``"NaN"``/``"Infinity"``/``"-Infinity"``; fill
values on non-numeric dtypes, an integer ``scale_factor`` together with a fill value, and
``scale_factor``/``add_offset`` that are not one real number raise.
"""

from __future__ import annotations

import base64
import binascii
import math
import os
import struct
import sys
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import DTypeLike

from mixle.errors import PackedVariableWarning

__all__ = [
    "CF_ATTRIBUTES",
    "CFAttributes",
    "CFDecoding",
    "PackedVariableWarning",
    "hdf5_cf_attributes",
    "parse_mask_and_scale",
    "warn_packed",
    "zarr_cf_attributes",
]

#: The attributes CF decoding reads, in xarray's order of application.
CF_ATTRIBUTES = ("_Unsigned", "missing_value", "_FillValue", "scale_factor", "add_offset")
#: Attributes that hold fill values (several values each, possibly).
_FILL_KEYS = ("missing_value", "_FillValue")
#: Attributes that hold one number each.
_SCALE_KEYS = ("scale_factor", "add_offset")
#: Dtype kinds CF decoding applies to: integers and floats (complex: masking only).
_NUMERIC = "iufc"
#: zarr's spelling of non-finite float fill values (format 3).
_ZARR_SPECIAL = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}

#: Locations warned about by :func:`warn_packed` in this process (one warning each).
_warned: set[str] = set()
#: mixle's own folder: warnings point at the first caller outside it.
_PACKAGE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__))))


def parse_mask_and_scale(value: object) -> bool:
    """``mask_and_scale`` checked to be a bool.

    Raises
    ------
    TypeError
        When ``value`` is not ``True`` or ``False``.
    """
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(
            f"mask_and_scale={value!r} must be True (decode CF scale_factor, add_offset and "
            "fill values as xarray does) or False (the stored values)"
        )
    return bool(value)


@dataclass(frozen=True)
class CFAttributes:
    """The CF attributes of one array, as xarray's backend passes them to its coders.

    Attributes
    ----------
    values
        ``{name: value}`` for the names in :data:`CF_ATTRIBUTES` that apply.
    declared
        The names the array's metadata spells out as CF attributes (a format-2 zarr
        ``fill_value`` counts only in an xarray-written store); only these make
        :func:`warn_packed` warn.
    """

    values: dict[str, Any]
    declared: tuple[str, ...]


@dataclass(frozen=True)
class CFDecoding:
    """How stored values of one array become the values xarray decodes, chunk by chunk.

    Build one with :meth:`from_attributes`; :meth:`decode` is elementwise, so it applies to
    every chunk, box or region alike. ``None`` stages are skipped.

    Attributes
    ----------
    stored
        The stored dtype.
    dtype
        The decoded dtype (native byte order).
    unsigned
        The integer dtype ``_Unsigned`` reinterprets the stored values as, or ``None``.
    mask_dtype
        The dtype the values are cast to before fill values become NaN (``None``: no mask).
    fill_values
        The encoded values that read as NaN.
    scale_dtype
        The dtype of the scale/offset stage (``None``: no such stage).
    scale_factor, add_offset
        The numbers, or ``None``.
    """

    stored: np.dtype
    dtype: np.dtype
    unsigned: np.dtype | None = None
    mask_dtype: np.dtype | None = None
    fill_values: tuple[Any, ...] = ()
    scale_dtype: np.dtype | None = None
    scale_factor: Any = None
    add_offset: Any = None

    @classmethod
    def from_attributes(
        cls, attrs: Mapping[str, Any], stored: DTypeLike, *, where: str
    ) -> CFDecoding | None:
        """The decoding that ``attrs`` ask for on values of dtype ``stored``, or ``None``.

        ``None`` when decoding would change nothing (no CF attribute, or only a NaN
        ``_FillValue`` on floats). ``where`` names the variable in errors.

        Raises
        ------
        ValueError
            When an attribute is not what CF allows: ``scale_factor``/``add_offset`` not one
            real number, fill values that are not numbers, CF attributes on a non-numeric
            dtype, or fill values with an integer decoded dtype (an integer ``scale_factor``).
        """
        stored = np.dtype(stored)
        attrs = {k: attrs[k] for k in CF_ATTRIBUTES if k in attrs}
        packed = any(k in attrs for k in _SCALE_KEYS)  # even as None: xarray casts to float
        if not packed and all(v is None for v in attrs.values()):
            return None
        if stored.kind not in _NUMERIC:
            raise ValueError(
                f"{where}: CF attributes {', '.join(sorted(attrs))} on dtype {stored}, which "
                "mask_and_scale=True does not decode (it decodes numbers only); open it with "
                "mask_and_scale=False to read the stored values"
            )
        current = stored
        # -- CFMaskCoder: _Unsigned, then fill values --------------------------------------
        raw_fill: dict[str, Any] = {}
        fills: list[Any] = []
        for key in _FILL_KEYS:
            value = attrs.get(key)
            if value is None:
                continue
            kept = _fill_numbers(value, key, where)
            if not kept and stored.kind in "iu":
                continue  # a NaN fill of integers: xarray drops it (with a warning)
            raw_fill[key] = value
            fills.extend(v for v in kept if not any(_same(v, f) for f in fills))
        unsigned = None
        flag = attrs.get("_Unsigned")
        if isinstance(flag, str) and stored.kind in "iu":
            converts = {"i": "true", "u": "false"}[stored.kind]  # the other kind is as stored
            if flag == converts:
                unsigned = np.dtype(f"{'u' if stored.kind == 'i' else 'i'}{stored.itemsize}")
                if "_FillValue" in raw_fill:
                    old = _fill_numbers(raw_fill["_FillValue"], "_FillValue", where)
                    fills = [f for f in fills if not any(_same(f, o) for o in old)]
                    fills.extend(_reinterpret(v, stored, unsigned) for v in old)
                current = unsigned
        scale = _one_number(attrs.get("scale_factor"), "scale_factor", where)
        offset = _one_number(attrs.get("add_offset"), "add_offset", where)
        mask_dtype = None
        if fills:
            if packed:
                mask_dtype = _choose_float_dtype(current, scale, offset)
            else:
                mask_dtype = _promote(current)
            if mask_dtype.kind not in "fc":
                raise ValueError(
                    f"{where}: scale_factor={scale!r} is an integer, so the decoded values "
                    f"are {mask_dtype} and cannot hold NaN for the fill values "
                    f"{_shown(fills)}; open it with mask_and_scale=False to read the stored "
                    "values"
                )
            current = mask_dtype
        # -- CFScaleOffsetCoder -------------------------------------------------------------
        scale_dtype = None
        if packed:
            scale_dtype = current if raw_fill else _choose_float_dtype(current, scale, offset)
            current = scale_dtype
        if unsigned is None and mask_dtype is None and scale_dtype is None:
            return None
        return cls(
            stored=stored,
            dtype=np.dtype(current).newbyteorder("="),
            unsigned=unsigned,
            mask_dtype=None if mask_dtype is None else mask_dtype.newbyteorder("="),
            fill_values=tuple(fills) if mask_dtype is not None else (),
            scale_dtype=None if scale_dtype is None else scale_dtype.newbyteorder("="),
            scale_factor=scale,
            add_offset=offset,
        )

    def decode(self, raw: np.ndarray) -> np.ndarray:
        """The decoded values of stored values ``raw`` (a new array of :attr:`dtype`)."""
        # IEEE results, as xarray gives them: inf * 0 is NaN, a cast or product past the
        # dtype's range is inf
        with np.errstate(invalid="ignore", over="ignore"):
            return self._decode(np.asarray(raw))

    def _decode(self, data: np.ndarray) -> np.ndarray:
        if self.unsigned is not None:
            data = np.asarray(data, dtype=self.unsigned)
        if self.mask_dtype is not None:
            data = np.array(data, dtype=self.mask_dtype, copy=True)
            missing = np.zeros(data.shape, dtype=bool)
            for value in self.fill_values:
                missing |= data == value
            data[missing] = complex(math.nan, math.nan) if data.dtype.kind == "c" else math.nan
        if self.scale_dtype is not None:
            fresh = self.mask_dtype is not None and data.dtype == self.scale_dtype
            data = data.astype(self.scale_dtype, copy=not fresh)
            if self.scale_factor is not None:
                data *= self.scale_factor
            if self.add_offset is not None:
                data += self.add_offset
        return data

    def describe(self) -> str:
        """What the decoding does, for messages: ``"int16 -> float64 (scale_factor=0.1...)"``."""
        parts = []
        if self.unsigned is not None:
            parts.append(f"_Unsigned as {self.unsigned}")
        if self.scale_factor is not None:
            parts.append(f"scale_factor={_short(self.scale_factor)}")
        if self.add_offset is not None:
            parts.append(f"add_offset={_short(self.add_offset)}")
        if self.fill_values:
            parts.append(f"{_shown(list(self.fill_values))} as NaN")
        return f"{self.stored} -> {self.dtype} ({', '.join(parts)})"


def warn_packed(attrs: CFAttributes, stored: DTypeLike, where: str) -> str | None:
    """Warn once per ``where`` that an array read raw holds CF-packed values.

    Returns the message (also when it was already given), or ``None`` when nothing is
    packed: no declared CF attribute, or one that decodes to the stored values.
    """
    message = packed_message(attrs, stored, where)
    if message is not None and where not in _warned:
        _warned.add(where)
        warnings.warn(message, PackedVariableWarning, stacklevel=_outside_mixle())
    return message


def _outside_mixle() -> int:
    """The ``stacklevel`` of the first caller of :func:`warn_packed` outside mixle."""
    frame, level = sys._getframe(2), 2  # level 2: the caller of warn_packed
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE + os.sep):
        frame, level = frame.f_back, level + 1  # type: ignore[assignment]
    return level


def packed_message(attrs: CFAttributes, stored: DTypeLike, where: str) -> str | None:
    """Why an array read with ``mask_and_scale=False`` holds packed values, or ``None``."""
    if not attrs.declared or np.dtype(stored).kind not in _NUMERIC:
        return None  # nothing declared, or no numbers to unpack
    named = ", ".join(f"{k}={_short(attrs.values.get(k))}" for k in attrs.declared)
    try:
        decoding = CFDecoding.from_attributes(attrs.values, stored, where=where)
    except ValueError as exc:
        return (
            f"{where} has CF packing attributes ({named}) that mixle cannot decode ({exc}); "
            "it reads the stored values"
        )
    if decoding is None:
        return None
    return (
        f"{where} is CF-packed ({named}): it reads the stored {decoding.stored} values; pass "
        f"mask_and_scale=True to unpack them as xarray does ({decoding.describe()})"
    )


def zarr_cf_attributes(array: Any) -> CFAttributes:
    """The CF attributes of a ``zarr.Array`` as xarray's zarr backend reads them.

    Format 2: the array's ``fill_value`` is the ``_FillValue`` (xarray's default for format
    2, ``use_zarr_fill_value_as_mask=True``), for numeric dtypes; it counts as declared only
    in an xarray-written store (``_ARRAY_DIMENSIONS``) that declares other CF attributes
    too, so arrays with only a fill value (plain zarr, tifffile's store) do not warn.
    Format 3: the ``_FillValue`` attribute, decoded as xarray encodes it (base64 of a
    little-endian float64 for floats).
    """
    attrs = dict(array.attrs)
    dtype = np.dtype(array.dtype) if isinstance(array.dtype, np.dtype) else None
    values = {k: attrs[k] for k in CF_ATTRIBUTES if k in attrs}
    declared = {k for k in CF_ATTRIBUTES if attrs.get(k) is not None}
    if array.metadata.zarr_format == 2:
        fill = array.fill_value
        if dtype is not None and dtype.kind in _NUMERIC and fill is not None:
            values["_FillValue"] = fill
            if "_ARRAY_DIMENSIONS" in attrs and declared:
                # xarray's CF fill value, beside packing it declared; a fill value alone
                # is every zarr v2 array's (tifffile's store writes _ARRAY_DIMENSIONS too)
                declared.add("_FillValue")
    elif values.get("_FillValue") is not None and dtype is not None:
        values["_FillValue"] = _zarr3_fill(values["_FillValue"], dtype)
    return CFAttributes(values, tuple(k for k in CF_ATTRIBUTES if k in declared))


def hdf5_cf_attributes(dataset: Any) -> CFAttributes:
    """The CF attributes of an ``h5py.Dataset`` as xarray's netCDF-4 backends read them.

    As h5netcdf reads them: a one-element array (netCDF-4 stores every attribute as an
    array) becomes its element, text becomes ``str`` (fill values excepted), and an empty
    attribute is left out. HDF5's own fill value (``dataset.fillvalue``) is not CF's.
    """
    attrs = dataset.attrs
    values: dict[str, Any] = {}
    for key in CF_ATTRIBUTES:
        try:
            if key not in attrs:
                continue
            value = attrs[key]
        except (OSError, TypeError, ValueError) as exc:  # a type h5py cannot read
            values[key] = _Unreadable(exc)
            continue
        if type(value).__name__ == "Empty":  # h5py.Empty: an attribute without a value
            continue
        if isinstance(value, np.ndarray):
            if value.size == 0:
                continue
            if value.dtype.kind in "SUO" and key not in _FILL_KEYS:
                value = np.array([_text(v) for v in value.flat], dtype=object)
            if value.ndim and len(value) == 1:
                value = value[0]
        if isinstance(value, (bytes, np.bytes_)) and key not in _FILL_KEYS:
            value = _text(value)
        values[key] = value
    declared = tuple(k for k in CF_ATTRIBUTES if values.get(k) is not None)
    return CFAttributes(values, declared)


# -- xarray's dtype rules --------------------------------------------------------------------
def _choose_float_dtype(dtype: np.dtype, scale: Any, offset: Any) -> np.dtype:
    """xarray's ``_choose_float_dtype``: a float dtype that holds the decoded values."""
    if scale is not None or offset is not None:
        scale_type = None if scale is None else np.dtype(type(scale))
        offset_type = None if offset is None else np.dtype(type(offset))
        if (
            scale_type is not None
            and offset_type == scale_type
            and scale_type in (np.float32, np.float64)
        ):
            if dtype.itemsize == 4 and dtype.kind in "iu":
                return np.dtype(np.float64)  # int32 -> float64 for precision
            return scale_type
        if offset is not None:
            return np.dtype(np.float64)  # a large integer offset: float64, to be safe
        assert scale_type is not None
        return scale_type
    if dtype.itemsize <= 4 and dtype.kind == "f":
        return np.dtype(np.float32)
    if dtype.itemsize <= 2 and dtype.kind in "iu":
        return np.dtype(np.float32)
    return np.dtype(np.float64)


def _promote(dtype: np.dtype) -> np.dtype:
    """xarray's ``maybe_promote`` for numbers: a dtype that holds NaN."""
    if dtype.kind in "fc":
        return dtype
    return np.dtype(np.float32 if dtype.itemsize <= 2 else np.float64)


# -- attribute values ------------------------------------------------------------------------
def _is_real(value: Any) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(
        value, (bool, np.bool_)
    )


def _fill_numbers(value: Any, key: str, where: str) -> list[Any]:
    """The non-NaN values of a fill attribute (xarray: ``np.ravel``, NaN left out)."""
    try:
        flat = np.ravel(value)
    except ValueError:  # a ragged list
        flat = np.array([value], dtype=object)
    if flat.dtype.kind not in "iufc":
        raise ValueError(
            f"{where}: attribute {key}={_short(value)} is not a number or an array of "
            "numbers; CF fill values are numbers of the variable's type (open it with "
            "mask_and_scale=False to read the stored values)"
        )
    return [v for v in flat if not np.isnan(v)]


def _one_number(value: Any, key: str, where: str) -> Any:
    """``scale_factor``/``add_offset`` as one real number (a one-element array's element).

    An array keeps its element's NumPy type (``float32`` decodes to ``float32``); a list
    (zarr JSON) gives a Python number, as xarray's ``.item()`` does.
    """
    if value is None:
        return None
    if isinstance(value, (list, tuple, np.ndarray)):
        try:
            flat = np.ravel(np.asarray(value))
        except ValueError:  # a ragged list
            flat = np.array([value, None], dtype=object)
        if flat.size != 1:
            raise ValueError(
                f"{where}: attribute {key}={_short(value)} holds {flat.size} values; CF "
                "wants one number (open it with mask_and_scale=False to read the stored values)"
            )
        value = flat[0] if isinstance(value, np.ndarray) else flat.item()
    if not _is_real(value):
        raise ValueError(
            f"{where}: attribute {key}={_short(value)} is not a number; CF wants one real "
            "number (open it with mask_and_scale=False to read the stored values)"
        )
    return value


def _reinterpret(value: Any, stored: np.dtype, target: np.dtype) -> Any:
    """A fill value of ``stored`` integers as the same bits read as ``target`` integers."""
    try:
        bits = np.array(value, dtype=stored)
    except (OverflowError, ValueError):  # already written as the reinterpreted number
        return target.type(value)
    return bits.view(target).item()


def _same(a: Any, b: Any) -> bool:
    return bool(a == b)


def _zarr3_fill(value: Any, dtype: np.dtype) -> Any:
    """xarray's ``FillValueCoder.decode`` (zarr format 3), accepting plain numbers too.

    A value that is no fill value of ``dtype`` is returned as it is:
    :meth:`CFDecoding.from_attributes` names it in its error.
    """
    kind = dtype.kind
    if kind == "f" and isinstance(value, str):
        if value in _ZARR_SPECIAL:
            return _ZARR_SPECIAL[value]
        try:
            return struct.unpack("<d", base64.b64decode(value, validate=True))[0]
        except (binascii.Error, struct.error, ValueError):
            return value
    if kind in "iu" and _is_real(value) and float(value).is_integer():
        return int(value)
    if kind == "c" and isinstance(value, (list, tuple)) and len(value) == 2:
        parts = [_zarr3_fill(v, np.dtype(np.float64)) for v in value]
        if all(_is_real(v) for v in parts):
            return complex(parts[0], parts[1])
    return value


class _Unreadable:
    """An attribute h5py could not read; CF decoding refuses it by name."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def __repr__(self) -> str:
        return f"<unreadable: {type(self.error).__name__}: {self.error}>"


def _text(value: Any) -> Any:
    if isinstance(value, (bytes, np.bytes_)):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            return bytes(value)
    return value


def _short(value: Any) -> str:
    text = repr(value.item() if isinstance(value, np.generic) else value)
    return text if len(text) <= 60 else text[:57] + "..."


def _shown(values: list[Any]) -> str:
    return ", ".join(_short(v) for v in values)
