"""The Loader's resume state: a small JSON-able dict, and the checks made when it is loaded."""

from __future__ import annotations

import hashlib
import json
import operator
import re
import reprlib
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from mixle.errors import LoaderStateError

if TYPE_CHECKING:
    from mixle.loading.base import ShardLayoutLike

__all__ = [
    "DERIVED_STATE_KEYS",
    "LAYOUT_CHECKS",
    "LEGACY_STATE_VERSION",
    "LAYOUT_MATCH",
    "OPTIONAL_STATE_KEYS",
    "STATE_KEYS",
    "STATE_VERSION",
    "STREAM_STATE_VERSION",
    "LoaderStateError",
    "ValueCheck",
    "check_cursor",
    "check_mapping",
    "check_matching",
    "check_state",
    "check_values",
    "check_version",
    "fingerprint",
    "int_at_least",
    "layout_state",
    "one_of",
    "show",
    "source_fingerprint",
]

#: Version of the Loader's state dict layout; a state of another version is refused,
#: except one of :data:`LEGACY_STATE_VERSION`.
STATE_VERSION = 3
#: The version before ``global_position`` and ``remainder``: its states (which lack them)
#: still load, as states of runs that started at the beginning.
LEGACY_STATE_VERSION = 2
#: The version of a stream Loader's state dict layout.
STREAM_STATE_VERSION = 2
#: Public attributes folded into the fingerprint when a source has them.
_FINGERPRINT_ATTRS = ("shape", "dtype", "patch_size", "stride", "grid_shape", "seed")
#: Hex digits in a source fingerprint.
_FINGERPRINT_DIGITS = 16
_FINGERPRINT = re.compile(f"[0-9a-f]{{{_FINGERPRINT_DIGITS}}}")
#: How values are shown in error messages (a long or deep value is abridged).
_SHOW = reprlib.Repr()
_SHOW.maxstring, _SHOW.maxother = 60, 60


#: A state key's check, and the words that say what it expects (for the error message).
ValueCheck = tuple[Callable[[object], bool], str]


def int_at_least(minimum: int | None) -> Callable[[object], bool]:
    """A check that a state value is a Python or NumPy integer (never a bool or a float)
    of at least ``minimum`` (any when ``None``)."""

    def check(value: object) -> bool:
        if isinstance(value, (bool, np.bool_)):
            return False
        try:
            number = operator.index(value)  # type: ignore[arg-type]
        except TypeError:
            return False
        return minimum is None or number >= minimum

    return check


def _is_bool(value: object) -> bool:
    return isinstance(value, (bool, np.bool_))


def one_of(*choices: object) -> Callable[[object], bool]:
    """A check that a state value is one of ``choices``, of the same type (``1`` is not
    ``True``)."""

    def check(value: object) -> bool:
        return any(type(value) is type(c) and value == c for c in choices)

    return check


