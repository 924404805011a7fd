"""What counts as a stream, and how each kind of stream opens a new pass.

A stream is a source with no length: not map-style (it lacks ``__len__`` or
``__getitem__``) and either re-iterable (``__iter__``: each ``iter()`` is a fresh pass, like
a ``datasets.IterableDataset``), a zero-argument factory returning an iterator (a generator
function), or a one-shot iterator (``iter(x) is x``, like a generator object), which can be
read once.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from typing import Any, Literal

from mixle.data.sources.records.hf.stream_source import at_epoch
from mixle.utils.optional_deps import imported

__all__ = ["ONE_SHOT_FIX", "PassLog", "StreamKind", "is_stream", "open_pass", "stream_kind"]

StreamKind = Literal["iterable", "factory", "one-shot"]

#: How to turn a one-shot iterator into a stream that can be read again.
ONE_SHOT_FIX = (
    "pass a re-iterable (an object whose __iter__ starts a new pass) or a zero-argument "
    "factory instead, e.g. Loader(make_records, ...) with the generator function itself "
    "rather than Loader(make_records(), ...)"
)


def _map_style(source: object) -> bool:
    return hasattr(source, "__len__") and hasattr(source, "__getitem__")


def _takes_no_arguments(fn: object) -> bool:
    try:
        params = inspect.signature(fn).parameters.values()  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False
    required = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    kw = inspect.Parameter.KEYWORD_ONLY
    return not any(
        p.default is inspect.Parameter.empty and (p.kind in required or p.kind == kw)
        for p in params
    )


def stream_kind(source: object) -> StreamKind | None:
    """``"iterable"``, ``"factory"`` or ``"one-shot"`` for a stream; ``None`` for anything else.

    Map-style sources (``__len__`` and ``__getitem__``) are never streams. Calling this
    never starts a pass: ``iter()`` is not called.
    """
    if isinstance(source, type) or _map_style(source):
        return None  # a class is neither (its instances may be)
    if hasattr(source, "__iter__"):
        return "one-shot" if hasattr(source, "__next__") else "iterable"
    if callable(source) and _takes_no_arguments(source):
        return "factory"
    return None


def is_stream(source: object) -> bool:
    """Whether the Loader reads ``source`` as a stream (see the module notes)."""
    return stream_kind(source) is not None


class PassLog:
    """The iterator of the last pass a Loader opened over a stream, to refuse a stream that
    hands back the same, already-read iterator as a new pass.

    A re-iterable whose ``__iter__`` returns one shared iterator, or a factory returning a
    global one, would give every later pass (the next epoch, a resume, the pass the spec is
    read from) nothing or the rest of it, silently.
    """

    def __init__(self) -> None:
        self._last: Any = None

    def check(self, source: Any, kind: StreamKind, it: Iterator[Any]) -> None:
        """Remember ``it``; raise ``ValueError`` if it is the last pass's iterator again."""
        if it is self._last:
            how = "the factory returned" if kind == "factory" else "iter(source) returned"
            raise ValueError(
                f"{how} the same iterator object as for the last pass over the stream "
                f"({type(source).__name__}), which that pass has read: each pass must start "
                "a new iterator (an iterator that resets itself still counts as the same "
                f"one: return a fresh one instead); {ONE_SHOT_FIX}"
            )
        self._last = it


def open_pass(source: Any, kind: StreamKind, epoch: int) -> Iterator[Any]:
    """A new iterator over ``source`` for ``epoch`` (a one-shot iterator: itself).

    A source with a ``set_epoch(epoch)`` method (a ``datasets.IterableDataset``, whose own
    ``shuffle()`` reshuffles by epoch) is told the epoch first; a ``datasets.IterableDataset``
    itself is read through a copy at that epoch
    (:func:`~mixle.data.sources.records.hf.stream_source.at_epoch`), whose epoch no other
    process shares.

    Raises
    ------
    TypeError
        A factory returned something that is not iterable, or ``iter(source)`` failed.
    """
    datasets = imported("datasets")
    if datasets is not None and isinstance(source, datasets.IterableDataset):
        source = at_epoch(source, epoch)  # not set_epoch: its epoch is shared across forks
    else:
        set_epoch = getattr(source, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(epoch)
    if kind == "factory":
        made = source()
        try:
            return iter(made)
        except TypeError:
            raise TypeError(
                f"the stream factory {source!r} returned {type(made).__name__}, which is not "
                "iterable; a factory must return an iterator (e.g. a generator)"
            ) from None
    if kind == "one-shot":
        return source  # type: ignore[no-any-return]
    return iter(source)
