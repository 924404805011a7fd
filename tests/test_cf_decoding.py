"""CFDecoding equals xarray's own CF decode (CFMaskCoder + CFScaleOffsetCoder), values and dtype.

Each case decodes the same stored values with the same attributes twice: with
``xarray.conventions.decode_cf_variable(..., mask_and_scale=True, decode_times=False)`` and
with :class:`CFDecoding`; elements (NaN equal to NaN) and dtypes must be identical.
"""

from __future__ import annotations

import re
import warnings
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from mixle.data.sources.arrays.cf import (
    CFAttributes,
    CFDecoding,
    PackedVariableWarning,
    hdf5_cf_attributes,
    packed_message,
    parse_mask_and_scale,
    warn_packed,
)

xr = pytest.importorskip("xarray")

INTS = ["int8", "uint8", "int16", ">i2", "uint16", "int32", "<u4", "int64"]
FLOATS = ["float16", "float32", ">f4", "float64"]


def stored_values(dtype: np.dtype) -> np.ndarray:
    """Values that include the fill values below, zero, extremes and ordinary numbers."""
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        picks = [info.min, info.max, 0, 1, 7, -1, -999, 200, 255, 127, -128, info.max - 1]
        picks = [v for v in picks if info.min <= v <= info.max]
    else:
        picks = [0.0, 1.5, -1.0, -999.0, np.nan, 3.25, 1e4, -7.0]
    return np.array(picks * 2, dtype=dtype).reshape(2, -1)


def fill_for(dtype: np.dtype) -> Any:
    if dtype.kind == "u":
        return dtype.type(np.iinfo(dtype).max)
    if dtype.kind == "i":
        return dtype.type(-1)
    return dtype.type(-999.0)


def cases() -> list[tuple[str, dict[str, Any]]]:
    out: list[tuple[str, dict[str, Any]]] = []
    for name in INTS + FLOATS:
        dtype = np.dtype(name)
        fv = fill_for(dtype)
        other = dtype.type(7)
        out += [
            (name, {}),
            (name, {"_FillValue": fv}),
            (name, {"missing_value": np.array([fv, other], dtype=dtype)}),
            (name, {"_FillValue": fv, "missing_value": other}),
            (name, {"scale_factor": 0.5}),
            (name, {"scale_factor": np.float32(0.25), "add_offset": np.float32(3)}),
            (name, {"scale_factor": 0.1, "add_offset": 5}),
            (name, {"scale_factor": 0.1, "add_offset": 5.0, "_FillValue": fv}),
            (name, {"scale_factor": np.float32(0.5), "_FillValue": fv}),
            (name, {"add_offset": 10}),
            (name, {"add_offset": np.float32(-2.5), "missing_value": fv}),
            (name, {"scale_factor": None}),
        ]
        if dtype.kind in "iu":
            out += [
                (name, {"_Unsigned": "true", "_FillValue": fv}),
                (name, {"_Unsigned": "true"}),
                (name, {"_Unsigned": "true", "scale_factor": 0.5, "_FillValue": fv}),
                (name, {"_Unsigned": "false", "missing_value": other}),
                (name, {"scale_factor": 2}),
                (name, {"_FillValue": np.nan}),  # xarray drops a NaN fill of integers
            ]
        else:
            out += [
                (name, {"_FillValue": np.nan}),
                (name, {"_FillValue": np.nan, "scale_factor": 0.5}),
                (name, {"_Unsigned": "true", "_FillValue": fv}),  # ignored on floats
            ]
    return out


def xarray_decode(raw: np.ndarray, attrs: dict[str, Any]) -> np.ndarray:
    var = xr.Variable(("y", "x"), raw.copy(), dict(attrs))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # its SerializationWarnings about odd attributes
        decoded = xr.conventions.decode_cf_variable(
            "v", var, mask_and_scale=True, decode_times=False
        )
        return np.asarray(decoded.values)


