"""``scan_epoch``: a whole epoch of training steps in one jitted ``lax.scan`` on the device.

The epoch's order is the host Loader's (:func:`mixle.jax.permute`), each batch is gathered
from a :class:`~mixle.jax.DeviceSource` inside the scan, and the step runs there too: no
host round trip and no Python per step. ``seed`` and ``epoch`` are traced, so the scan
compiles once per batch shape and seed, not once per epoch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from mixle.data.index_math.hashing import MASK64, parse_seed
from mixle.data.index_math.sharding import parse_drop_last
from mixle.jax.convert import jax, x64_enabled
from mixle.jax.device_source import DeviceSource, parse_size
from mixle.jax.keys import record_keys
from mixle.loading.batching import attach_mask
from mixle.utils.validation import parse_int

__all__ = ["BatchInfo", "scan_epoch"]

jnp = jax.numpy


class BatchInfo(NamedTuple):
    """What a step is told about its batch, with ``with_info=True`` (a pytree).

    Attributes
    ----------
    indices
        The batch's record indices (int32; int64 with x64 on).
    mask
        ``True`` for real rows, ``False`` for the padding rows of ``drop_last="pad"``.
    keys
        One typed PRNG key per row: :func:`mixle.jax.record_keys` of ``(seed, epoch,
        record index)``, the same keys a host loop gets for the same records, whatever
        the batch size.
    batch
        The batch's number in the epoch (an int32 scalar).
    """

    indices: Any
    mask: Any
    keys: Any
    batch: Any


def _scan(
    state: Any,
    source: DeviceSource,
    epoch: Any,
    *,
    seed: int,
    step: Callable[..., Any],
    size: int,
    num_steps: int,
    first_batch: int,
    batch_rows: int,
    shuffle: bool,
    pad: bool,
    with_info: bool,
    has_aux: bool,
    unroll: int,
) -> tuple[Any, Any]:
    n = len(source)
    rows = jnp.arange(size)

    def body(carry: Any, t: Any) -> tuple[Any, Any]:
        batch_number = first_batch + t
        start = batch_number * batch_rows
        indices = source.indices_at(start, size, seed=seed if shuffle else None, epoch=epoch)
        batch = source.gather(indices)
        mask = start + rows < n
        if pad:
            batch = attach_mask(batch, mask)
        if with_info:
            info = BatchInfo(indices, mask, record_keys(seed, epoch, indices), batch_number)
            result = step(carry, batch, info)
        else:
            result = step(carry, batch)
        if has_aux:
            if not (isinstance(result, tuple) and len(result) == 2):
                raise TypeError(
                    "with has_aux=True the step must return (state, aux), got "
                    f"{type(result).__name__}"
                )
            return result
        return result, None

    steps = jnp.arange(num_steps, dtype=jnp.int64 if x64_enabled() else jnp.int32)
    return jax.lax.scan(body, state, steps, unroll=unroll)


_scan_jit = jax.jit(
    _scan,
    static_argnames=(
        "seed",
        "step",
        "size",
        "num_steps",
        "first_batch",
        "batch_rows",
        "shuffle",
        "pad",
        "with_info",
        "has_aux",
        "unroll",
    ),
)


def scan_epoch(
    step: Callable[..., Any],
    state: Any,
    source: DeviceSource,
    batch_size: int,
    *,
    seed: int = 0,
    epoch: int = 0,
    shuffle: bool = True,
    drop_last: bool | str = False,
    with_info: bool = False,
    has_aux: bool = False,
    unroll: int = 1,
) -> Any:
    """Run ``step(state, batch) -> state`` over every batch of one epoch, on the device.

    Parameters
    ----------
    step
        ``step(state, batch) -> state`` (``step(state, batch, info)`` with ``with_info``;
        returning ``(state, aux)`` with ``has_aux``). Traced once per batch shape: pass the
        same function object each epoch (a new ``lambda`` per call compiles again).
    state
        Any pytree of arrays (parameters, optimiser state, a step counter...).
    source
        A :class:`~mixle.jax.DeviceSource`.
    batch_size
        Rows per batch (``>= 1``).
    seed, epoch
        The epoch's order, as the Loader's ``seed`` and epoch: batch ``t`` holds the
        records :class:`mixle.Loader` ``(records, batch_size, shuffle=shuffle, seed=seed)``
        reads as batch ``t`` of epoch ``epoch``. ``epoch`` is traced (no compile per
        epoch); ``seed`` is part of the compiled program (a new seed compiles again).
    shuffle
        Shuffle the epoch (default) or read records in order.
    drop_last
        ``False``: the last, short batch runs after the scan (one more compile, for its
        shape). ``True``: it is dropped. ``"pad"``: it is padded to ``batch_size`` with
        repeated records and every batch carries the Loader's mask of real rows
        (``batch["mask"]`` for dict records, the last element of tuple records,
        ``(batch, mask)`` for array records).
    with_info
        Call ``step(state, batch, info)`` with a :class:`BatchInfo`: the record indices,
        the mask, per-record PRNG keys (:func:`mixle.jax.record_keys`, keyed by
        ``(seed, epoch, record index)``) and the batch number. What the step does not use
        is compiled away.
    has_aux
        The step returns ``(state, aux)``; ``aux`` of every batch comes back stacked on a
        new leading axis. With a short last batch (``drop_last=False``) its leaves must
        have the same shape for that batch too (a loss does; per-row values need
        ``drop_last="pad"`` or ``True``).
    unroll
        ``lax.scan``'s ``unroll``.

    Returns
    -------
    The final state; ``(state, aux)`` with ``has_aux``, ``aux`` stacked over the batches
    (``None`` if the epoch has no batch).

    Raises
    ------
    TypeError
        ``source`` is not a ``DeviceSource``, or an argument has the wrong type.
    ValueError
        ``batch_size``, ``epoch`` or ``unroll`` out of range, ``drop_last`` is not
        ``False``, ``True`` or ``"pad"``, or a short last batch's ``aux`` has another shape.

    Notes
    -----
    The scan is jitted with ``step``, ``seed`` and the batch geometry static and
    ``state``, ``source`` and ``epoch`` traced, so successive epochs reuse one compiled
    program. Nothing is donated: ``state`` stays valid.
    """
    if not isinstance(source, DeviceSource):
        raise TypeError(
            f"source must be a mixle.jax.DeviceSource, got {type(source).__name__}; wrap "
            "your arrays or source with DeviceSource(...) once, outside the epoch loop"
        )
    if not callable(step):
        raise TypeError(f"step={step!r} must be callable: step(state, batch) -> state")
    batch_size = parse_size(batch_size, "batch_size")
    epoch = parse_int(epoch, "epoch")
    if not 0 <= epoch < 2**31:
        raise ValueError(f"epoch={epoch} must be in [0, 2**31)")
    unroll = parse_size(unroll, "unroll")
    drop = parse_drop_last(drop_last)
    if not isinstance(shuffle, bool):
        raise TypeError(f"shuffle={shuffle!r} must be True or False")
    n = len(source)
    full, tail = divmod(n, batch_size)
    if drop == "pad":
        full, tail = -(-n // batch_size), 0
    elif drop is True:
        tail = 0
    common = dict(
        step=step,
        batch_rows=batch_size,
        shuffle=shuffle,
        with_info=with_info,
        has_aux=has_aux,
        unroll=unroll,
    )
    seed = parse_seed(seed) & MASK64
    epoch_arg = jnp.asarray(epoch, dtype=jnp.int32)
    parts = []
    if full:
        state, aux = _scan_jit(
            state,
            source,
            epoch_arg,
            seed=seed,
            size=batch_size,
            num_steps=full,
            first_batch=0,
            pad=drop == "pad",
            **common,
        )
        parts.append(aux)
    if tail:
        state, aux = _scan_jit(
            state,
            source,
            epoch_arg,
            seed=seed,
            size=tail,
            num_steps=1,
            first_batch=full,
            pad=False,
            **common,
        )
        parts.append(aux)
    if not has_aux:
        return state
    if not parts:
        return state, None
    if len(parts) == 1:
        return state, parts[0]
    return state, _stack_tail(*parts)


def _stack_tail(scanned: Any, tail: Any) -> Any:
    """The short last batch's ``aux`` after the others', when its leaves have their shape."""
    leaves, tail_leaves = jax.tree_util.tree_leaves(scanned), jax.tree_util.tree_leaves(tail)
    for full, short in zip(leaves, tail_leaves):
        if full.shape[1:] != short.shape[1:]:
            raise ValueError(
                f"the step's aux has shape {full.shape[1:]} for a full batch but "
                f"{short.shape[1:]} for the short last batch, so they cannot be stacked; "
                "return per-batch values of a fixed shape (a loss), or use drop_last='pad' "
                "or drop_last=True"
            )
    return jax.tree_util.tree_map(lambda a, b: jnp.concatenate([a, b]), scanned, tail)
