"""Edge padding for boxes that hang over the edge of a volume.

The in-bounds part of each box is read with the source's own batched reader
(:meth:`~mixle.data.sources.arrays.base.ArraySource.read_boxes`); the rest is filled in NumPy,
so the whole volume is never loaded and a padded read costs about what an in-bounds one
does.
"""

from __future__ import annotations

import warnings
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = [
    "PADDING_MODES",
    "fill_outside",
    "map_axis",
    "parse_pad_value",
    "parse_padding",
    "read_boxes_padded",
    "read_spatial_boxes",
    "spatial_box_keys",
]

#: Accepted ``padding=`` values. ``"none"``: boxes must lie inside the volume;
#: ``"constant"``: outside voxels are ``pad_value``; ``"reflect"``: mirrored about the edge
#: voxel, which is not repeated (NumPy's ``np.pad(mode="reflect")``); ``"edge"``: the edge
#: voxel repeated.
PADDING_MODES = ("none", "constant", "reflect", "edge")


def parse_padding(padding: object, name: str = "padding") -> str:
    """Validate a padding mode, one of :data:`PADDING_MODES`.

    Raises
    ------
    TypeError
        ``padding`` is not a string.
    ValueError
        ``padding`` is not one of the accepted modes; the message lists them.
    """
    accepted = ", ".join(repr(m) for m in PADDING_MODES)
    if not isinstance(padding, str):
        raise TypeError(f"{name}={padding!r} must be a string, one of {accepted}")
    if padding not in PADDING_MODES:
        raise ValueError(f"{name}={padding!r} is not a padding mode; use one of {accepted}")
    return padding


def parse_pad_value(pad_value: object, dtype: np.dtype, name: str = "pad_value") -> Any:
    """Validate a constant fill value: a real scalar that ``dtype`` holds exactly.

    Raises
    ------
    TypeError
        ``pad_value`` is not a number.
    ValueError
        Casting ``pad_value`` to ``dtype`` would change it (e.g. ``-1`` for ``uint8``).
    """
    value = np.asarray(pad_value)
    if value.ndim != 0 or value.dtype.kind not in "biuf":
        raise TypeError(f"{name}={pad_value!r} must be a real number")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cast = value.astype(dtype)
        same = bool(cast == value) or bool(np.isnan(value) and np.isnan(cast))
    if not same:
        raise ValueError(
            f"{name}={pad_value!r} does not fit the array's dtype {dtype}; pass a value "
            f"{dtype} can hold"
        )
    return cast[()]


def map_axis(coords: NDArray[np.int64], length: int, mode: str) -> NDArray[np.int64]:
    """Where voxels ``coords`` of one axis (possibly outside ``[0, length)``) read from.

    ``"edge"`` clips to the edge voxel, ``"reflect"`` mirrors without repeating the edge
    voxel (period ``2 * (length - 1)``), ``"constant"`` and ``"none"`` clip (the caller
    fills outside voxels). ``length`` must be at least 1.
    """
    if mode != "reflect":
        return np.clip(coords, 0, length - 1)
    if length == 1:
        return np.zeros_like(coords)
    period = 2 * (length - 1)
    m = coords % period
    return np.where(m >= length, period - m, m)


def _inside(
    starts: NDArray[np.int64], size: Sequence[int], shape: Sequence[int]
) -> NDArray[np.bool_]:
    ext = np.asarray(size, dtype=np.int64)
    fits = (starts >= 0) & (starts + ext <= np.asarray(shape, dtype=np.int64))
    return np.asarray(fits.all(axis=1), dtype=np.bool_)


