"""Stack records into batches, split batches back into records, and attach a padding mask.

A batch has the structure of one record with every leaf stacked on a new leading axis:
tuples stay tuples, lists stay lists, dicts stay dicts. With ``drop_last="pad"`` a boolean
mask of real rows travels inside the batch (:func:`attach_mask`).
"""

from __future__ import annotations

from typing import Any

from mixle.data.batches import stack_records, unstack_batch

__all__ = ["MASK_KEY", "attach_mask", "stack_records", "unstack_batch"]

#: The key of the padding mask in batches of dict records.
MASK_KEY = "mask"


def attach_mask(batch: Any, mask: Any) -> Any:
    """``batch`` with its padding ``mask`` inside: a ``"mask"`` key or a last element.

    Dict batches get ``batch["mask"]``; tuple and list batches get the mask as their last
    element; a batch that is a single array becomes the tuple ``(batch, mask)``.

    Raises
    ------
    ValueError
        A dict batch already has a ``"mask"`` key.
    """
    if isinstance(batch, dict):
        if MASK_KEY in batch:
            raise ValueError(
                f"records already have a {MASK_KEY!r} key, so drop_last='pad' cannot add the "
                "padding mask; rename the field in a transform or use drop_last=True"
            )
        return {**batch, MASK_KEY: mask}
    if isinstance(batch, (tuple, list)):
        return type(batch)([*batch, mask])
    return (batch, mask)