@pytest.mark.parametrize(("dtype", "attrs"), cases(), ids=lambda v: str(v))
def test_decoding_equals_xarrays_values_and_dtype(dtype: str, attrs: dict[str, Any]) -> None:
    raw = stored_values(np.dtype(dtype))
    want = xarray_decode(raw, attrs)
    decoding = CFDecoding.from_attributes(attrs, raw.dtype, where="v")
    got = raw if decoding is None else decoding.decode(raw)
    if decoding is None:  # nothing to decode: the stored values, in the stored byte order
        assert got.dtype.newbyteorder("=") == want.dtype
    else:
        assert decoding.dtype == want.dtype == got.dtype, (decoding.dtype, want.dtype)
    np.testing.assert_array_equal(got, want)
    assert not np.shares_memory(got, raw) or decoding is None


def test_decode_does_not_touch_the_stored_chunk() -> None:
    raw = np.array([[-1, 2, 3]], dtype="int16")
    raw.setflags(write=False)  # chunks from a cache or a memory map may be read-only
    decoding = CFDecoding.from_attributes(
        {"_FillValue": np.int16(-1), "scale_factor": 0.5}, raw.dtype, where="v"
    )
    assert decoding is not None
    np.testing.assert_array_equal(decoding.decode(raw), [[np.nan, 1.0, 1.5]])
    np.testing.assert_array_equal(raw, [[-1, 2, 3]])


def test_a_zero_d_chunk_decodes() -> None:
    decoding = CFDecoding.from_attributes({"_FillValue": -1}, np.int16, where="v")
    assert decoding is not None
    assert np.isnan(decoding.decode(np.array(-1, dtype="int16")))
    assert decoding.decode(np.array(4, dtype="int16")) == 4.0


def test_complex_fill_values_become_complex_nan() -> None:
    raw = np.array([1 + 2j, -1 + 0j], dtype="complex64")
    attrs = {"_FillValue": np.complex64(-1)}
    want = xarray_decode(raw.reshape(1, 2), attrs)
    got = CFDecoding.from_attributes(attrs, raw.dtype, where="v").decode(raw)  # type: ignore[union-attr]
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want[0])
    assert np.isnan(got[1].real) and np.isnan(got[1].imag)


def test_several_missing_values_all_become_nan() -> None:
    raw = np.array([[-999, -998, 0, 5, -1]], dtype="int32")
    attrs = {"missing_value": [-999, -998], "_FillValue": -1}
    got = CFDecoding.from_attributes(attrs, raw.dtype, where="v").decode(raw)  # type: ignore[union-attr]
    np.testing.assert_array_equal(got, [[np.nan, np.nan, 0.0, 5.0, np.nan]])
    np.testing.assert_array_equal(got, xarray_decode(raw, attrs))


def test_a_one_element_list_is_that_number() -> None:
    # xarray turns a lone one-element-list scale_factor into an object array; mixle decodes
    # the number (and equals xarray where xarray gives floats)
    raw = np.array([[2, 4]], dtype="int16")
    lone = CFDecoding.from_attributes({"scale_factor": [0.5]}, raw.dtype, where="v")
    assert lone is not None and lone.dtype == np.float64
    np.testing.assert_array_equal(lone.decode(raw), [[1.0, 2.0]])
    attrs = {"scale_factor": [0.5], "add_offset": [1.0]}
    both = CFDecoding.from_attributes(attrs, raw.dtype, where="v")
    want = xarray_decode(raw, attrs)
    assert both is not None and both.dtype == want.dtype
    np.testing.assert_array_equal(both.decode(raw), want)


def test_an_array_of_one_keeps_its_float32_type() -> None:
    decoding = CFDecoding.from_attributes(
        {"scale_factor": np.array([0.5], dtype="float32")}, np.int16, where="v"
    )
    assert decoding is not None and decoding.dtype == np.float32