#: The checks of the keys :func:`layout_state` writes (both loaders' states hold them).
LAYOUT_CHECKS: dict[str, ValueCheck] = {
    "batch_size": (int_at_least(1), "an int >= 1"),
    "drop_last": (one_of(False, True, "pad"), "False, True or 'pad'"),
    "shard_index": (int_at_least(0), "an int >= 0"),
    "num_shards": (int_at_least(1), "an int >= 1"),
    "shard_layout": (one_of("interleaved", "blocked"), "'interleaved' or 'blocked'"),
}
#: For :func:`check_matching`: the layout keys, and what differs when one does.
LAYOUT_MATCH = (tuple(LAYOUT_CHECKS), "it was saved with another batch or shard layout")
#: What each key of a state must hold: a check, and the words that say what it expects.
_EXPECTED: dict[str, ValueCheck] = {
    "version": (int_at_least(1), "an int, the state layout version"),
    "source": (
        lambda v: isinstance(v, str) and _FINGERPRINT.fullmatch(v) is not None,
        f"a source fingerprint: a str of {_FINGERPRINT_DIGITS} lowercase hex digits",
    ),
    "num_records": (int_at_least(0), "an int >= 0"),
    **LAYOUT_CHECKS,
    "seed": (int_at_least(None), "an int"),
    "shuffle": (_is_bool, "True or False"),
    "shuffle_block": (int_at_least(1), "an int >= 1 (records a shuffle moves as one block)"),
    "num_epochs": (lambda v: v is None or int_at_least(1)(v), "an int >= 1 or None"),
    "epoch": (int_at_least(0), "an int >= 0 (the epoch of the next batch)"),
    "batch": (int_at_least(0), "an int >= 0 (the next batch of the epoch)"),
    "position": (int_at_least(0), "an int >= 0 (rows of the epoch read on this shard)"),
    "global_position": (
        int_at_least(0),
        "an int >= 0 (the first position of the epoch's global order no shard has read)",
    ),
    "remainder": (
        lambda v: v is None or isinstance(v, Mapping),
        "None or a dict with the keys epoch, start, batch and read (where a resumed run started)",
    ),
    "merged": (one_of(True), "True (a state mixle.merge_states() made)"),
}
#: Keys a state holds only when they differ from these values; a state without one means
#: the value (so states saved before the key existed still load, and still mean the same).
OPTIONAL_STATE_KEYS: dict[str, object] = {"shuffle_block": 1, "merged": False}
#: Keys a state of :data:`LEGACY_STATE_VERSION` lacks; such a state is of a run that
#: started at the beginning (``remainder=None``, ``global_position`` from ``batch``).
DERIVED_STATE_KEYS = ("global_position", "remainder")
#: Every key a state always has, in the order ``Loader.state_dict()`` writes them (an
#: optional key it writes comes where it stands in ``_EXPECTED``).
STATE_KEYS = tuple(key for key in _EXPECTED if key not in OPTIONAL_STATE_KEYS)
_FIX = "pass the dict Loader.state_dict() returned (a JSON round trip keeps it)"
_SOURCE_MATCH = (
    ("source", "num_records"),
    "it was saved for another source or sampler configuration",
)
_ORDER_MATCH = (
    ("seed", "shuffle", "shuffle_block", "num_epochs"),
    "it was saved with another order",
)
#: Keys that must equal this loader's for a state to resume it, and what differs if not.
_MUST_MATCH = (_SOURCE_MATCH, LAYOUT_MATCH, _ORDER_MATCH)
#: The same with ``reshard=True``: batch size, shard count, index and layout may change.
_RESHARD_MATCH = (
    _SOURCE_MATCH,
    (("drop_last",), "it was saved with another drop_last; reshard keeps drop_last"),
    _ORDER_MATCH,
)


def show(value: object) -> str:
    """``repr(value)``, abridged when long (for error messages)."""
    return _SHOW.repr(value)


def layout_state(layout: ShardLayoutLike) -> dict[str, Any]:
    """The state keys of a shard layout (``ShardLayout`` or ``StreamLayout``), in order:
    ``batch_size``, ``drop_last``, ``shard_index``, ``num_shards``, ``shard_layout``."""
    return {
        "batch_size": layout.batch_size,
        "drop_last": layout.drop_last,
        "shard_index": layout.shard_index,
        "num_shards": layout.num_shards,
        "shard_layout": "blocked" if layout.blocked else "interleaved",
    }


def check_mapping(state: object, made_by: str) -> Mapping[str, Any]:
    """``state``, unless it is not a mapping: then :class:`LoaderStateError` (``made_by``
    says what makes a state, for the message)."""
    if not isinstance(state, Mapping):
        raise LoaderStateError(
            f"state must be a dict from {made_by}, got {show(state)} ({type(state).__name__})"
        )
    return state


