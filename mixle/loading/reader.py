"""What reading one batch does, as a picklable object: threads and worker processes share it.

:class:`BatchReader` reads a :class:`~mixle.loading.plan.BatchPlan`'s records (one
``get_batch`` call when the source has it), runs ``record_transform`` per record and
``transform`` on the batch, and attaches the padding mask. The Loader calls it in its reader
threads; with ``num_workers`` it is pickled once to each worker process, which calls it
there (:mod:`mixle.loading.workers`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from mixle.data.sources.compose.lineage import leaf_keys
from mixle.loading.batching import attach_mask, stack_records, unstack_batch
from mixle.loading.plan import BatchPlan, batch_rng, record_rng
from mixle.loading.spec_check import check_source_batch, record_spec_of
from mixle.utils.callables import takes_rng

__all__ = ["BatchReader", "takes_rng"]


@dataclass(frozen=True)
class BatchReader:
    """Read, transform and mask one batch of ``source``; a pure function of the plan.

    Attributes
    ----------
    source
        The Loader's source.
    batched
        The source has ``get_batch(indices)``; else records are read one by one.
    seed, shard_index
        Key the per-record (:func:`~mixle.loading.plan.record_rng`) and per-batch
        (:func:`~mixle.loading.plan.batch_rng`) generators.
    record_transform, transform
        The Loader's transforms (``None``: none); ``transform`` gets ``(batch, rng)``
        when ``transform_rng``.
    check_spec
        ``"every"``, ``"first"`` (plans marked ``first``) or ``"off"``: which batches the
        source returns are checked against its ``element_spec()``, before the transforms
        (:mod:`mixle.loading.spec_check`).
    """

    source: Any
    batched: bool
    seed: int
    shard_index: int
    record_transform: Callable[[Any, np.random.Generator], Any] | None
    transform: Callable[..., Any] | None
    transform_rng: bool
    check_spec: str = "off"
    _spec: list[Any] = field(default_factory=list, compare=False, repr=False)

    def record_keys(self, indices: NDArray[np.int64]) -> NDArray[np.uint64]:
        """What ``record_transform``'s randomness is keyed on: the source's
        ``record_keys(indices)`` when it has them (composed sources: the record's origin),
        else the indices."""
        return leaf_keys(self.source, indices)

    def record_spec(self) -> Any:
        """The source's declared record spec (``None``: none), asked once per copy."""
        if not self._spec:  # a benign race between threads: both ask, one answer is kept
            self._spec.append(record_spec_of(self.source))
        return self._spec[0]

    def _check(self, batch: Any, plan: BatchPlan) -> None:
        spec = self.record_spec()
        if spec is not None:
            where = f"batch {plan.batch} of epoch {plan.epoch}"
            check_source_batch(batch, spec, plan.indices.size, source=self.source, where=where)

    def __call__(self, plan: BatchPlan) -> Any:
        source, indices, fn = self.source, plan.indices, self.record_transform
        check = self.check_spec == "every" or (self.check_spec == "first" and plan.first)
        if self.batched:
            batch = source.get_batch(indices)
            if check:
                self._check(batch, plan)
            if fn is not None:
                records = unstack_batch(batch, indices.size)
        else:
            records = [source[i] for i in indices.tolist()]
            if fn is None or check:
                batch = stack_records(records, self.record_spec())
            if check:
                self._check(batch, plan)
        if fn is not None:
            seed, epoch = self.seed, plan.epoch
            keys = self.record_keys(indices).tolist()
            records = [fn(record, record_rng(seed, epoch, k)) for record, k in zip(records, keys)]
            batch = stack_records(records, self.record_spec())
        if self.transform is not None:
            if self.transform_rng:
                rng = batch_rng(self.seed, plan.epoch, plan.batch, self.shard_index)
                batch = self.transform(batch, rng)
            else:
                batch = self.transform(batch)
        if plan.mask is not None:
            batch = attach_mask(batch, plan.mask)
        return batch
