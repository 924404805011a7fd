"""Byte ranges asked and answered: the ``Range`` header, and checking an answer is the range.

Every byte range is checked before its bytes are used (:func:`check_range`): over HTTP the
status, the ``Content-Range`` (start, end, total) and the body length; on other backends
the body length. A response that is not the range asked raises
:class:`~mixle.reading.faults.RangeMismatchError`, which the retry layer retries like a
dropped connection. :data:`ByteSpan` is how the read layer names a range.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from typing import Any

from mixle.reading.faults import RangeMismatchError

__all__ = [
    "IGNORED_RANGE_MEMORY",
    "declared_length",
    "remember_size",
    "remembered_size",
    "ByteSpan",
    "check_range",
    "is_short",
    "is_text",
    "range_end",
    "range_header",
    "resolve_span",
]

#: A byte range of one object: ``(start, end)`` for bytes ``[start, end)``, ``(start, None)``
#: for everything from ``start`` on, ``(-n, None)`` for the last ``n`` bytes.
ByteSpan = tuple[int, int | None]

_CONTENT_RANGE = re.compile(r"^\s*bytes\s+(?:(\d+)-(\d+)|\*)/(\d+|\*)\s*$")


def range_header(span: ByteSpan) -> str:
    """The HTTP ``Range`` header value asking for ``span`` (``bytes=a-b``, ``bytes=-n``)."""
    start, end = span
    if start < 0:
        return f"bytes={start}"
    return f"bytes={start}-" if end is None else f"bytes={start}-{end - 1}"


def resolve_span(span: ByteSpan, total: int | None) -> tuple[int, int] | None:
    """``[first, end)`` that ``span`` means in an object of ``total`` bytes (HTTP's rules).

    ``None`` when that depends on an unknown ``total``.
    """
    start, end = span
    if start < 0:
        return None if total is None else (max(0, total + start), total)
    if end is None:
        return None if total is None else (start, max(start, total))
    return (start, end) if total is None else (start, max(start, min(end, total)))


def _parse_content_range(value: str | None) -> tuple[int | None, int | None, int | None] | None:
    """``(first, last, total)`` of a ``Content-Range`` header (``None`` for ``*``)."""
    match = _CONTENT_RANGE.match(value or "")
    if match is None:
        return None
    first, last, total = match.groups()
    return (
        None if first is None else int(first),
        None if last is None else int(last),
        None if total == "*" else int(total),
    )


def check_range(
    body: bytes,
    span: ByteSpan,
    *,
    size: int | None = None,
    status: int | None = None,
    content_range: str | None = None,
    content_type: str | None = None,
) -> bytes:
    """The bytes ``span`` asked for, out of one response, or :class:`RangeMismatchError`.

    Parameters
    ----------
    body
        The response body.
    span
        The range asked (see :data:`ByteSpan`).
    size
        The object's size when known; a range that ends past it may come back short.
    status, content_range, content_type
        The HTTP status and headers, where the backend shows them; ``status=None`` checks
        the body length alone.

    Returns
    -------
    bytes
        ``body``, or the asked bytes sliced out of a ``200`` that carried the whole object
        (accepted only when its length is ``size``; with ``size`` unknown, only for
        ``span=(0, None)``, which asks for the whole object).

    Raises
    ------
    RangeMismatchError
        When the response is not the range asked: another status, a ``Content-Range``
        whose start, end or total differs, or a body of another length.
    """
    if status is None:  # no headers to see: the length is all there is to check
        want = resolve_span(span, size)
        if want is None:  # size unknown: a suffix must be whole, "from start on" anything
            want = (0, -span[0]) if span[0] < 0 else (0, len(body))
        if len(body) != want[1] - want[0]:
            raise _mismatch(span, f"{len(body)} bytes", size)
        return body
    if status == 206:
        return _check_partial(body, span, size, content_range, content_type)
    if status == 200 and span == (0, None) and size is None and is_text(content_type):
        raise _mismatch(span, _answer(body, status, content_range, content_type), size)
    if status == 200 and span == (0, None) and (size is None or len(body) == size):
        return body  # the whole object was asked for, and came
    if status == 200 and size is not None and len(body) == size:
        first, end = resolve_span(span, size) or (0, 0)
        return body[first:end]  # the server ignored Range and sent the whole object
    raise _mismatch(span, _answer(body, status, content_range, content_type), size)


def _check_partial(
    body: bytes,
    span: ByteSpan,
    size: int | None,
    content_range: str | None,
    content_type: str | None,
) -> bytes:
    parsed = _parse_content_range(content_range)
    what = _answer(body, 206, content_range, content_type)
    if parsed is None or parsed[0] is None or parsed[1] is None:
        raise _mismatch(span, what, size)
    first, last, total = parsed
    if size is not None and total is not None and total != size:
        raise _mismatch(span, what, size)
    want = resolve_span(span, total if total is not None else size)
    if want is None:  # total unknown: only a start, or a suffix's length, can be checked
        start = span[0]
        want = (start, last + 1) if start >= 0 else (last + 1 + start, last + 1)
    if (first, last + 1) != want or len(body) != last + 1 - first:
        raise _mismatch(span, what, size)
    return body


def _answer(body: bytes, status: int, content_range: str | None, content_type: str | None) -> str:
    parts = [f"status {status}"]
    if content_range is not None:
        parts.append(f"Content-Range {content_range!r}")
    if content_type:
        parts.append(f"Content-Type {content_type!r}")
    parts.append(f"{len(body)} bytes")
    return ", ".join(parts)


def _mismatch(span: ByteSpan, what: str, size: int | None) -> RangeMismatchError:
    want = resolve_span(span, size)
    expected = "" if want is None else f" ({want[1] - want[0]} bytes)"
    of = "" if size is None else f" of a {size}-byte object"
    return RangeMismatchError(f"asked {range_header(span)}{expected}{of}, the response was {what}")


def is_short(body: bytes, span: ByteSpan) -> bool:
    """Whether ``body`` is shorter than ``span`` asks (ranges ending past the object are)."""
    start, end = span
    want = -start if start < 0 else (None if end is None else end - start)
    return want is not None and len(body) < want


def range_end(span: ByteSpan) -> int | None:
    """``end`` of a range ``(start, end)`` that does not ask for the whole object, else ``None``."""
    start, end = span
    return end if start >= 0 and end is not None else None


def is_text(content_type: str | None) -> bool:
    """Whether a response says it is text: an error page, never a stored chunk."""
    return (content_type or "").strip().lower().startswith("text/")


#: How many objects' sizes, learnt from servers that ignore ``Range``, are remembered.
IGNORED_RANGE_MEMORY = 1024


def declared_length(value: object) -> int | None:
    """A ``Content-Length`` header's value as an int, or ``None`` when absent or not a number."""
    try:
        return None if value is None else int(str(value))
    except ValueError:
        return None


#: ``(file system's protocol, path) -> size`` of objects whose server ignored ``Range``,
#: least recently used first; at most :data:`IGNORED_RANGE_MEMORY` entries.
_IGNORED_RANGE_SIZES: OrderedDict[tuple[str, str], int] = OrderedDict()
_IGNORED_RANGE_LOCK = threading.Lock()


def _size_key(fs: Any, path: str) -> tuple[str, str]:
    protocol = getattr(fs, "protocol", "")
    return (str(protocol if isinstance(protocol, str) else protocol[0]), str(path))


def remembered_size(fs: Any, path: str, body: bytes, declared: object) -> int | None:
    """The size a ``HEAD`` gave for ``path`` when its server last ignored ``Range``, or ``None``.

    Trusted only while the answer agrees with it: its ``Content-Length`` (the whole
    object's) is that size, or with none declared the body is that long. An answer that
    disagrees (the object was replaced) is probed again.
    """
    key = _size_key(fs, path)
    with _IGNORED_RANGE_LOCK:
        size = _IGNORED_RANGE_SIZES.get(key)
        if size is None:
            return None
        length = declared_length(declared)
        if length != size and not (length is None and len(body) == size):
            del _IGNORED_RANGE_SIZES[key]
            return None
        _IGNORED_RANGE_SIZES.move_to_end(key)
        return size


def remember_size(fs: Any, path: str, size: int | None) -> None:
    """Remember ``size`` for ``path`` (its server ignores ``Range``); the oldest goes first."""
    if size is None:
        return
    key = _size_key(fs, path)
    with _IGNORED_RANGE_LOCK:
        _IGNORED_RANGE_SIZES[key] = size
        _IGNORED_RANGE_SIZES.move_to_end(key)
        while len(_IGNORED_RANGE_SIZES) > IGNORED_RANGE_MEMORY:
            _IGNORED_RANGE_SIZES.popitem(last=False)
