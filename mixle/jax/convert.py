"""NumPy batches to ``jax.Array``: the 64-bit dtype policy, device placement and specs.

JAX keeps 32-bit types unless ``jax_enable_x64`` is on. mixle never changes that setting;
instead a 64-bit leaf follows an explicit ``dtype_policy`` while x64 is off:

- ``"safe"`` (default): int64/uint64 become int32/uint32 after checking that every value
  fits (patch coordinates just work); float64/complex128 raise :class:`DtypePolicyError`.
- ``"cast"``: every 64-bit leaf is narrowed to its 32-bit type (integers that do not fit
  wrap around, as ``numpy.ndarray.astype`` does).
- ``"error"``: any 64-bit leaf raises :class:`DtypePolicyError`.

With x64 on (globally, or in a ``jax.enable_x64(True)`` block; in older jax
``jax.experimental.enable_x64()``) leaves keep their dtype under every policy.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np

from mixle.data.spec import ArraySpec, SpecTree
from mixle.errors import DtypeOverflowError, DtypePolicyError
from mixle.utils.optional_deps import require
from mixle.utils.validation import parse_choice

jax = require("jax", feature="mixle.jax")

__all__ = [
    "DTYPE_POLICIES",
    "DtypeOverflowError",
    "DtypePolicy",
    "DtypePolicyError",
    "device_dtype",
    "jax_spec",
    "parse_dtype_policy",
    "spans_processes",
    "to_host",
    "to_jax",
    "x64_enabled",
]

#: What a 64-bit leaf becomes while x64 is off: ``"safe"`` narrows integers after checking
#: every value fits and refuses floats, ``"cast"`` narrows everything, ``"error"`` refuses.
DtypePolicy = Literal["safe", "cast", "error"]
#: The accepted values of ``dtype_policy``.
DTYPE_POLICIES: tuple[str, ...] = ("safe", "cast", "error")
#: The 32-bit type each 64-bit type becomes on the device while x64 is off.
_NARROW = {
    np.dtype(np.int64): np.dtype(np.int32),
    np.dtype(np.uint64): np.dtype(np.uint32),
    np.dtype(np.float64): np.dtype(np.float32),
    np.dtype(np.complex128): np.dtype(np.complex64),
}
_X64_FIX = "or enable x64 yourself (jax.config.update('jax_enable_x64', True))"


def parse_dtype_policy(dtype_policy: object) -> DtypePolicy:
    """Validate ``dtype_policy``: ``"safe"``, ``"cast"`` or ``"error"``."""
    return parse_choice(dtype_policy, "dtype_policy", DTYPE_POLICIES)  # type: ignore[return-value]


def x64_enabled() -> bool:
    """Whether JAX keeps 64-bit types here (global config or an ``enable_x64`` context)."""
    return bool(jax.dtypes.canonicalize_dtype(np.int64) == np.dtype(np.int64))


def device_dtype(dtype: Any, dtype_policy: DtypePolicy = "safe", path: str = "batch") -> np.dtype:
    """The dtype a leaf of ``dtype`` gets on the device under ``dtype_policy``.

    Integer values are not checked here (see :func:`to_host`).

    Raises
    ------
    DtypePolicyError
        (a ``TypeError``) the policy refuses the dtype, or JAX has no such type; the
        message names ``path`` and the fix.
    """
    dtype = np.dtype(dtype)
    if dtype.kind in "OUSMm" or dtype.type is np.void:  # ml_dtypes (bfloat16...) pass
        raise DtypePolicyError(
            f"{path} has dtype {dtype}, which JAX arrays cannot hold; convert it to a numeric "
            "array in the Loader's transform or drop the field"
        )
    if dtype not in _NARROW or x64_enabled():
        return dtype
    if dtype_policy == "error":
        raise DtypePolicyError(
            f"{path} is {dtype}, but jax_enable_x64 is off and dtype_policy='error' refuses "
            f"64-bit leaves; use dtype_policy='safe' or 'cast', convert it in a transform, "
            f"{_X64_FIX}"
        )
    if dtype_policy == "safe" and dtype.kind in "fc":
        raise DtypePolicyError(
            f"{path} is {dtype}, but jax_enable_x64 is off and dtype_policy='safe' never "
            f"narrows floats silently; use dtype_policy='cast' to get {_NARROW[dtype]}, cast "
            f"it in the Loader's transform, {_X64_FIX}"
        )
    return _NARROW[dtype]


def _host_leaf(value: Any, path: str, dtype_policy: DtypePolicy, copy: bool) -> Any:
    if isinstance(value, jax.Array):
        return value
    arr = np.asarray(value)
    target = device_dtype(arr.dtype, dtype_policy, path)
    if target == arr.dtype:
        return arr.copy() if copy and isinstance(value, np.ndarray) else arr
    if dtype_policy == "safe" and arr.size:  # integers: narrow only when every value fits
        info = np.iinfo(target)
        lo, hi = arr.min(), arr.max()
        if lo < info.min or hi > info.max:
            raise DtypeOverflowError(
                f"{path} is {arr.dtype} with values in [{lo}, {hi}], outside {target}'s "
                f"[{info.min}, {info.max}], and jax_enable_x64 is off; use "
                f"dtype_policy='cast' to wrap them, rescale them in the Loader's transform, "
                f"{_X64_FIX}"
            )
    return arr.astype(target)


def _path(key_path: tuple[Any, ...]) -> str:
    return "batch" + jax.tree_util.keystr(key_path)


def to_host(batch: Any, dtype_policy: DtypePolicy = "safe", *, copy: bool = False) -> Any:
    """``batch`` with every leaf a NumPy array of the dtype it will have on the device.

    With ``copy=True`` no leaf shares memory with an array of ``batch``.

    Raises
    ------
    DtypePolicyError
        (a ``TypeError``) a leaf the policy refuses; :class:`DtypeOverflowError` (also an
        ``OverflowError``) for 64-bit integers that do not fit under ``"safe"``.
    """
    policy = parse_dtype_policy(dtype_policy)
    return jax.tree_util.tree_map_with_path(
        lambda key_path, leaf: _host_leaf(leaf, _path(key_path), policy, copy), batch
    )


def spans_processes(sharding: Any) -> bool:
    """Whether ``sharding`` lays arrays out over devices of more than this process."""
    return sharding is not None and not sharding.is_fully_addressable


def to_jax(
    batch: Any,
    *,
    device: Any = None,
    sharding: Any = None,
    dtype_policy: DtypePolicy = "safe",
) -> Any:
    """Place a batch pytree of NumPy arrays on devices as ``jax.Array`` leaves.

    Parameters
    ----------
    batch
        Arrays (or array-likes) in dicts, tuples, lists or any registered pytree.
    device
        A ``jax.Device``; default: JAX's default device. Not together with ``sharding``.
    sharding
        A ``jax.sharding.Sharding`` for every leaf, e.g. ``NamedSharding(mesh, P("data"))``.
        When it spans several processes, ``batch`` is this process's part and each leaf is
        assembled with ``jax.make_array_from_process_local_data``.
    dtype_policy
        What 64-bit leaves become while ``jax_enable_x64`` is off: ``"safe"``, ``"cast"``
        or ``"error"`` (see :mod:`mixle.jax.convert`).

    Returns
    -------
    The same pytree with ``jax.Array`` leaves.

    Raises
    ------
    ValueError
        Both ``device`` and ``sharding`` given, or an unknown ``dtype_policy``.
    TypeError
        ``sharding`` is not a ``jax.sharding.Sharding``.
    DtypePolicyError
        (a ``TypeError``) a leaf the policy refuses, named by its path (``batch['image']``).
    DtypeOverflowError
        (also an ``OverflowError``) int64 values that do not fit int32 under ``"safe"``.

    Notes
    -----
    Never changes JAX's global configuration. The device arrays never share memory with
    the NumPy inputs (on the CPU backend they are copied first), so changing the inputs
    afterwards does not change them.
    """
    check_target(device, sharding)
    # jax may build a CPU array on the NumPy buffer itself (even with may_alias=False), and
    # then it would change with the input: copy first, as a GPU or TPU transfer would
    host = to_host(batch, dtype_policy, copy=_platform(device, sharding) == "cpu")
    if spans_processes(sharding):
        return jax.tree_util.tree_map(
            lambda leaf: jax.make_array_from_process_local_data(sharding, leaf), host
        )
    return jax.device_put(host, sharding if sharding is not None else device)


def _platform(device: Any, sharding: Any) -> str:
    if sharding is not None:
        return str(next(iter(sharding.device_set)).platform)
    if device is not None:
        return str(device.platform)
    return str(jax.default_backend())


def check_target(device: Any, sharding: Any) -> None:
    """Refuse ``device`` together with ``sharding``, and a ``sharding`` of the wrong type."""
    if device is not None and sharding is not None:
        raise ValueError(
            f"device={device!r} and sharding={sharding!r} were both given; pass one "
            "(a single device is jax.sharding.SingleDeviceSharding(device))"
        )
    if sharding is not None and not isinstance(sharding, jax.sharding.Sharding):
        raise TypeError(
            f"sharding={sharding!r} must be a jax.sharding.Sharding, e.g. "
            "NamedSharding(mesh, PartitionSpec('data'))"
        )


def jax_spec(
    spec: SpecTree,
    *,
    sharding: Any = None,
    dtype_policy: DtypePolicy = "safe",
    leading_scale: int = 1,
) -> Any:
    """A spec tree of :class:`~mixle.data.spec.ArraySpec` as ``jax.ShapeDtypeStruct`` leaves.

    Dtypes are those the leaves get on the device under ``dtype_policy``; each leading axis
    is multiplied by ``leading_scale`` (processes contributing rows to a global batch).

    Raises
    ------
    DtypePolicyError
        (a ``TypeError``) a leaf the policy refuses: the same error a batch would raise.
    """
    policy = parse_dtype_policy(dtype_policy)

    def convert(key_path: tuple[Any, ...], leaf: ArraySpec) -> Any:
        shape = leaf.shape
        if shape and leading_scale != 1:
            shape = (shape[0] * leading_scale, *shape[1:])
        dtype = device_dtype(leaf.dtype, policy, _path(key_path))
        return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)

    return jax.tree_util.tree_map_with_path(convert, spec)
