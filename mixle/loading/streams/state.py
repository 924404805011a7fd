"""A stream Loader's resume state: a small JSON-able dict, and the checks made when loading it.

The state is the cursor (``epoch``, ``batch``) and what it is valid for. It holds
``"stream": True``, so a map-style Loader's state (which has ``num_records`` instead) is
refused by a stream Loader with a message saying so, and the other way round the map-style
Loader refuses this one (its key ``stream`` is unknown there).
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from typing import Any

from mixle.errors import LoaderStateError
from mixle.loading.state import (
    LAYOUT_CHECKS,
    LAYOUT_MATCH,
    ValueCheck,
    check_mapping,
    check_matching,
    check_values,
    check_version,
    fingerprint,
    int_at_least,
    one_of,
)

__all__ = ["STREAM_STATE_KEYS", "check_stream_state", "stream_fingerprint"]

_FIX = "pass the dict the stream Loader's state_dict() returned (a JSON round trip keeps it)"


#: Every key of a stream state, in order, with its check and what it must hold.
_EXPECTED: dict[str, ValueCheck] = {
    "version": (int_at_least(1), "an int, the state layout version"),
    "stream": (one_of(True), "True (the state of a Loader over a stream)"),
    "source": (lambda v: isinstance(v, str) and len(v) == 16, "a 16-digit hex fingerprint"),
    **LAYOUT_CHECKS,
    "seed": (int_at_least(None), "an int"),
    "shuffle_buffer": (lambda v: v is None or int_at_least(1)(v), "an int >= 1 or None"),
    "num_epochs": (lambda v: v is None or int_at_least(1)(v), "an int >= 1 or None"),
    "epoch": (int_at_least(0), "an int >= 0 (the epoch of the next batch)"),
    "batch": (int_at_least(0), "an int >= 0 (the next batch of the epoch on this shard)"),
    "position": (
        int_at_least(0),
        "an int >= 0 (stream records of the epoch before the next batch)",
    ),
}
#: The keys of a stream Loader's state, in the order ``state_dict()`` writes them.
STREAM_STATE_KEYS = tuple(_EXPECTED)
_MUST_MATCH = (
    (("source",), "it was saved for another stream"),
    LAYOUT_MATCH,
    (("seed", "shuffle_buffer", "num_epochs"), "it was saved with another order"),
)


def stream_fingerprint(source: Any) -> str:
    """A short hex digest that tells streams apart without reading them.

    ``source.fingerprint()`` when the stream defines it; otherwise its type (for a factory,
    the function's module and qualified name), its ``element_spec()`` and its
    ``features`` (a ``datasets.IterableDataset``'s columns) when it has them.
    """
    return fingerprint(source, _stream_parts)


def _stream_parts(source: Any) -> dict[str, str]:
    kind = type(source)
    parts = {"type": f"{kind.__module__}.{kind.__qualname__}"}
    name = getattr(source, "__qualname__", None)
    if isinstance(name, str):
        parts["name"] = f"{getattr(source, '__module__', '')}.{name}"
    spec = getattr(source, "element_spec", None)
    if callable(spec):
        parts["spec"] = repr(spec())
    features = getattr(source, "features", None)  # a datasets.IterableDataset's columns
    if features is not None and not callable(features):
        parts["features"] = repr(features)
    return parts


_RESHARD_MATCH = (
    (("source",), "it was saved for another stream"),
    (("drop_last",), "it was saved with another drop_last; reshard keeps drop_last"),
    (("seed", "shuffle_buffer", "num_epochs"), "it was saved with another order"),
)


def check_stream_state(
    state: object, expected: Mapping[str, Any], *, reshard: bool = False
) -> tuple[int, int]:
    """``(epoch, batch)`` of ``state`` if it can resume a stream Loader whose state is
    ``expected``; else :class:`~mixle.LoaderStateError` naming the key, value and fix.

    With ``reshard``, ``state`` may have another batch size and shard layout: ``batch``
    is then this loader's batch that starts at the state's stream position, which must
    be a multiple of this loader's global batch (it is when the global batch size is
    kept); with several shards and ``drop_last=False`` a state past epoch 0 is refused (a
    shard may have had no rows in an epoch's last short global batch, so shards in lock
    step stand at different batches after it).
    """
    state = check_mapping(state, "the Loader's state_dict()")
    if "stream" not in state and "num_records" in state:
        raise LoaderStateError(
            "state was saved by a Loader over a map-style source (it has num_records and "
            "no 'stream' key), but this Loader reads a stream; build the Loader over the "
            "source the run that saved it used"
        )
    missing = [key for key in expected if key not in state]
    if missing:
        raise LoaderStateError(
            f"state is missing keys {missing}; a stream Loader's state has the keys "
            f"{list(expected)}: {_FIX}"
        )
    unknown = sorted((key for key in state if key not in expected), key=repr)
    if unknown:
        raise LoaderStateError(
            f"state has unknown keys {unknown}; a stream Loader's state has only the keys "
            f"{list(expected)}: {_FIX}"
        )
    check_values(state, _EXPECTED, _FIX)
    check_version(state, expected)
    hints = {} if reshard else {k: "; or pass reshard=True" for k in ("batch_size", "num_shards")}
    check_matching(
        state, expected, _RESHARD_MATCH if reshard else _MUST_MATCH, "stream", hints=hints
    )
    epoch, batch = operator.index(state["epoch"]), operator.index(state["batch"])
    global_batch = state["batch_size"] * state["num_shards"]
    num_epochs = expected["num_epochs"]
    problem = None
    if num_epochs is not None and epoch > num_epochs:
        problem = f"epoch={epoch} is past num_epochs={num_epochs}"
    elif num_epochs is not None and epoch == num_epochs and batch:
        problem = (
            f"epoch={epoch} with batch={batch}: a run of num_epochs={num_epochs} ends at batch 0"
        )
    elif state["position"] != batch * global_batch:
        problem = (
            f"position={state['position']!r} does not match batch={batch}: expected "
            f"batch * batch_size * num_shards = {batch * global_batch}"
        )
    if problem is not None:
        raise LoaderStateError(f"state {problem}; it is not a cursor of this loader: {_FIX}")
    if reshard:
        return epoch, _resharded_batch(state, expected, epoch, batch)
    return epoch, batch


def _resharded_batch(
    state: Mapping[str, Any], expected: Mapping[str, Any], epoch: int, batch: int
) -> int:
    """This loader's batch at the stream position of a checked ``state`` (see
    :func:`check_stream_state`)."""
    position = operator.index(state["position"])
    new_batch = expected["batch_size"] * expected["num_shards"]
    if position % new_batch:
        raise LoaderStateError(
            f"cannot reshard: state position={position} (stream records of epoch {epoch} "
            f"read) is not a multiple of this loader's global batch batch_size * num_shards "
            f"= {new_batch}, and a stream Loader starts at a global batch; keep the global "
            "batch size (change the per-shard batch_size with num_shards)"
        )
    if state["num_shards"] > 1 and state["drop_last"] is False and epoch:
        raise LoaderStateError(
            f"cannot reshard one shard's state of epoch {epoch}: with drop_last=False and "
            f"num_shards={state['num_shards']}, the shards may have read different numbers "
            "of batches of an earlier epoch (a shard with no rows in the stream's last short "
            "global batch), so lock-step shards may stand at different batches; reshard a "
            "state of epoch 0, or resume each shard with the same layout"
        )
    return position // new_batch