def read_boxes_padded(
    source: Any,
    starts: ArrayLike,
    size: Sequence[int],
    *,
    padding: str = "none",
    pad_value: Any = 0,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Read boxes of one ``size`` at ``starts``, padding the parts outside the volume.

    Parameters
    ----------
    source
        An :class:`~mixle.data.sources.arrays.base.ArraySource` (anything with ``shape``,
        ``dtype`` and ``read_boxes``).
    starts
        ``(B, ndim)`` integer corners; with a padding mode they may be negative or reach
        past the end.
    size
        Box extent per axis.
    padding
        One of :data:`PADDING_MODES`.
    pad_value
        Fill value for ``"constant"``.
    out
        Optional ``(B, *size)`` output of the source's dtype.

    Returns
    -------
    numpy.ndarray
        ``(B, *size)``.

    Raises
    ------
    IndexError
        With ``padding="none"``, a box outside the volume.
    ValueError
        ``"reflect"`` or ``"edge"`` on a volume with an empty axis (nothing to copy).

    Notes
    -----
    Boxes that lie inside the volume are read in one ``read_boxes`` call; boxes that hang
    over the edge are read in one call per distinct in-bounds extent, so a batch costs one
    call in the common case and a few near the borders.
    """
    mode = parse_padding(padding)
    shape = tuple(source.shape)
    ext = [int(n) for n in size]
    if mode == "none":
        return source.read_boxes(starts, ext, out=out)
    rows = np.asarray(starts, dtype=np.int64).reshape(-1, len(shape))
    if out is None:
        out = np.empty((rows.shape[0], *ext), dtype=source.dtype)
    inside = _inside(rows, ext, shape)
    if inside.all():
        return source.read_boxes(rows, ext, out=out)
    if mode != "constant" and 0 in shape:
        raise ValueError(
            f"padding={mode!r} needs voxels to copy but the array of shape {shape} is empty; "
            "use padding='constant'"
        )
    fill = parse_pad_value(pad_value, out.dtype) if mode == "constant" else None
    where = np.flatnonzero(inside)
    if where.size:
        out[where] = source.read_boxes(rows[where], ext)
    groups: dict[tuple[int, ...], list[tuple[int, list[NDArray[np.int64]] | None, int]]]
    groups = defaultdict(list)
    starts_of: dict[tuple[int, ...], list[list[int]]] = defaultdict(list)
    for b in np.flatnonzero(~inside).tolist():
        lo_hi = _window(rows[b], ext, shape, mode)
        if lo_hi is None:  # constant padding of a box with no voxel inside
            out[b] = fill
            continue
        lo, hi, index = lo_hi
        key = tuple(h - lo_ for lo_, h in zip(lo, hi))
        groups[key].append((b, index, len(starts_of[key])))
        starts_of[key].append(lo)
    for key, members in groups.items():
        blocks = source.read_boxes(starts_of[key], key)
        for b, index, j in members:
            if index is None:  # constant: place the in-bounds block, fill around it
                out[b] = fill
                lo = starts_of[key][j]
                dest = tuple(slice(a - s, a - s + n) for a, s, n in zip(lo, rows[b].tolist(), key))
                out[b][dest] = blocks[j]
            else:
                out[b] = blocks[j][np.ix_(*index)]
    return out


def read_spatial_boxes(
    source: Any,
    corners: NDArray[np.int64],
    channels: Sequence[int],
    size: Sequence[int],
    *,
    padding: str = "none",
    pad_value: Any = 0,
) -> np.ndarray:
    """Boxes of ``size`` at spatial ``corners``, with leading ``channels`` axes read whole.

    ``corners`` are ``(B, len(size))`` on the trailing axes of ``source``; the result is
    ``(B, *channels, *size)`` (:func:`read_boxes_padded` with a 0 start on every channel
    axis, so only the spatial axes are ever padded).
    """
    lead = len(channels)
    starts = np.zeros((corners.shape[0], lead + corners.shape[1]), dtype=np.int64)
    starts[:, lead:] = corners
    return read_boxes_padded(
        source, starts, (*channels, *size), padding=padding, pad_value=pad_value
    )


def spatial_box_keys(
    source: Any, corners: NDArray[np.int64], channels: Sequence[int], size: Sequence[int]
) -> list[Any]:
    """The cache keys :func:`read_spatial_boxes` reads (``[]``: the source cannot say)."""
    keys = getattr(source, "box_chunk_keys", None)
    if keys is None:
        return []
    lead = len(channels)
    starts = np.zeros((corners.shape[0], lead + corners.shape[1]), dtype=np.int64)
    starts[:, lead:] = corners
    return keys(starts, (*channels, *size))  # type: ignore[no-any-return]


def fill_outside(
    block: np.ndarray,
    corners: NDArray[np.int64],
    shape: Sequence[int],
    size: Sequence[int],
    value: Any,
) -> None:
    """Set the voxels of boxes ``block[b]`` (at spatial ``corners[b]``) outside ``shape``.

    ``block`` is ``(B, *channels, *size)``; only the trailing spatial axes are filled, so a
    box read with another fill (a cast whose ``value`` the stored dtype cannot hold) gets
    ``value`` exactly where :func:`read_spatial_boxes` padded.
    """
    lead = block.ndim - 1 - len(size)
    for b, corner in enumerate(corners.tolist()):
        for a, (c, d, p) in enumerate(zip(corner, shape, size)):
            edge = (slice(None),) * (lead + a)
            block[(b, *edge, slice(0, max(0, min(p, -c))))] = value
            block[(b, *edge, slice(max(0, d - c), p))] = value


def _window(
    start: NDArray[np.int64], size: list[int], shape: tuple[int, ...], mode: str
) -> tuple[list[int], list[int], list[NDArray[np.int64]] | None] | None:
    """The in-bounds window one box reads, and for reflect/edge the gather index into it."""
    lo: list[int] = []
    hi: list[int] = []
    if mode == "constant":
        for s, n, d in zip(start.tolist(), size, shape):
            a, b = max(s, 0), min(s + n, d)
            if a >= b:
                return None
            lo.append(a)
            hi.append(b)
        return lo, hi, None
    index = []
    for s, n, d in zip(start.tolist(), size, shape):
        mapped = map_axis(np.arange(s, s + n, dtype=np.int64), d, mode)
        a = int(mapped.min()) if n else 0
        lo.append(a)
        hi.append(int(mapped.max()) + 1 if n else 0)
        index.append(mapped - a)
    return lo, hi, index
