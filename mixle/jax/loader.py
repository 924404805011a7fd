"""``JaxLoader``: the Loader's batches as ``jax.Array`` pytrees, sharded and prefetched."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import NDArray

from mixle.jax.convert import (
    DtypePolicy,
    check_target,
    jax,
    jax_spec,
    parse_dtype_policy,
    spans_processes,
    to_jax,
)
from mixle.jax.prefetch import DevicePrefetcher, parse_prefetch, place_each
from mixle.loading.base import LoaderBase
from mixle.loading.loader import Loader
from mixle.loading.prefetch import StopSignal
from mixle.loading.runs import ActiveRun
from mixle.loading.streams import StreamLoader

__all__ = ["JaxLoader", "batch_axis_blocks", "process_shard"]


class _Received(NamedTuple):
    """A batch as the loop receives it, with what the Loader said when it was read."""

    batch: Any
    state: dict[str, Any]  # the cursor after the batch
    indices: NDArray[np.int64] | None  # its record indices
    epoch: int  # its epoch


def batch_axis_blocks(
    owners: NDArray[np.integer],
    axis_names: Sequence[str],
    batch_axes: Sequence[str],
    process: int,
) -> tuple[int, int, int]:
    """Which block of the batch axis a process holds, for a mesh and its batch mesh axes.

    Parameters
    ----------
    owners
        The process index of each device of the mesh, shaped like the mesh.
    axis_names
        The mesh's axis names, one per axis of ``owners``.
    batch_axes
        The mesh axes the batch (leading) axis is split over, major to minor, as in
        ``PartitionSpec(("data", "fsdp"))``; empty when the batch axis is replicated.
    process
        The process asking.

    Returns
    -------
    ``(shard_index, num_shards, local_blocks)``: the process's share of each global batch
    is share ``shard_index`` of ``num_shards`` equal, contiguous shares, split over
    ``local_blocks`` of its own devices. Processes holding the same rows get the same
    ``shard_index``.

    Raises
    ------
    ValueError
        A batch axis that is not a mesh axis, a process with no device in the mesh, or a
        layout where processes do not each hold one aligned, contiguous, equal share.
    """
    owners = np.asarray(owners)
    names = list(axis_names)
    missing = [a for a in batch_axes if a not in names]
    if missing:
        raise ValueError(f"batch axes {missing} are not axes of the mesh {tuple(names)}")
    sizes = [owners.shape[names.index(a)] for a in batch_axes]
    total = int(np.prod(sizes, dtype=np.int64))
    if batch_axes:
        coords = np.indices(owners.shape)
        blocks = np.ravel_multi_index([coords[names.index(a)] for a in batch_axes], sizes)
    else:
        blocks = np.zeros(owners.shape, dtype=np.int64)
    held = {int(p): sorted(set(blocks[owners == p].tolist())) for p in np.unique(owners)}
    if process not in held:
        raise ValueError(f"process {process} has no device in the mesh, so it holds no rows")
    mine = held[process]
    n = len(mine)
    for p, share in held.items():
        if len(share) != n or share != list(range(share[0], share[0] + n)) or share[0] % n:
            raise ValueError(
                f"process {p} holds blocks {share} of the {total} blocks of the batch axis, "
                f"and process {process} holds {mine}: each process must hold one aligned, "
                "contiguous, equal share; order the mesh devices by process (e.g. "
                "jax.make_mesh) or pass shard_index and num_shards yourself"
            )
    return mine[0] // n, total // n, n


def _named_blocks(sharding: Any) -> tuple[int, int, int] | None:
    """:func:`batch_axis_blocks` of this process for a ``NamedSharding``; else ``None``."""
    if not isinstance(sharding, jax.sharding.NamedSharding):
        return None
    mesh, spec = sharding.mesh, sharding.spec
    first = spec[0] if len(spec) else None
    axes = () if first is None else (first,) if isinstance(first, str) else tuple(first)
    devices = np.asarray(mesh.devices)
    owners = np.vectorize(lambda d: d.process_index, otypes=[np.int64])(devices)
    return batch_axis_blocks(owners, mesh.axis_names, axes, jax.process_index())


def process_shard(sharding: Any = None) -> tuple[int, int]:
    """``(shard_index, num_shards)`` this process loads for batches laid out by ``sharding``.

    For a ``NamedSharding`` over devices of several processes, the process's share of the
    batch axis (:func:`batch_axis_blocks`); otherwise ``(jax.process_index(),
    jax.process_count())``.
    """
    if spans_processes(sharding):
        blocks = _named_blocks(sharding)
        if blocks is not None:
            return blocks[0], blocks[1]
    return jax.process_index(), jax.process_count()


class JaxLoader(ActiveRun):
    """The :class:`mixle.Loader`'s batches as ``jax.Array`` pytrees on devices, prefetched.

    Parameters
    ----------
    source, batch_size
        As for :class:`mixle.Loader`; ``batch_size`` is the rows this process reads per
        batch. With a sharding over several processes the global batch has
        ``batch_size * num_shards`` rows.
    sharding
        A ``jax.sharding.Sharding`` for every leaf, e.g. ``NamedSharding(mesh, P("data"))``.
        Over devices of several processes, each process loads its share and the global
        array is assembled with ``jax.make_array_from_process_local_data``.
    device
        A single ``jax.Device`` instead of ``sharding`` (default: JAX's default device).
    prefetch
        Batches placed on the device ahead of the loop by a background thread (``>= 0``;
        0: placed in the caller's thread).
    dtype_policy
        What 64-bit leaves become while ``jax_enable_x64`` is off: ``"safe"`` (default),
        ``"cast"`` or ``"error"``; see :mod:`mixle.jax.convert`.
    **loader_options
        Any other :class:`mixle.Loader` argument (``shuffle``, ``shuffle_block``, ``seed``,
        ``num_epochs``, ``drop_last``, ``transform``, ``num_threads``...). ``num_workers``
        (with ``worker_start_method``, ``timeout``) reads the batches in worker processes,
        the same batches as without; the JAX prefetch thread stays in the parent and places
        each batch from the workers' shared memory (on the CPU backend ``device_put`` may
        alias it, which keeps the batch's slot leased while the array lives). ``shard_index`` and
        ``num_shards`` default to this process's share (:func:`process_shard`), and
        ``shard_layout`` to ``"blocked"`` over several shards: the global array assembled
        from the processes is then exactly the batch one process would read with the
        global batch size.

    Raises
    ------
    ValueError
        Both ``device`` and ``sharding``; ``batch_size`` (or a short last batch with
        ``drop_last=False``) not divisible by this process's devices along the batch axis;
        shards that would run different numbers of batches across processes; a shard
        layout that does not match the sharding; or any error of :class:`mixle.Loader`.

    Notes
    -----
    - Batches, order, masks and resume are the Loader's: batch ``t`` is the same records
      whatever ``prefetch``. With ``drop_last="pad"`` the mask is a device array in the
      batch (``batch["mask"]``, the last element of a tuple, or ``(array, mask)``) and
      every batch has one shape, so a jitted step compiles once.
    - ``state_dict()`` is the cursor after the last batch the loop received (batches
      prefetched but not received are read again after a resume or a new ``iter()``).
    - Never changes JAX's global configuration.
    - Ctrl-C reaches the loop at once. Stopping (also ``close()``, ``break``, an error)
      wakes the prefetch thread and the Loader's reader threads and waits at most
      :data:`~mixle.loading.prefetch.STOP_GRACE_S` for a read in flight; a thread stuck
      in a read that does not return is a daemon, left to end by itself, and never keeps
      the process from exiting.
    """

    def __init__(
        self,
        source: Any,
        batch_size: int,
        *,
        sharding: Any = None,
        device: Any = None,
        prefetch: int = 2,
        dtype_policy: DtypePolicy = "safe",
        **loader_options: Any,
    ) -> None:
        check_target(device, sharding)
        if "shard_index" not in loader_options and "num_shards" not in loader_options:
            index, count = process_shard(sharding)
            loader_options = {**loader_options, "shard_index": index, "num_shards": count}
        if loader_options.get("num_shards", 1) > 1:
            # processes take contiguous blocks of each global batch, so the assembled global
            # array is, row for row, the batch one process of the global size would read
            loader_options.setdefault("shard_layout", "blocked")
        loader = Loader(source, batch_size, **loader_options)
        self._setup(loader, sharding, device, prefetch, dtype_policy)

    @classmethod
    def from_loader(
        cls,
        loader: Loader,
        *,
        sharding: Any = None,
        device: Any = None,
        prefetch: int = 2,
        dtype_policy: DtypePolicy = "safe",
    ) -> JaxLoader:
        """Wrap an existing :class:`mixle.Loader` (its cursor and shard are kept)."""
        if not isinstance(loader, LoaderBase):  # a Loader, or the StreamLoader of a stream
            raise TypeError(f"loader={loader!r} must be a mixle.Loader")
        check_target(device, sharding)
        self = cls.__new__(cls)
        self._setup(loader, sharding, device, prefetch, dtype_policy)
        return self

    def _setup(
        self, loader: Loader, sharding: Any, device: Any, prefetch: int, dtype_policy: Any
    ) -> None:
        self._loader = loader
        self._sharding = sharding
        self._device = device
        self._prefetch = parse_prefetch(prefetch, "prefetch")
        self._policy = parse_dtype_policy(dtype_policy)
        self._check_layout()
        self._state = loader.state_dict()
        self._last_indices: NDArray[np.int64] | None = None
        self._last_epoch: int | None = None

    def _check_layout(self) -> None:
        if isinstance(self._loader, StreamLoader):
            self._check_stream_layout()
            return
        lay = self._loader.layout
        if (
            spans_processes(self._sharding)
            and lay.drop_last is False
            and lay.num_records % (lay.batch_size * lay.num_shards)
        ):
            raise ValueError(
                f"with drop_last=False the {lay.num_shards} processes would run different "
                f"numbers of batches ({lay.num_records} records, batch_size="
                f"{lay.batch_size}) and a step over the global array would hang; use "
                "drop_last='pad' (static shapes and a mask) or drop_last=True"
            )
        blocks = _named_blocks(self._sharding)
        if blocks is not None:
            index, count, local = blocks
            if spans_processes(self._sharding) and (lay.shard_index, lay.num_shards) != (
                index,
                count,
            ):
                raise ValueError(
                    f"the Loader reads shard_index={lay.shard_index} of "
                    f"num_shards={lay.num_shards}, but sharding={self._sharding!r} gives "
                    f"this process share {index} of {count}; leave shard_index and "
                    "num_shards out so JaxLoader sets them"
                )
            rows = {lay.batch_size}
            if lay.drop_last is False and lay.num_batches:
                rows.add(lay.batch_rows(lay.num_batches - 1))
            bad = sorted(r for r in rows if r % local)
            if bad:
                raise ValueError(
                    f"batches of {bad[0]} rows cannot be split over the {local} devices of "
                    f"this process along the batch axis of sharding={self._sharding!r}; use "
                    f"a batch_size that is a multiple of {local}, and drop_last='pad' or "
                    "True for the last batch"
                )

    def _check_stream_layout(self) -> None:
        lay = self._loader.layout
        if spans_processes(self._sharding) and lay.drop_last is False:
            raise ValueError(
                f"with drop_last=False the {lay.num_shards} processes may run different "
                "numbers of batches at the end of the stream, and a step over the global "
                "array would hang; use drop_last='pad' (static shapes and a mask) or True"
            )
        blocks = _named_blocks(self._sharding)
        if blocks is None:
            return
        index, count, local = blocks
        if spans_processes(self._sharding) and (lay.shard_index, lay.num_shards) != (index, count):
            raise ValueError(
                f"the Loader reads shard_index={lay.shard_index} of num_shards="
                f"{lay.num_shards}, but sharding={self._sharding!r} gives this process share "
                f"{index} of {count}; leave shard_index and num_shards out so JaxLoader sets them"
            )
        if lay.batch_size % local or (lay.drop_last is False and local > 1):
            raise ValueError(
                f"batches of a stream cannot be split over the {local} devices of this "
                f"process along the batch axis of sharding={self._sharding!r}: use a "
                f"batch_size that is a multiple of {local} (now {lay.batch_size}), and "
                "drop_last='pad' or True for the last batch, whose length is not known"
            )

    # -- description --------------------------------------------------------------------
    @property
    def loader(self) -> Loader:
        """The :class:`mixle.Loader` batches are read with."""
        return self._loader

    @property
    def sharding(self) -> Any:
        """The sharding of every leaf, or ``None``."""
        return self._sharding

    @property
    def global_batch_size(self) -> int:
        """Rows of each batch array: ``batch_size`` times the processes sharing a batch."""
        lay = self._loader.layout
        return lay.batch_size * (lay.num_shards if spans_processes(self._sharding) else 1)

    @property
    def epoch(self) -> int:
        """The epoch of the next batch the loop receives."""
        return int(self._state["epoch"])

    @property
    def last_indices(self) -> NDArray[np.int64] | None:
        """Record indices of the batch the loop received last (``None`` before the first).

        This process's rows, in order; padding rows of ``drop_last="pad"`` repeat real
        records. Use it, with :attr:`last_epoch`, for :func:`mixle.jax.record_keys`. Not
        ``self.loader.last_indices``: with ``prefetch > 0`` the Loader has already read
        batches ahead of the loop.
        """
        return self._last_indices

    @property
    def last_epoch(self) -> int | None:
        """The epoch of the batch the loop received last (``None`` before the first).

        Unlike :attr:`epoch` (the epoch of the next batch), it stays the batch's own epoch
        after the last batch of an epoch.
        """
        return self._last_epoch

    def __len__(self) -> int:
        """Batches per epoch on this process."""
        return len(self._loader)

    def __repr__(self) -> str:
        where = self._sharding if self._sharding is not None else self._device
        return f"JaxLoader({self._loader!r}, on={where!r}, prefetch={self._prefetch})"

    def element_spec(self) -> Any:
        """A pytree of ``jax.ShapeDtypeStruct``: the global shape, device dtype and sharding.

        Use it to compile before the first batch: ``jax.jit(step).lower(state, spec)``.
        From the Loader's :meth:`~mixle.Loader.element_spec`; with ``drop_last=False`` the
        last batch of an epoch may be shorter.

        Raises
        ------
        DtypePolicyError
            (a ``TypeError``) a leaf ``dtype_policy`` refuses, the error batches would raise.
        """
        sharding = self._sharding
        if sharding is None and self._device is not None:
            sharding = jax.sharding.SingleDeviceSharding(self._device)
        lay = self._loader.layout
        scale = lay.num_shards if spans_processes(self._sharding) else 1
        return jax_spec(
            self._loader.element_spec(),
            sharding=sharding,
            dtype_policy=self._policy,
            leading_scale=scale,
        )

    # -- iteration ----------------------------------------------------------------------
    def _place(self, item: _Received) -> _Received:
        placed = to_jax(
            item.batch, device=self._device, sharding=self._sharding, dtype_policy=self._policy
        )
        return item._replace(batch=placed)

    def _host_batches(self, signal: StopSignal) -> Iterator[_Received]:
        """Loader batches with the cursor, indices and epoch of each (in the prefetch thread).

        ``signal`` stops the Loader's run from the caller's thread, which wakes the
        prefetch thread if it waits for the Loader's reader threads.
        """
        loader = self._loader
        run = loader._iterate(signal)
        try:
            for batch in run:
                state = loader._shared_state()  # copied by state_dict() when asked
                indices = loader.last_indices  # set before the Loader yields a batch
                # the cursor moved past the batch: to batch 0 of the next epoch after the last
                epoch = state["epoch"] - 1 if state["batch"] == 0 else state["epoch"]
                yield _Received(batch, state, indices, epoch)
                del batch
        finally:
            run.close()  # type: ignore[attr-defined]

    def __iter__(self) -> Iterator[Any]:
        self.close()
        self._loader.load_state_dict(self._state)  # batches prefetched, never received
        signal = StopSignal()
        host = self._host_batches(signal)
        stream: Iterator[_Received]
        if self._prefetch:
            stream = DevicePrefetcher(host, self._place, self._prefetch, on_stop=signal.set)
        else:
            stream = place_each(host, self._place)
        return self._start_run(self._run(stream))

    def _run(self, stream: Iterator[_Received]) -> Iterator[Any]:
        try:
            for item in stream:
                self._state = item.state
                self._last_indices, self._last_epoch = item.indices, item.epoch
                batch = item.batch
                del item
                yield batch
                del batch
            self._state = self._loader.state_dict()  # the end of the run
        finally:
            stream.close()  # type: ignore[attr-defined]

    # -- resume -------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The Loader's state at the batch after the last one the loop received (a copy:
        changing it changes nothing here)."""
        state = dict(self._state)
        remainder = state.get("remainder")
        if isinstance(remainder, dict):
            state["remainder"] = {**remainder, "read": [list(r) for r in remainder["read"]]}
        return state

    def load_state_dict(self, state: dict[str, Any], *, reshard: bool = False) -> None:
        """Resume at the batch after the one ``state`` was taken at; with ``reshard=True``
        ``state`` may come from another batch size or shard layout (or be
        :func:`mixle.merge_states` of every shard's), as in
        :meth:`mixle.Loader.load_state_dict`.

        Raises
        ------
        LoaderStateError
            (a ``ValueError``) as :meth:`mixle.Loader.load_state_dict`.
        """
        self.close()
        self._loader.load_state_dict(state, reshard=reshard)
        self._state = self._loader.state_dict()