def check_values(state: Mapping[str, Any], checks: Mapping[str, ValueCheck], fix: str) -> None:
    """Raise :class:`LoaderStateError` at the first key of ``checks`` whose value in
    ``state`` fails its check (a key ``state`` lacks is skipped), naming the key, the value,
    what it must be and ``fix``."""
    for key, (check, what) in checks.items():
        if key in state and not check(state[key]):
            raise LoaderStateError(
                f"state {key}={show(state[key])} ({type(state[key]).__name__}) is not valid: "
                f"{key} must be {what}; {fix}"
            )


def check_version(
    state: Mapping[str, Any], expected: Mapping[str, Any], legacy: tuple[int, ...] = ()
) -> None:
    """Raise :class:`LoaderStateError` unless ``state`` has ``expected``'s ``version`` (or
    one of ``legacy``)."""
    if state["version"] != expected["version"] and state["version"] not in legacy:
        raise LoaderStateError(
            f"state version={state['version']!r} is not this mixle's state version "
            f"{expected['version']}"
        )


def check_matching(
    state: Mapping[str, Any],
    expected: Mapping[str, Any],
    groups: Iterable[tuple[Iterable[str], str]],
    same: str,
    *,
    defaults: Mapping[str, object] | None = None,
    hints: Mapping[str, str] | None = None,
) -> None:
    """Raise :class:`LoaderStateError` at the first key of ``groups`` (``(keys, what differs
    when one does)``) whose value in ``state`` is not ``expected``'s.

    ``same`` names what to build the Loader with again (``"source"``, ``"stream"``);
    ``defaults`` are the values of keys either may leave out, ``hints`` words added to the
    message of a key.
    """
    defaults = defaults or {}
    for keys, what in groups:
        for key in keys:
            default = defaults.get(key)
            found, want = state.get(key, default), expected.get(key, default)
            if found != want:
                hint = (hints or {}).get(key, "")
                raise LoaderStateError(
                    f"cannot resume: state {key}={found!r} but this loader has "
                    f"{key}={want!r} ({what}); build the Loader with the same "
                    f"{same} and arguments as the run that saved it{hint}"
                )


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
    return fingerprint(source, _source_parts)


def _source_parts(source: Any) -> dict[str, str]:
    parts = {"type": type(source).__qualname__, "len": str(len(source))}
    spec = getattr(source, "element_spec", None)
    if callable(spec):
        parts["spec"] = repr(spec())
    for name in _FINGERPRINT_ATTRS:
        value = getattr(source, name, None)
        if value is not None and not callable(value):
            parts[name] = repr(value)
    return parts


def fingerprint(source: Any, describe: Callable[[Any], Mapping[str, str]]) -> str:
    """16 hex digits of the SHA-256 of ``source.fingerprint()`` when the source defines
    it, else of the parts ``describe(source)`` names (as sorted JSON)."""
    custom = getattr(source, "fingerprint", None)
    text = (
        f"custom:{custom()}" if callable(custom) else json.dumps(describe(source), sort_keys=True)
    )
    return hashlib.sha256(text.encode()).hexdigest()[:_FINGERPRINT_DIGITS]


