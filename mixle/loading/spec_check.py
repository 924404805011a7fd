"""``check_spec``: whether the batches a source returns match the ``element_spec()`` it declares.

A source declares one record's shapes and dtypes in ``element_spec()``; the Loader, asked
to, checks each batch the source returns against that declaration with a leading axis of
the batch's rows, *before* ``record_transform`` and ``transform`` (which may change the
record on purpose). A source that breaks its own declaration then fails at the batch with
the field that disagrees, instead of handing a surprise to JAX (a recompile, a wrong
dtype) many steps later.
"""

from __future__ import annotations

from typing import Any

from mixle.data.spec import SpecTree, batch_spec, validate_batch
from mixle.errors import SchemaMismatchError

__all__ = ["CHECK_SPEC_POLICIES", "check_source_batch", "parse_check_spec", "record_spec_of"]

#: ``check_spec`` values, as the policy each means: every batch, the first batch of each
#: epoch and of each run (the default), or never.
CHECK_SPEC_POLICIES: dict[object, str] = {True: "every", "first": "first", False: "off"}


def parse_check_spec(check_spec: object) -> str:
    """``check_spec`` (``True``, ``"first"`` or ``False``) as ``"every"``, ``"first"`` or
    ``"off"``.

    Raises
    ------
    ValueError
        Any other value (the message names it and the accepted ones).
    """
    if isinstance(check_spec, (bool, str)) and check_spec in CHECK_SPEC_POLICIES:
        return CHECK_SPEC_POLICIES[check_spec]
    raise ValueError(
        f"check_spec={check_spec!r} must be True (check every batch against the source's "
        "element_spec()), 'first' (the first batch of each epoch and run, the default) or "
        "False (never)"
    )


def record_spec_of(source: Any) -> SpecTree | None:
    """``source.element_spec()`` when it declares one the check can use, else ``None``.

    ``None`` when the source has no callable ``element_spec``, its ``element_spec()``
    raises ``NotImplementedError`` or ``TypeError``, reports ``None``, or reports something
    that is not a tree of :class:`~mixle.data.spec.ArraySpec` (a ``TypeError`` from
    :func:`~mixle.data.spec.batch_spec`): such a source declares nothing to check.
    """
    report = getattr(source, "element_spec", None)
    if not callable(report):
        return None
    try:
        spec = report()
    except (NotImplementedError, TypeError):
        return None
    if spec is None:
        return None
    try:
        batch_spec(spec, 1)
    except TypeError:
        return None
    return spec


def check_source_batch(
    batch: Any, record_spec: SpecTree, rows: int, *, source: Any, where: str
) -> None:
    """Check a batch ``source`` returned against its ``record_spec`` with ``rows`` rows.

    Parameters
    ----------
    batch
        What the source returned for ``rows`` records (before any transform).
    record_spec
        The source's ``element_spec()``: one record.
    rows
        Records the batch holds (its leading axis).
    source
        Named in the message.
    where
        Which batch it was, for the message (e.g. ``"batch 3 of epoch 0"``).

    Raises
    ------
    SchemaMismatchError
        (a ``ValueError``) naming the field that differs (``batch['image']``,
        ``batch[0]``), its shape and dtype, the declared ones, the source and the batch;
        ``Loader(check_spec=False)`` turns the check off.
    """
    try:
        validate_batch(batch, batch_spec(record_spec, rows))
    except SchemaMismatchError as exc:
        raise SchemaMismatchError(
            f"{type(source).__name__} returned a batch that breaks its own element_spec() "
            f"at {where}: {exc} (the spec with a leading axis of the batch's {rows} rows). "
            "Fix the source's element_spec() or its reads; Loader(check_spec=False) skips "
            "the check"
        ) from None
