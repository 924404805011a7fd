"""Batches, epoch shuffles, sharding, transforms, prefetch and exact resume for any source."""

from mixle.loading.batching import MASK_KEY, attach_mask, stack_records, unstack_batch
from mixle.loading.loader import Loader
from mixle.loading.plan import BatchPlan, record_rng
from mixle.loading.state import LoaderStateError, source_fingerprint

__all__ = [
    "MASK_KEY",
    "BatchPlan",
    "Loader",
    "LoaderStateError",
    "attach_mask",
    "record_rng",
    "source_fingerprint",
    "stack_records",
    "unstack_batch",
]
