"""Per-record JAX PRNG keys: a pure function of ``(seed, epoch, record index)``.

Augmentation on the device needs one key per record that does not depend on how records
were batched, sharded or read. :func:`record_keys` hashes ``(seed, epoch, index)`` with
mixle's counter-based hash (:mod:`mixle.data.index_math.hashing`, NumPy uint64 arithmetic)
and wraps the bits as a typed JAX key array, so a record gets the same key whatever the
worker count, thread count, shard, batch or row it lands in. When ``seed``, ``epoch`` or
``indices`` is a JAX array (a tracer inside ``jax.jit`` included) the same bits are hashed
on the device, in uint32 word-pair arithmetic (:mod:`mixle.jax.u64`), x64 on or off.
"""

from __future__ import annotations

from functools import lru_cache, partial
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from mixle.data.index_math.hashing import hash_int, mix, parse_seed
from mixle.jax import u64
from mixle.jax.convert import jax
from mixle.utils.validation import parse_int

__all__ = ["DEFAULT_KEY_IMPL", "record_key_data", "record_keys"]

#: The PRNG implementation of :func:`record_keys` when ``impl`` is not given. Fixed rather
#: than JAX's configured default, so the keys never change with ``jax_default_prng_impl``.
DEFAULT_KEY_IMPL = "threefry2x32"
_KEY_STREAM = 0x4A4B4559  # "JKEY": keeps record keys apart from shuffles and record_rng
_WORD_BITS = np.uint64(32)
_LOW_WORD = np.uint64(0xFFFFFFFF)


def _key_shape(impl: Any) -> tuple[int, ...]:
    """The shape of one key's data for ``impl`` (traced abstractly: starts no backend)."""
    try:
        hash(impl)
    except TypeError:
        raise TypeError(
            f"impl={impl!r} must be a JAX PRNG implementation, e.g. {DEFAULT_KEY_IMPL!r}"
        ) from None
    return _cached_key_shape(impl)


@lru_cache(maxsize=16)
def _cached_key_shape(impl: Any) -> tuple[int, ...]:
    try:
        spec = jax.eval_shape(lambda: jax.random.key_data(jax.random.key(0, impl=impl)))
    except (TypeError, ValueError) as exc:
        raise ValueError(
            f"impl={impl!r} is not a JAX PRNG implementation ({exc}); use e.g. "
            f"{DEFAULT_KEY_IMPL!r}, 'rbg' or 'unsafe_rbg'"
        ) from None
    return tuple(spec.shape)


def _parse_indices(indices: ArrayLike) -> NDArray[np.integer]:
    arr = np.asarray(indices)
    if arr.size == 0 and not isinstance(indices, np.ndarray):
        arr = arr.astype(np.int64)  # an empty list is float64 to NumPy
    if arr.dtype.kind not in "iu":
        raise TypeError(
            f"indices must be an array of integer record indices (e.g. loader.last_indices), "
            f"got dtype {arr.dtype}"
        )
    if arr.dtype.kind == "i" and arr.size and int(arr.min()) < 0:
        raise ValueError(
            f"indices must be record indices >= 0, got {int(arr.min())} "
            "(the Loader's last_indices and batch_indices are never negative)"
        )
    return arr


def _is_device(value: Any) -> bool:
    return isinstance(value, jax.Array)


