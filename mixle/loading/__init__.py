"""Batches, epoch shuffles, sharding, transforms, prefetch and exact resume for any source."""

from mixle.loading.batching import MASK_KEY, attach_mask, stack_records, unstack_batch
from mixle.loading.loader import Loader
from mixle.loading.plan import BatchPlan, record_rng
from mixle.loading.resume import merge_states
from mixle.loading.state import LoaderStateError, source_fingerprint
from mixle.loading.streams import StreamLoader, is_stream

__all__ = [
    "MASK_KEY",
    "BatchPlan",
    "Loader",
    "LoaderStateError",
    "StreamLoader",
    "attach_mask",
    "is_stream",
    "merge_states",
    "record_rng",
    "source_fingerprint",
    "stack_records",
    "unstack_batch",
]
