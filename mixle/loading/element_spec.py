"""The element spec of a Loader's batches: from the source's metadata or from one read batch.

A Loader reports the shapes and dtypes of one batch without reading when it can: the
source's ``element_spec()`` with a leading ``batch_size`` axis (:func:`spec_from_metadata`).
When a transform may change the record, or the source reports nothing, the Loader reads
batch 0 of epoch 0 once and widens that batch's leading axis to ``batch_size``
(:func:`widen_leading`), since the first batch may be short with ``drop_last=False``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mixle.data.spec import ArraySpec, SpecTree, batch_spec
from mixle.loading.batching import attach_mask
from mixle.loading.spec_check import record_spec_of

__all__ = ["spec_from_metadata", "widen_leading"]


def spec_from_metadata(
    source: Any, batch_size: int, *, transformed: bool, padded: bool
) -> SpecTree | None:
    """The batch spec from ``source.element_spec()``, or ``None`` when it cannot be trusted.

    Parameters
    ----------
    source
        The Loader's source; its ``element_spec`` (when callable) describes one record.
    batch_size
        Rows per batch: the length of the new leading axis.
    transformed
        A ``transform`` or ``record_transform`` is set, so the record's spec says nothing
        about the batch; the answer is then ``None``.
    padded
        ``drop_last="pad"``: a mask ``ArraySpec((batch_size,), bool)`` is attached the way
        :func:`mixle.loading.batching.attach_mask` attaches it to a batch.

    Returns
    -------
    SpecTree or None
        ``None`` also when the source declares no spec the Loader can use
        (:func:`mixle.loading.spec_check.record_spec_of`).
    """
    if transformed:
        return None
    record = record_spec_of(source)
    if record is None:
        return None
    spec = batch_spec(record, batch_size)
    if padded:
        spec = attach_mask(spec, ArraySpec((batch_size,), np.dtype(np.bool_)))
    return spec


def widen_leading(spec: SpecTree, rows: int, batch_size: int) -> SpecTree:
    """``spec`` with leading axes of length ``rows`` widened to ``batch_size``.

    ``spec`` is the spec of a batch of ``rows`` records (dicts, tuples and lists are
    walked); a leaf whose first axis is not ``rows`` (e.g. a per-batch scalar a
    ``transform`` returned) is kept as it is.
    """
    if isinstance(spec, dict):
        return {key: widen_leading(item, rows, batch_size) for key, item in spec.items()}
    if isinstance(spec, (tuple, list)):
        return type(spec)(widen_leading(item, rows, batch_size) for item in spec)
    if spec.shape and spec.shape[0] == rows:
        return ArraySpec((batch_size, *spec.shape[1:]), spec.dtype)
    return spec