def test_unsigned_false_reinterprets_the_fill_value_bits() -> None:
    # xarray raises OverflowError here; the CF meaning is the same bits as signed
    raw = np.array([0, 255, 128, 3], dtype="uint8")
    decoding = CFDecoding.from_attributes(
        {"_Unsigned": "false", "_FillValue": np.uint8(255)}, raw.dtype, where="v"
    )
    assert decoding is not None and decoding.dtype == np.float32
    np.testing.assert_array_equal(decoding.decode(raw), [0.0, np.nan, -128.0, 3.0])


@pytest.mark.parametrize(
    ("attrs", "named"),
    [
        ({"scale_factor": "0.1"}, "scale_factor='0.1'"),
        ({"add_offset": "five"}, "add_offset='five'"),
        ({"scale_factor": True}, "scale_factor=True"),
        ({"scale_factor": [0.1, 0.2]}, "holds 2 values"),
        ({"add_offset": np.array([], dtype="f8")}, "holds 0 values"),
        ({"scale_factor": 1 + 2j}, "scale_factor=(1+2j)"),
        ({"_FillValue": "n/a"}, "_FillValue='n/a'"),
        ({"missing_value": [1, "x"]}, "missing_value=[1, 'x']"),
    ],
)
def test_attributes_that_are_no_numbers_are_refused_by_name(
    attrs: dict[str, Any], named: str
) -> None:
    with pytest.raises(ValueError, match=re.escape("ZarrArraySource('x.zarr')")) as info:
        CFDecoding.from_attributes(attrs, np.int16, where="ZarrArraySource('x.zarr')")
    assert named in str(info.value)
    assert "mask_and_scale=False" in str(info.value)


def test_an_integer_scale_factor_with_fill_values_is_refused() -> None:
    # xarray: "cannot convert float NaN to integer" at read time; here at open, by name
    with pytest.raises(ValueError, match="scale_factor=2 is an integer"):
        CFDecoding.from_attributes({"scale_factor": 2, "_FillValue": -1}, np.int16, where="v")


def test_cf_attributes_on_a_non_numeric_dtype_are_refused() -> None:
    with pytest.raises(ValueError, match="dtype bool"):
        CFDecoding.from_attributes({"_FillValue": 0}, np.bool_, where="v")
    assert CFDecoding.from_attributes({"_FillValue": None}, np.bool_, where="v") is None


def test_nothing_to_decode_gives_none() -> None:
    assert CFDecoding.from_attributes({}, np.int16, where="v") is None
    assert CFDecoding.from_attributes({"units": "m"}, np.int16, where="v") is None
    assert CFDecoding.from_attributes({"_FillValue": np.nan}, np.float32, where="v") is None
    assert CFDecoding.from_attributes({"_Unsigned": "false"}, np.int8, where="v") is None


@pytest.mark.parametrize("bad", ["yes", 1, None, 0.0])
def test_mask_and_scale_must_be_a_bool(bad: object) -> None:
    with pytest.raises(TypeError, match=re.escape(f"mask_and_scale={bad!r} must be True")):
        parse_mask_and_scale(bad)
    assert parse_mask_and_scale(np.bool_(True)) is True