def check_state(
    state: Mapping[str, Any], expected: Mapping[str, Any], *, reshard: bool = False
) -> None:
    """Raise :class:`LoaderStateError` unless ``state`` can resume a loader with ``expected``.

    ``expected`` is the loader's own state dict. ``state`` must have exactly its keys, each
    with a value of the right type and range (an int is a Python or NumPy integer, never a
    bool or a float), and the same source, layout and order (with ``reshard``, the batch
    size and shard layout may differ); the cursor keys (``epoch``, ``batch``,
    ``position``, ``global_position``, ``remainder``) are checked by the loader itself.
    A key of :data:`OPTIONAL_STATE_KEYS` may be absent from either, meaning its value
    there, and one of :data:`DERIVED_STATE_KEYS` from ``state``. Every message names the
    key, the value found and what was expected.
    """
    check_mapping(state, "Loader.state_dict()")
    if state.get("stream") is True:
        raise LoaderStateError(
            "state was saved by a Loader over a stream (it has 'stream': True), but this "
            "Loader reads a map-style source; resume with a Loader over the stream the run "
            "that saved it read"
        )
    legacy = state.get("version") == LEGACY_STATE_VERSION
    missing = sorted(
        expected.keys()
        - state.keys()
        - OPTIONAL_STATE_KEYS.keys()
        - (set(DERIVED_STATE_KEYS) if legacy else set())
    )
    if missing:
        raise LoaderStateError(
            f"state is missing keys {missing}; was it made by Loader.state_dict()? "
            f"A Loader state has the keys {list(expected)}"
        )
    newer = [key for key in (*DERIVED_STATE_KEYS, "merged") if legacy and key in state]
    if newer:
        raise LoaderStateError(
            f"state version={LEGACY_STATE_VERSION} has the keys {newer}, which came with "
            f"version {STATE_VERSION}: {_FIX}"
        )
    unknown = sorted(state.keys() - expected.keys() - OPTIONAL_STATE_KEYS.keys(), key=repr)
    if unknown:
        found = ", ".join(f"{show(key)}: {show(state[key])}" for key in unknown)
        raise LoaderStateError(
            f"state has unknown keys {{{found}}}; a Loader state has only the keys "
            f"{list(expected)}: {_FIX}"
        )
    check_values(state, _EXPECTED, _FIX)  # an optional key left out is skipped
    check_version(state, expected, (LEGACY_STATE_VERSION,))
    hints = {"source": " (and, for a sampler, call set_epoch() with the epoch it had)"}
    if not reshard:
        fix = "; to go on with another batch_size or shard layout, pass reshard=True"
        hints |= {key: fix for key in LAYOUT_CHECKS if key != "drop_last"}
    check_matching(
        state,
        expected,
        _RESHARD_MATCH if reshard else _MUST_MATCH,
        "source",
        defaults=OPTIONAL_STATE_KEYS,
        hints=hints,
    )


def check_cursor(
    state: Mapping[str, Any],
    num_batches: int,
    num_epochs: int | None,
    batch_size: int,
    shard_length: int,
    first: int = 0,
) -> tuple[int, int]:
    """``(epoch, batch)`` of a checked ``state``, unless it is out of this loader's range.

    ``first`` and ``num_batches`` are the first batch number and the end of the state's
    epoch (a resumed epoch counts from its first batch), ``shard_length`` its rows.

    Raises
    ------
    LoaderStateError
        ``batch`` is outside ``[first, num_batches]``, ``epoch`` past ``num_epochs``, or
        ``position`` is not ``min((batch - first) * batch_size, shard_length)``; the
        message names the key, the value and the range.
    """
    epoch, batch = operator.index(state["epoch"]), operator.index(state["batch"])
    position = min((batch - first) * batch_size, shard_length)
    problem = None
    if not first <= batch <= num_batches:
        problem = (
            f"batch={batch} is outside the batches {first} to {num_batches} of epoch {epoch}"
            if first
            else f"batch={batch} is past the {num_batches} batches per epoch (0 to {num_batches})"
        )
    elif num_epochs is not None and epoch > num_epochs:
        problem = f"epoch={epoch} is past num_epochs={num_epochs}"
    elif num_epochs is not None and epoch == num_epochs and batch != 0:
        problem = (
            f"epoch={epoch} with batch={batch}: a run of num_epochs={num_epochs} ends at "
            f"epoch={num_epochs}, batch=0"
        )
    elif operator.index(state["position"]) != position:
        problem = (
            f"position={state['position']!r} does not match batch={batch}: expected "
            f"position={position} (rows of the epoch this shard read: batch * batch_size, "
            "at most the shard's rows)"
        )
    if problem is not None:
        raise LoaderStateError(
            f"state {problem}; it is not a cursor of this loader ({num_batches} batches per "
            f"epoch, num_epochs={num_epochs}): {_FIX}"
        )
    return epoch, batch
