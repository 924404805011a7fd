"""JAX backend: batches as ``jax.Array`` pytrees on devices, sharded, prefetched, jit-ready.

Importing this module imports jax (``pip install -e ".[jax]"``); ``import mixle`` does not.
Nothing here changes JAX's global configuration: 64-bit leaves follow an explicit
``dtype_policy`` while ``jax_enable_x64`` is off (see :mod:`mixle.jax.convert`).

- :func:`to_jax`: one batch onto a device or a sharding.
- :func:`prefetch_to_device`: any iterator of batches, a few kept in flight on the device.
- :class:`JaxLoader`: a :class:`mixle.Loader` whose batches arrive on devices, laid out by a
  ``jax.sharding.Sharding`` across devices and processes, with the Loader's resume state
  and a ``jax.ShapeDtypeStruct`` element spec.
"""

from mixle.jax.convert import (
    DTYPE_POLICIES,
    DtypeOverflowError,
    DtypePolicy,
    DtypePolicyError,
    device_dtype,
    jax_spec,
    to_jax,
    x64_enabled,
)
from mixle.jax.loader import JaxLoader, batch_axis_blocks, process_shard
from mixle.jax.prefetch import THREAD_NAME, prefetch_to_device
from mixle.loading.adapters import register_adapter

__all__ = [
    "DTYPE_POLICIES",
    "THREAD_NAME",
    "DtypeOverflowError",
    "DtypePolicy",
    "DtypePolicyError",
    "JaxLoader",
    "batch_axis_blocks",
    "device_dtype",
    "jax_spec",
    "prefetch_to_device",
    "process_shard",
    "to_jax",
    "x64_enabled",
]

register_adapter("jax", JaxLoader.from_loader)  # Loader.to_jax() finds it here
