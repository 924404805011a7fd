"""JAX backend: batches as ``jax.Array`` pytrees on devices, sharded, prefetched, jit-ready.

Importing this module imports jax (``pip install -e ".[jax]"``); ``import mixle`` does not.
Nothing here changes JAX's global configuration: 64-bit leaves follow an explicit
``dtype_policy`` while ``jax_enable_x64`` is off (see :mod:`mixle.jax.convert`).

- :func:`to_jax`: one batch onto a device or a sharding.
- :func:`prefetch_to_device`: any iterator of batches, a few kept in flight on the device.
- :class:`JaxLoader`: a :class:`mixle.Loader` whose batches arrive on devices, laid out by a
  ``jax.sharding.Sharding`` across devices and processes, with the Loader's resume state
  and a ``jax.ShapeDtypeStruct`` element spec; ``last_indices`` and ``last_epoch`` name the
  records of the batch the loop received last.
- :func:`record_keys`: typed JAX PRNG keys per record, a pure function of ``(seed, epoch,
  record index)``, so augmentation can run on the device, jitted, with the same keys
  whatever the batch, shard, thread or worker a record lands in::

      loader = JaxLoader(sampler, 32, shuffle=True, seed=seed)
      augment_batch = jax.jit(jax.vmap(augment))  # augment(key, patch) -> patch
      for patches, coords in loader:
          keys = record_keys(seed, loader.last_epoch, loader.last_indices)
          patches = augment_batch(keys, patches)

- :class:`DeviceSource`, :func:`scan_epoch`, :func:`permute`: epochs on the device. A
  dataset that fits in device memory is held there; its batches are gathered by index
  math that traces (the host Loader's Feistel order, bit for bit, in ``jax.numpy``), so
  a whole epoch of steps runs in one jitted ``lax.scan``::

      src = DeviceSource(sampler)  # read once, in batches
      for epoch in range(num_epochs):
          params = scan_epoch(train_step, params, src, 32, seed=seed, epoch=epoch)
"""

from mixle.errors import DeviceMemoryError
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
from mixle.jax.device_source import DeviceSource, free_device_bytes
from mixle.jax.feistel import inverse_permute, permute, permute_blocks
from mixle.jax.keys import DEFAULT_KEY_IMPL, record_key_data, record_keys
from mixle.jax.loader import JaxLoader, batch_axis_blocks, process_shard
from mixle.jax.prefetch import THREAD_NAME, prefetch_to_device
from mixle.jax.scan import BatchInfo, scan_epoch
from mixle.loading.adapters import register_adapter

__all__ = [
    "DEFAULT_KEY_IMPL",
    "DTYPE_POLICIES",
    "THREAD_NAME",
    "BatchInfo",
    "DeviceMemoryError",
    "DeviceSource",
    "DtypeOverflowError",
    "DtypePolicy",
    "DtypePolicyError",
    "JaxLoader",
    "batch_axis_blocks",
    "device_dtype",
    "free_device_bytes",
    "inverse_permute",
    "jax_spec",
    "permute",
    "permute_blocks",
    "prefetch_to_device",
    "process_shard",
    "record_key_data",
    "record_keys",
    "scan_epoch",
    "to_jax",
    "x64_enabled",
]

register_adapter("jax", JaxLoader.from_loader)  # Loader.to_jax() finds it here