def record_key_data(seed: Any, epoch: Any, indices: Any, *, impl: Any = None) -> Any:
    """The uint32 bits of :func:`record_keys`: shape ``indices.shape + key_shape``.

    With NumPy (or Python) inputs the bits are a NumPy array, computed without device work;
    when any of ``seed``, ``epoch`` or ``indices`` is a JAX array (traced or not) they are
    the same bits as a ``jax.Array``, hashed on the device, so the call runs inside
    ``jax.jit`` with a traced epoch. ``jax.random.wrap_key_data(data, impl=impl)`` turns
    them into the keys. Parameters and errors as for :func:`record_keys`.
    """
    if _is_device(seed) or _is_device(epoch) or _is_device(indices):
        return _device_key_data(seed, epoch, indices, impl)
    seed = parse_seed(seed)
    epoch = _parse_epoch(epoch)
    arr = _parse_indices(indices)
    key_shape = _key_shape(DEFAULT_KEY_IMPL if impl is None else impl)
    words = int(np.prod(key_shape, dtype=np.int64))
    state = np.uint64(hash_int(seed, _KEY_STREAM, epoch))
    first = mix(state, arr.reshape(-1))  # a bijection of the index for each (seed, epoch)
    hashes = [first] + [mix(first, j) for j in range(1, (words + 1) // 2)]
    halves = [part for h in hashes for part in (h >> _WORD_BITS, h & _LOW_WORD)]
    data = np.stack(halves[:words], axis=-1).astype(np.uint32)
    return data.reshape(arr.shape + key_shape)


def _parse_epoch(epoch: Any) -> int:
    epoch = parse_int(epoch, "epoch")
    if not 0 <= epoch < 1 << 63:
        raise ValueError(f"epoch={epoch} must be in [0, 2**63)")
    return epoch


def _device_word(value: Any, name: str) -> u64.U64:
    """A seed or epoch as words: ints checked on the host, JAX scalars as they are."""
    if not _is_device(value):
        return u64.const(parse_seed(value) if name == "seed" else _parse_epoch(value))
    dtype = np.dtype(value.dtype)
    if dtype.kind not in "iu":
        raise TypeError(f"{name} must be an int or a JAX integer scalar, got dtype {dtype}")
    if value.shape != ():
        raise ValueError(f"{name} must be a scalar, got shape {value.shape}")
    if name == "epoch" and not isinstance(value, jax.core.Tracer):
        _parse_epoch(int(value))  # a concrete epoch is checked as an int would be
    return u64.from_int(value)


def _device_key_data(seed: Any, epoch: Any, indices: Any, impl: Any) -> Any:
    """:func:`record_key_data` on the device: the host path's bits, in uint32 word pairs.

    Traced values cannot be checked: a traced negative index or epoch hashes as its two's
    complement instead of raising.
    """
    s, e = _device_word(seed, "seed"), _device_word(epoch, "epoch")
    if _is_device(indices):
        dtype = np.dtype(indices.dtype)
        if dtype.kind not in "iu":
            raise TypeError(
                "indices must be an array of integer record indices (e.g. "
                f"loader.last_indices), got dtype {dtype}"
            )
        if dtype.kind == "i" and not isinstance(indices, jax.core.Tracer) and indices.size:
            _parse_indices(np.asarray(indices))  # the host check of concrete indices
        idx = u64.from_int(indices)
    else:
        idx = u64.from_numpy(_parse_indices(indices))
    key_shape = _key_shape(DEFAULT_KEY_IMPL if impl is None else impl)
    return _hash_keys(s, e, idx, key_shape=key_shape)


@partial(jax.jit, static_argnames=("key_shape",))
def _hash_keys(seed: u64.U64, epoch: u64.U64, idx: u64.U64, *, key_shape: tuple[int, ...]) -> Any:
    words = int(np.prod(key_shape, dtype=np.int64))
    state = u64.mix(u64.splitmix64(seed), _KEY_STREAM, epoch)
    first = u64.mix(state, idx)
    hashes = [first] + [u64.mix(first, j) for j in range(1, (words + 1) // 2)]
    halves = [part for h in hashes for part in (h.hi, h.lo)]
    data = jax.numpy.stack(halves[:words], axis=-1)
    return data.reshape(idx.lo.shape + key_shape)


def record_keys(seed: int, epoch: int, indices: ArrayLike, *, impl: Any = None) -> Any:
    """Typed JAX PRNG keys, one per record index: a pure function of ``(seed, epoch, index)``.

    Parameters
    ----------
    seed
        Any int, e.g. the Loader's ``seed`` (NumPy integers accepted; bools and floats not),
        or a JAX integer scalar (traced or not; int32 seeds taken in two's complement).
    epoch
        The epoch the records were read in (``>= 0``), e.g. :attr:`JaxLoader.last_epoch`,
        or a JAX integer scalar: a jitted step that takes the epoch as an argument compiles
        once for every epoch.
    indices
        Integer record indices ``>= 0`` of any shape, e.g. ``loader.last_indices`` (int64
        is never truncated to int32, whether or not ``jax_enable_x64`` is on), or a JAX
        integer array, traced or not.
    impl
        A JAX PRNG implementation, as for ``jax.random.key``; default
        :data:`DEFAULT_KEY_IMPL` (``"threefry2x32"``), not JAX's configured default.

    Returns
    -------
    A ``jax.Array`` of typed keys (``jax.dtypes.prng_key``) of shape ``indices.shape``,
    on JAX's default device.

    Raises
    ------
    TypeError
        ``seed`` or ``epoch`` is not an int, ``indices`` is not an integer array, or
        ``impl`` is not a PRNG implementation.
    ValueError
        ``epoch`` outside ``[0, 2**63)``, a negative index, or an unknown ``impl``.

    Notes
    -----
    - Key bits are ``h >> 32, h & 0xFFFFFFFF`` of the 64-bit counter-based hash ``h`` of
      ``(seed, epoch, index)`` (more words, for implementations with longer keys, hash
      ``h`` further); golden-value tests pin them. For one ``(seed, epoch)`` distinct
      indices always get distinct keys.
    - The same record gets the same key whatever the number of worker processes, reader
      threads, shards, the batch size or its row in the batch; padding rows of
      ``drop_last="pad"`` repeat real records and so repeat their keys.
    - Independent of :func:`mixle.loading.plan.record_rng` (another hash stream) and of
      the Loader's shuffles.
    - With a JAX array among the inputs the bits are hashed on the device (uint32 word
      pairs, :mod:`mixle.jax.u64`; x64 need not be on) and equal the host bits. Traced
      values cannot be checked: a negative traced index or epoch gives the key of its
      two's complement instead of raising. Concrete JAX arrays are still checked.

    Examples
    --------
    Augment on the device with a key per record, jitted::

        loader = JaxLoader(sampler, 32, shuffle=True, seed=seed)
        augment_batch = jax.jit(jax.vmap(augment))  # augment(key, patch) -> patch
        for patches, coords in loader:
            keys = record_keys(seed, loader.last_epoch, loader.last_indices)
            patches = augment_batch(keys, patches)

    ``loader.last_epoch`` is the batch's own epoch (:attr:`JaxLoader.epoch` is the next
    batch's, one more after the last batch of an epoch). With a plain
    :class:`mixle.Loader`, ``record_keys(seed, epoch, loader.batch_indices(t, epoch))``.
    """
    data = record_key_data(seed, epoch, indices, impl=impl)
    return jax.random.wrap_key_data(data, impl=DEFAULT_KEY_IMPL if impl is None else impl)
