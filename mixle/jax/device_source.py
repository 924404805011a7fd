"""``DeviceSource``: a dataset held in device memory, read by index math that traces.

For data that fits on the device (a few GB of patches, embeddings, tabular features) a
whole epoch (shuffle, gather, step) can run inside one ``jax.jit`` with no host round
trip. :class:`DeviceSource` puts a pytree of arrays, or a whole mixle source read once in
batches, on a device or a sharding, and its :meth:`~DeviceSource.get_batch_at` and
:meth:`~DeviceSource.gather` work under ``jit``, ``vmap`` and ``lax.scan``. The shuffled
order is :func:`mixle.jax.permute`, bit for bit the host Loader's
(:func:`mixle.data.index_math.permutation.permute`), so batch ``t`` of epoch ``e`` on the
device is the host Loader's batch ``t`` of epoch ``e``.

A ``DeviceSource`` is a JAX pytree (its leaves are the device arrays), so it can be passed
to a jitted function as an argument rather than closed over.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from mixle.data.index_math.sharding import parse_drop_last
from mixle.errors import DeviceMemoryError
from mixle.jax.convert import (
    DtypePolicy,
    check_target,
    device_dtype,
    jax,
    parse_dtype_policy,
    to_host,
    x64_enabled,
)
from mixle.jax.feistel import permute_blocks
from mixle.loading.arguments import parse_shuffle_block
from mixle.loading.loader import Loader
from mixle.utils.progress import progress_bar
from mixle.utils.validation import parse_int

__all__ = ["DEVICE_MEMORY_HEADROOM", "READ_BATCH_BYTES", "DeviceSource", "free_device_bytes"]

#: A source is read onto the device in batches of about this many bytes.
READ_BATCH_BYTES = 64 << 20
#: Fraction of the free device memory a ``DeviceSource`` may take: the rest stays for the
#: step's own buffers (parameters, activations, the gathered batch).
DEVICE_MEMORY_HEADROOM = 0.9

jnp = jax.numpy


def free_device_bytes(device: Any) -> int | None:
    """Bytes free on ``device``: its allocator's limit less what is in use.

    CPU devices report no allocator statistics; there the host's ``MemAvailable``
    (``/proc/meminfo``) is the answer, shared by every CPU device. ``None`` when neither
    is known.
    """
    stats = device.memory_stats() if hasattr(device, "memory_stats") else None
    if stats and "bytes_limit" in stats:
        return int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))
    if device.platform != "cpu":
        return None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _is_array_tree(data: Any) -> bool:
    if isinstance(data, (np.ndarray, jax.Array)):
        return True
    if isinstance(data, (dict, tuple, list)) and data:
        leaves = jax.tree_util.tree_leaves(data)
        return bool(leaves) and all(isinstance(x, (np.ndarray, jax.Array)) for x in leaves)
    return False


def _path(key_path: tuple[Any, ...]) -> str:
    return "data" + jax.tree_util.keystr(key_path)


def _record_axis_split(sharding: Any) -> tuple[int, Any]:
    """How many ways ``sharding`` splits the record axis, and the sharding of a batch."""
    if sharding is None:
        return 1, None
    if not sharding.is_fully_addressable:
        raise ValueError(
            f"sharding={sharding!r} spans devices of several processes; a DeviceSource "
            "holds one process's data: use a sharding over this process's devices "
            "(jax.local_devices()), or JaxLoader for a dataset split across processes"
        )
    if isinstance(sharding, jax.sharding.NamedSharding):
        spec = sharding.spec
        first = spec[0] if len(spec) else None
        axes = () if first is None else (first,) if isinstance(first, str) else tuple(first)
        split = int(np.prod([sharding.mesh.shape[a] for a in axes], dtype=np.int64))
        batch = jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec(first))
        return split, batch
    return 1, None


class DeviceSource:
    """A dataset on the device: ``len``, ``element_spec()`` and traceable batch reads.

    Parameters
    ----------
    data
        A pytree of arrays (NumPy or ``jax.Array``; a dict, tuple or list of them, or one
        array) whose leaves share the leading (record) axis; or a map-style source (a mixle
        source or sampler, a composition, anything a :class:`mixle.Loader` reads), read
        once, in order, in batches of about :data:`READ_BATCH_BYTES`, with a progress bar
        (:func:`mixle.set_progress`). Records must have a fixed shape.
    sharding
        A ``jax.sharding.Sharding`` over this process's devices for every leaf, e.g.
        ``NamedSharding(mesh, P("data"))`` to split the records over the ``data`` axis;
        batches read from it are split the same way along their rows (when the batch
        size allows). Not together with ``device``.
    device
        A ``jax.Device``; default: JAX's default device.
    dtype_policy
        What 64-bit leaves become while ``jax_enable_x64`` is off: ``"safe"`` (integers
        narrowed after checking every value fits, floats refused), ``"cast"`` or
        ``"error"`` (see :mod:`mixle.jax.convert`).
    shuffle_block
        Records moved together by a shuffle, as the Loader's ``shuffle_block``. ``None``
        (default) takes the source's ``shuffle_block`` attribute, or 1.
    read_batch_size
        Records per read when ``data`` is a source; default: about
        :data:`READ_BATCH_BYTES` of records.
    progress
        Show a progress bar while reading a source (``None``: automatic).

    Raises
    ------
    TypeError
        ``data`` is neither arrays nor a map-style source, ``sharding`` is not a
        ``Sharding``, or a leaf's dtype is refused by ``dtype_policy``
        (:class:`~mixle.errors.DtypePolicyError`, naming the leaf).
    ValueError
        No records, leaves of different lengths, a 0-d leaf, records of varying shape, a
        ``sharding`` whose split of the record axis does not divide the number of records
        or that spans processes, or ``device`` together with ``sharding``.
    DeviceMemoryError
        (a ``MemoryError``) the data would take more than :data:`DEVICE_MEMORY_HEADROOM`
        of the memory free on a device; raised before anything is copied (for a source,
        after reading its first batch), with the bytes needed and free.

    Notes
    -----
    - Batch ``t`` of epoch ``e`` of a host ``Loader(source, B, shuffle=True, seed=s)``
      equals ``get_batch_at(t * B, B, seed=s, epoch=e)`` (one shard; the Loader's padding
      rows too), and without ``shuffle`` ``get_batch_at(t * B, B)``.
    - Record indices are int32 while ``jax_enable_x64`` is off, so a DeviceSource holds
      at most ``2**31`` records then.
    - ``jax.Array`` leaves already on the target are used as they are (no copy, and the
      memory check does not count them): deleting or donating them afterwards breaks the
      DeviceSource.
    - Nothing here changes JAX's global configuration.
    """

    def __init__(
        self,
        data: Any,
        *,
        sharding: Any = None,
        device: Any = None,
        dtype_policy: DtypePolicy = "safe",
        shuffle_block: int | None = None,
        read_batch_size: int | None = None,
        progress: bool | None = None,
    ) -> None:
        check_target(device, sharding)
        policy = parse_dtype_policy(dtype_policy)
        #: Records a shuffle moves together (the Loader's ``shuffle_block``).
        self.shuffle_block = parse_shuffle_block(shuffle_block, data)
        self._split, self._batch_sharding = _record_axis_split(sharding)
        target = sharding if sharding is not None else device
        if target is None:
            target = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        elif not isinstance(target, jax.sharding.Sharding):
            if not isinstance(target, jax.Device):
                raise TypeError(f"device={device!r} must be a jax.Device, e.g. jax.devices()[0]")
            target = jax.sharding.SingleDeviceSharding(target)
        self._target = target
        if _is_array_tree(data):
            arrays = self._place_arrays(data, policy)
        elif (
            hasattr(data, "__len__")
            and hasattr(data, "__getitem__")
            and not isinstance(data, (str, bytes, os.PathLike))
        ):
            arrays = self._read_source(data, policy, read_batch_size, progress)
        else:
            raise TypeError(
                f"data={data!r} must be a pytree of arrays (a dict, tuple or list of NumPy "
                "or jax arrays sharing their first axis) or a map-style source such as a "
                "mixle sampler"
            )
        self._arrays = arrays
        self._n = int(jax.tree_util.tree_leaves(arrays)[0].shape[0])

    # -- placement ---------------------------------------------------------------------
    def _check_shapes(
        self, shapes: dict[str, tuple[tuple[int, ...], np.dtype]], resident: frozenset = frozenset()
    ) -> int:
        """The common record count of leaves ``path -> (shape, device dtype)``; checks split
        and memory before anything is copied."""
        counts = {path: shape[0] if shape else None for path, (shape, _) in shapes.items()}
        for path, count in counts.items():
            if count is None:
                raise ValueError(f"{path} is 0-d; every leaf needs a leading record axis")
        n = next(iter(counts.values()))
        if any(c != n for c in counts.values()):
            raise ValueError(f"the leaves have different record counts: {counts}")
        if n == 0:
            raise ValueError("data has no records (its leaves have length 0)")
        if not x64_enabled() and n > np.iinfo(np.int32).max:
            raise ValueError(
                f"{n} records do not fit int32 record indices while jax_enable_x64 is off; "
                "enable x64 (jax.config.update('jax_enable_x64', True)) or split the data"
            )
        if n % self._split:
            raise ValueError(
                f"sharding={self._target!r} splits the record axis {self._split} ways, but "
                f"there are {n} records, not a multiple of {self._split}: drop or repeat "
                f"{n % self._split} records (or {self._split - n % self._split}), or use a "
                "sharding that leaves the record axis whole"
            )
        self._check_memory({k: v for k, v in shapes.items() if k not in resident})
        return n

    def _check_memory(self, shapes: dict[str, tuple[tuple[int, ...], np.dtype]]) -> None:
        per_device: dict[Any, int] = {}
        for shape, dtype in shapes.values():
            for device, index in self._target.devices_indices_map(shape).items():
                dims = [len(range(*s.indices(d))) for s, d in zip(index, shape)]
                nbytes = int(np.prod(dims, dtype=np.int64)) * dtype.itemsize
                per_device[device] = per_device.get(device, 0) + nbytes
        cpu = [d for d in per_device if d.platform == "cpu"]
        checks = [(d, per_device[d]) for d in per_device if d.platform != "cpu"]
        if cpu:  # CPU devices share the host's memory
            checks.append((cpu[0], sum(per_device[d] for d in cpu)))
        for device, needed in checks:
            free = free_device_bytes(device)
            if free is not None and needed > DEVICE_MEMORY_HEADROOM * free:
                raise DeviceMemoryError(
                    f"the data needs {needed / 2**30:.2f} GiB on {device}, which has "
                    f"{free / 2**30:.2f} GiB free (a DeviceSource takes at most "
                    f"{DEVICE_MEMORY_HEADROOM:.0%} of it); use fewer records, a sharding over "
                    "more devices, a narrower dtype, or a JaxLoader, which streams batches"
                )

    def _place_arrays(self, data: Any, policy: DtypePolicy) -> Any:
        leaves = jax.tree_util.tree_leaves_with_path(data)
        shapes = {
            _path(kp): (tuple(leaf.shape), device_dtype(leaf.dtype, policy, _path(kp)))
            for kp, leaf in leaves
        }
        resident = frozenset(  # jax arrays already laid out so: placing them copies nothing
            _path(kp)
            for kp, leaf in leaves
            if isinstance(leaf, jax.Array)
            and leaf.sharding.is_equivalent_to(self._target, leaf.ndim)
        )
        self._check_shapes(shapes, resident)
        platform = next(iter(self._target.device_set)).platform

        def place(key_path: tuple[Any, ...], leaf: Any) -> Any:
            if isinstance(leaf, jax.Array):
                return jax.device_put(leaf, self._target)
            # checked narrowing; a CPU device must not alias the caller's array
            host = to_host({_path(key_path): leaf}, policy, copy=platform == "cpu")
            return jax.device_put(host[_path(key_path)], self._target)

        return jax.tree_util.tree_map_with_path(place, data)

    def _read_source(
        self, source: Any, policy: DtypePolicy, read_batch_size: int | None, progress: Any
    ) -> Any:
        n = len(source)
        if n == 0:
            raise ValueError(f"data={source!r} has no records")
        if read_batch_size is not None:
            read_batch_size = parse_int(read_batch_size, "read_batch_size")
            if read_batch_size < 1:
                raise ValueError(f"read_batch_size={read_batch_size} must be >= 1")
        with Loader(source, 1, num_epochs=1, num_threads=0) as probe:
            first = to_host(next(iter(probe)), policy)  # record 0, as a batch of one
        record_bytes = sum(x.nbytes for x in jax.tree_util.tree_leaves(first))
        if read_batch_size is None:
            read_batch_size = max(1, min(n, READ_BATCH_BYTES // max(1, record_bytes)))
        shapes = {
            _path(kp): ((n, *leaf.shape[1:]), leaf.dtype)
            for kp, leaf in jax.tree_util.tree_leaves_with_path(first)
        }
        self._check_shapes(shapes)
        buffers, staged = None, None
        if self._batch_sharding is None:  # one device: written in place, batch by batch
            buffers = jax.tree_util.tree_map(
                lambda leaf: jax.jit(
                    lambda: jnp.zeros((n, *leaf.shape[1:]), leaf.dtype),
                    out_shardings=self._target,
                )(),
                first,
            )
        else:  # split over devices: staged on the host, then placed shard by shard
            staged = [
                np.empty((n, *leaf.shape[1:]), leaf.dtype)
                for leaf in jax.tree_util.tree_leaves(first)
            ]
        structure = jax.tree_util.tree_structure(first)
        offset = 0
        loader = Loader(source, read_batch_size, num_epochs=1)
        with loader, progress_bar(n, "DeviceSource", "records", progress) as bar:
            for batch in loader:
                host = to_host(batch, policy)
                if jax.tree_util.tree_structure(host) != structure:
                    raise ValueError(
                        f"batch at record {offset} of {source!r} has structure "
                        f"{jax.tree_util.tree_structure(host)}, not {structure}"
                    )
                for (kp, got), want in zip(
                    jax.tree_util.tree_leaves_with_path(host), jax.tree_util.tree_leaves(first)
                ):
                    if got.shape[1:] != want.shape[1:] or got.dtype != want.dtype:
                        raise ValueError(
                            f"records of {source!r} vary: {_path(kp)} at record {offset} is "
                            f"{got.dtype}{list(got.shape[1:])}, record 0 is "
                            f"{want.dtype}{list(want.shape[1:])}; a DeviceSource needs "
                            "fixed-shape records"
                        )
                rows = jax.tree_util.tree_leaves(host)[0].shape[0]
                if offset + rows > n:
                    raise ValueError(
                        f"{source!r} gave more than its len() = {n} records when read in order"
                    )
                if staged is None:
                    buffers = _write(buffers, host, offset)
                else:
                    for buf, leaf in zip(staged, jax.tree_util.tree_leaves(host)):
                        buf[offset : offset + rows] = leaf
                offset += rows
                bar.update(rows)
        if offset != n:
            raise ValueError(f"{source!r} gave {offset} records when read in order, not {n}")
        if staged is not None:
            return jax.device_put(jax.tree_util.tree_unflatten(structure, staged), self._target)
        return buffers

    # -- the pytree ----------------------------------------------------------------------
    def tree_flatten(self) -> tuple[tuple[Any], tuple[Any, ...]]:
        """JAX pytree protocol: the arrays are the children."""
        aux = (self._n, self.shuffle_block, self._split, self._batch_sharding, self._target)
        return (self._arrays,), aux

    @classmethod
    def tree_unflatten(cls, aux: tuple[Any, ...], children: tuple[Any]) -> DeviceSource:
        """JAX pytree protocol: a DeviceSource over ``children`` (tracers under ``jit``)."""
        self = object.__new__(cls)
        self._n, self.shuffle_block, self._split, self._batch_sharding, self._target = aux
        (self._arrays,) = children
        return self

    # -- contract ------------------------------------------------------------------------
    @property
    def arrays(self) -> Any:
        """The pytree of device arrays, records on the leading axis."""
        return self._arrays

    @property
    def sharding(self) -> Any:
        """The sharding the arrays were placed with."""
        return self._target

    def __len__(self) -> int:
        return self._n

    def __repr__(self) -> str:
        spec = jax.tree_util.tree_map(
            lambda s: f"{s.dtype}{list(s.shape)}", self.element_spec(), is_leaf=_is_struct
        )
        return f"DeviceSource({self._n} records of {spec}, on {self._target})"

    def element_spec(self) -> Any:
        """One record's structure: ``jax.ShapeDtypeStruct`` leaves (no record axis)."""
        return jax.tree_util.tree_map(
            lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype), self._arrays
        )

    def num_batches(self, batch_size: int, drop_last: bool | str = False) -> int:
        """Batches of ``batch_size`` in an epoch: ``drop_last=True`` floors, else ceils."""
        batch_size = parse_size(batch_size, "batch_size")
        if parse_drop_last(drop_last) is True:
            return self._n // batch_size
        return -(-self._n // batch_size)

    # -- reads (traceable) ---------------------------------------------------------------
    def gather(self, indices: Any) -> Any:
        """The records at ``indices`` (any integer shape), stacked on leading axes.

        Negative indices count from the end. Concrete indices outside ``[-n, n)`` raise
        ``IndexError``; traced ones are clamped into range (XLA cannot raise).
        """
        if not isinstance(indices, jax.core.Tracer):  # checked before any narrowing
            host = np.asarray(indices)
            if host.dtype.kind not in "iu":
                raise TypeError(f"indices must be integers, got dtype {host.dtype}")
            if host.size:
                lo, hi = int(host.min()), int(host.max())
                if lo < -self._n or hi >= self._n:
                    bad = lo if lo < -self._n else hi
                    raise IndexError(f"indices contains {bad}, outside [-{self._n}, {self._n})")
        idx = jnp.asarray(indices)
        if not jnp.issubdtype(idx.dtype, jnp.integer):
            raise TypeError(f"indices must be integers, got dtype {idx.dtype}")
        idx = jnp.where(idx < 0, idx + self._n, idx)
        if self._batch_sharding is None:
            return jax.tree_util.tree_map(
                lambda a: jnp.take(a, idx, axis=0, mode="clip"), self._arrays
            )
        # records split over devices: the rows come out split like the records when their
        # count allows, else replicated; an explicit mesh must be told, an auto one is asked
        split = idx.ndim and idx.shape[0] % self._split == 0
        mesh = self._batch_sharding.mesh
        spec = self._batch_sharding.spec if split else jax.sharding.PartitionSpec()
        out = jax.sharding.NamedSharding(mesh, spec)
        if _explicit(mesh):
            return jax.tree_util.tree_map(
                lambda a: a.at[idx].get(mode="clip", out_sharding=out), self._arrays
            )
        batch = jax.tree_util.tree_map(
            lambda a: jnp.take(a, idx, axis=0, mode="clip"), self._arrays
        )
        return jax.lax.with_sharding_constraint(batch, out)

    def __getitem__(self, index: Any) -> Any:
        """``src[i]``: one record (an int) or records stacked (an integer array)."""
        return self.gather(index)

    def indices_at(self, start: Any, size: int, *, seed: Any = None, epoch: Any = 0) -> Any:
        """Record indices of positions ``[start, start + size)`` of an epoch's order.

        Parameters
        ----------
        start
            The first position (an int or a traced integer scalar), ``0 <= start < n``;
            positions past ``n - 1`` wrap to the start of the order, as the Loader's
            padding rows do.
        size
            Rows (a static Python int ``>= 1``).
        seed, epoch
            With ``seed=None`` the order is ``0, 1, ..., n - 1``; otherwise epoch
            ``epoch``'s shuffled order under ``seed`` (:func:`mixle.jax.permute`, in blocks of
            :attr:`shuffle_block`). Either may be traced.

        Returns
        -------
        An int32 array of shape ``(size,)`` (int64 with x64 on).
        """
        size = parse_size(size, "size")
        if not isinstance(start, jax.core.Tracer):
            start_int = parse_int(start, "start") if not hasattr(start, "dtype") else int(start)
            if not 0 <= start_int < self._n:
                raise IndexError(f"start={start_int} is outside [0, {self._n})")
        udtype = jnp.uint64 if x64_enabled() else jnp.uint32
        first = jnp.remainder(jnp.asarray(start), self._n)  # a traced start outside wraps too
        positions = first.astype(udtype) + jnp.arange(size, dtype=udtype)
        positions = (positions % udtype(self._n)).astype(jnp.int64 if x64_enabled() else jnp.int32)
        if seed is None:
            return positions
        return permute_blocks(positions, self._n, self.shuffle_block, seed=seed, epoch=epoch)

    def get_batch_at(self, start: Any, size: int, *, seed: Any = None, epoch: Any = 0) -> Any:
        """The batch of positions ``[start, start + size)`` of an epoch's order (traceable).

        ``gather(indices_at(start, size, seed=seed, epoch=epoch))``; see
        :meth:`indices_at` for the arguments. Works under ``jit``, ``vmap`` and
        ``lax.scan`` with ``start``, ``seed`` and ``epoch`` traced (``size`` is static).
        """
        return self.gather(self.indices_at(start, size, seed=seed, epoch=epoch))


jax.tree_util.register_pytree_node_class(DeviceSource)


def _explicit(mesh: Any) -> bool:
    """Whether ``mesh`` has explicit axes (``jax.make_mesh``'s default in newer JAX)."""
    explicit = getattr(getattr(jax.sharding, "AxisType", None), "Explicit", None)
    types = getattr(mesh, "axis_types", ())
    return explicit is not None and any(t == explicit for t in types)


def _is_struct(x: Any) -> bool:
    return isinstance(x, jax.ShapeDtypeStruct)


def parse_size(value: Any, name: str) -> int:
    """``value`` as an int ``>= 1`` (a batch size, a row count), else an error naming ``name``."""
    value = parse_int(value, name)
    if value < 1:
        raise ValueError(f"{name}={value} must be >= 1")
    return value


def _copy_into(buffers: Any, batch: Any, offset: Any) -> Any:
    return jax.tree_util.tree_map(
        lambda buf, rows: jax.lax.dynamic_update_slice_in_dim(buf, rows, offset, 0),
        buffers,
        batch,
    )


#: Writes a batch into the device buffers in place (they are donated): one compile per
#: batch shape, the offset traced.
_write = jax.jit(_copy_into, donate_argnums=0)