def test_the_warning_comes_once_per_location_and_says_how_to_unpack() -> None:
    attrs = CFAttributes({"scale_factor": 0.1, "_FillValue": -9}, ("_FillValue", "scale_factor"))
    where = "HDF5ArraySource('once.h5', dataset='t')"
    with pytest.warns(PackedVariableWarning, match="mask_and_scale=True") as caught:
        warn_packed(attrs, np.int16, where)
    assert where in str(caught[0].message) and "int16 -> float64" in str(caught[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert warn_packed(attrs, np.int16, where) is not None  # the message, not warned again


def test_undeclared_or_identity_attributes_do_not_warn() -> None:
    undeclared = CFAttributes({"_FillValue": np.uint8(0)}, ())  # a plain zarr v2 fill_value
    assert packed_message(undeclared, np.uint8, "a") is None
    nan_fill = CFAttributes({"_FillValue": np.nan}, ("_FillValue",))
    assert packed_message(nan_fill, np.float32, "b") is None
    broken = CFAttributes({"scale_factor": "x"}, ("scale_factor",))
    assert "cannot decode" in str(packed_message(broken, np.int16, "c"))


def test_hdf5_attributes_read_as_h5netcdf_reads_them(tmp_path: Any) -> None:
    h5py = pytest.importorskip("h5py")
    path = tmp_path / "attrs.h5"
    with h5py.File(path, "w") as f:
        d = f.create_dataset("v", data=np.zeros(3, dtype="int8"))
        d.attrs["scale_factor"] = np.array([0.5], dtype="float32")
        d.attrs["add_offset"] = np.float64(1.0)
        d.attrs["_FillValue"] = np.array([-1], dtype="int8")
        d.attrs["missing_value"] = np.array([-2, -3], dtype="int8")
        d.attrs.create("_Unsigned", np.array(b"true", dtype="S4"))
        d.attrs["units"] = "m"
        e = f.create_dataset("empty", data=np.zeros(3, dtype="int8"))
        e.attrs["_FillValue"] = h5py.Empty("int8")
    with h5py.File(path, "r") as f:
        found = hdf5_cf_attributes(f["v"])
        assert found.values["scale_factor"] == 0.5
        assert np.dtype(type(found.values["scale_factor"])) == np.float32
        assert found.values["_FillValue"] == -1 and found.values["_Unsigned"] == "true"
        assert list(found.values["missing_value"]) == [-2, -3]
        assert "units" not in found.values
        assert hdf5_cf_attributes(f["empty"]).values == {}


DTYPES = st.sampled_from(INTS + FLOATS)


@st.composite
def packed_variables(draw: st.DrawFn) -> tuple[np.ndarray, dict[str, Any]]:
    """Stored values of a random dtype and a random set of CF attributes for them."""
    dtype = np.dtype(draw(DTYPES))
    raw = draw(hnp.arrays(dtype, draw(hnp.array_shapes(min_dims=2, max_dims=2, max_side=6))))
    element = hnp.from_dtype(dtype.newbyteorder("="), allow_nan=False, allow_infinity=False)
    attrs: dict[str, Any] = {}
    if draw(st.booleans()):
        attrs["_FillValue"] = draw(st.sampled_from(list(raw.ravel()[:3])) | element)
    if draw(st.booleans()):
        attrs["missing_value"] = np.array(draw(st.lists(element, min_size=1, max_size=3)), dtype)
    number = st.floats(-1e3, 1e3, allow_nan=False, width=32) | st.integers(-100, 100)
    typed = st.sampled_from([float, np.float32, np.float64])
    for key in ("scale_factor", "add_offset"):
        if draw(st.booleans()):
            value = draw(number)
            attrs[key] = (
                value if isinstance(value, int) and key == "add_offset" else draw(typed)(value)
            )
    if dtype.kind in "iu" and draw(st.booleans()):
        attrs["_Unsigned"] = draw(st.sampled_from(["true", "false"]))
    return raw, attrs


@settings(max_examples=200, deadline=None)
@given(packed_variables())
def test_random_packed_variables_decode_as_xarray_does(
    case: tuple[np.ndarray, dict[str, Any]],
) -> None:
    raw, attrs = case
    try:
        decoding = CFDecoding.from_attributes(attrs, raw.dtype, where="v")
    except ValueError:
        return  # refused by name (tested above); xarray fails or gives objects there
    try:
        want = xarray_decode(raw, attrs)
    except (OverflowError, ValueError):  # where xarray fails, mixle decodes the CF meaning
        return
    got = raw if decoding is None else decoding.decode(raw)
    assert got.dtype.newbyteorder("=") == want.dtype
    np.testing.assert_array_equal(got, want)
