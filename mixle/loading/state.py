"""The Loader's resume state: a small JSON-able dict, and the checks made when it is loaded."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

__all__ = ["STATE_VERSION", "LoaderStateError", "check_state", "source_fingerprint"]

#: Version of the state dict layout; a state of another version is refused.
STATE_VERSION = 2
#: Keys that must equal this loader's for a state to resume it, and what differs if not.
_SOURCE_KEYS = ("source", "num_records")
_LAYOUT_KEYS = ("batch_size", "drop_last", "shard_index", "num_shards", "shard_layout")
_ORDER_KEYS = ("seed", "shuffle", "num_epochs")
#: Public attributes folded into the fingerprint when a source has them.
_FINGERPRINT_ATTRS = ("shape", "dtype", "patch_size", "stride", "grid_shape", "seed")


class LoaderStateError(ValueError):
    """A state dict cannot resume this loader: other source, shard layout or order."""


def source_fingerprint(source: Any) -> str:
    """A short hex digest that tells sources apart without reading any data.

    Uses ``source.fingerprint()`` when the source defines it: mixle's samplers
    (:meth:`~mixle.PatchSampler.fingerprint`, :meth:`~mixle.GridSampler.fingerprint`) do,
    covering every argument that changes which record an index means (seed, current
    epoch, patch size, stride, replacement, locality, padding, weights...). Otherwise the
    type, the length, the element spec (when the source reports one) and the public
    ``shape``, ``dtype``, ``patch_size``, ``stride``, ``grid_shape`` and ``seed``
    attributes it has. Paths are left out, so a store that moved still resumes.
    """
    custom = getattr(source, "fingerprint", None)
    if callable(custom):
        text = f"custom:{custom()}"
    else:
        parts: dict[str, str] = {"type": type(source).__qualname__, "len": str(len(source))}
        spec = getattr(source, "element_spec", None)
        if callable(spec):
            parts["spec"] = repr(spec())
        for name in _FINGERPRINT_ATTRS:
            value = getattr(source, name, None)
            if value is not None and not callable(value):
                parts[name] = repr(value)
        text = json.dumps(parts, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def check_state(state: Mapping[str, Any], expected: Mapping[str, Any]) -> None:
    """Raise :class:`LoaderStateError` unless ``state`` can resume a loader with ``expected``.

    ``expected`` is the loader's own state dict; cursor keys (``epoch``, ``batch``,
    ``position``) are checked against the epoch length by the loader itself.
    """
    if not isinstance(state, Mapping):
        raise LoaderStateError(f"state must be a dict from Loader.state_dict(), got {state!r}")
    missing = sorted(expected.keys() - state.keys())
    if missing:
        raise LoaderStateError(
            f"state is missing keys {missing}; was it made by Loader.state_dict()?"
        )
    if state["version"] != expected["version"]:
        raise LoaderStateError(
            f"state version={state['version']!r} is not this mixle's state version "
            f"{expected['version']}"
        )
    for keys, what in (
        (_SOURCE_KEYS, "it was saved for another source or sampler configuration"),
        (_LAYOUT_KEYS, "it was saved with another batch or shard layout"),
        (_ORDER_KEYS, "it was saved with another order"),
    ):
        for key in keys:
            if state[key] != expected[key]:
                hint = (
                    " (and, for a sampler, call set_epoch() with the epoch it had)"
                    if key == "source"
                    else ""
                )
                raise LoaderStateError(
                    f"cannot resume: state {key}={state[key]!r} but this loader has "
                    f"{key}={expected[key]!r} ({what}); build the Loader with the same "
                    f"source and arguments as the run that saved it{hint}"
                )
