"""Argument parsing, corner-grid layout and fingerprints shared by the patch and grid samplers."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from mixle.data.sources.arrays.box_reads import parse_indices
from mixle.utils.validation import parse_int

__all__ = [
    "centred_grid",
    "check_combination",
    "fingerprint_digest",
    "parse_epoch",
    "parse_index",
    "parse_num_patches",
    "parse_patch_size",
    "parse_region",
    "parse_stride",
    "patch_entries",
    "per_axis",
    "record_indices",
    "source_identity",
    "split_channels",
]


def per_axis(value: object, ndim: int, name: str, minimum: int) -> tuple[int, ...]:
    """``value`` as one int per axis (an int is repeated), each at least ``minimum``.

    Raises
    ------
    TypeError
        An entry is not an int.
    ValueError
        Wrong number of entries, or an entry below ``minimum``.
    """
    if isinstance(value, (tuple, list)):
        items = list(value)
    elif isinstance(value, np.ndarray) and value.ndim == 1:
        items = value.tolist()
    else:
        items = [value] * ndim
    out = [parse_int(item, name) for item in items]
    if len(out) != ndim:
        raise ValueError(
            f"{name}={value!r} has {len(out)} entries but the array has {ndim} dimensions"
        )
    if any(v < minimum for v in out):
        raise ValueError(f"{name}={value!r} must be >= {minimum} on every axis")
    return tuple(out)


def parse_patch_size(
    patch_size: object, shape: Sequence[int], *, padded: bool = False
) -> tuple[int, ...]:
    """Validate ``patch_size`` (an int for every axis, or one int per axis) against ``shape``.

    Without ``padded`` every extent must fit in the array; with it any extent >= 1 goes.
    """
    size = per_axis(patch_size, len(shape), "patch_size", 1)
    too_big = [a for a, (p, s) in enumerate(zip(size, shape)) if p > s]
    if too_big and not padded:
        raise ValueError(
            f"patch_size={size} is larger than the array of shape {tuple(shape)} on "
            f"axis {too_big[0]}; make it smaller or allow padding (padding='constant', "
            "'reflect' or 'edge')"
        )
    return size


def patch_entries(patch_size: object) -> int | None:
    """How many entries a per-axis ``patch_size`` has (``None`` for one int)."""
    if isinstance(patch_size, (tuple, list)):
        return len(patch_size)
    if isinstance(patch_size, np.ndarray) and patch_size.ndim == 1:
        return len(patch_size)
    return None


def split_channels(
    patch_size: object, shape: Sequence[int]
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``(channel shape, spatial shape)`` of an array cut into patches of ``patch_size``.

    A per-axis ``patch_size`` names the trailing axes; the leading axes beyond them are
    channel axes that every patch holds whole (``(C, Z, Y, X)`` with a 3-D ``patch_size``
    has channel shape ``(C,)``). An int ``patch_size`` covers every axis.

    Raises
    ------
    ValueError
        ``patch_size`` has no entries or more entries than the array has axes.
    """
    nd = patch_entries(patch_size)
    nd = len(shape) if nd is None else nd
    if not 1 <= nd <= len(shape):
        raise ValueError(
            f"patch_size={patch_size!r} has {nd} entries; the array of shape {tuple(shape)} "
            f"takes 1 to {len(shape)} (leading axes beyond them are channels, read whole)"
        )
    cut = len(shape) - nd
    return tuple(shape[:cut]), tuple(shape[cut:])


def parse_stride(stride: object, ndim: int) -> tuple[int, ...]:
    """Validate ``stride``: ``None`` (every position), an int, or one int per axis, all >= 1."""
    return (1,) * ndim if stride is None else per_axis(stride, ndim, "stride", 1)


def parse_epoch(epoch: object) -> int:
    """Validate an epoch number: an int >= 0."""
    e = parse_int(epoch, "epoch")
    if e < 0:
        raise ValueError(f"epoch={e} must be >= 0")
    return e


def parse_region(
    region: object, patch_size: Sequence[int], chunks: Sequence[int] | None
) -> tuple[int, ...]:
    """Validate a locality ``region`` (int or per axis, at least ``patch_size``).

    ``None`` gives ``chunks`` (or ``2 * patch_size`` when ``None``) grown to ``patch_size``.
    """
    if region is None:
        base = chunks if chunks is not None else tuple(2 * p for p in patch_size)
        return tuple(max(c, p) for c, p in zip(base, patch_size))
    parsed = per_axis(region, len(patch_size), "region", 1)
    small = [a for a, (r, p) in enumerate(zip(parsed, patch_size)) if r < p]
    if small:
        raise ValueError(
            f"region={parsed} is smaller than patch_size={tuple(patch_size)} on axis "
            f"{small[0]}; a region must hold a whole patch"
        )
    return parsed


def parse_num_patches(num_patches: object, replacement: bool, counts: Sequence[int]) -> int:
    """Validate ``num_patches`` (an int >= 0); ``None`` without replacement: the grid size."""
    if num_patches is None and not replacement:
        return int(np.prod(counts, dtype=np.int64))
    if num_patches is None:
        raise TypeError(
            "num_patches=None must be an int (it may be left out only with "
            "replacement=False, where it defaults to the number of grid positions)"
        )
    n = parse_int(num_patches, "num_patches")
    if n < 0:
        raise ValueError(f"num_patches={num_patches} must be >= 0")
    return n


def parse_index(index: object, length: int, what: str) -> int:
    """One record index (negative counts from the end) as an int in ``[0, length)``.

    ``what`` ends the ``IndexError`` message, e.g. ``"a grid of 12 tiles"``.
    """
    i = parse_int(index, "index")
    if not -length <= i < length:
        raise IndexError(f"index={i} is out of range for {what}")
    return i + length if i < 0 else i


def record_indices(indices: ArrayLike | None, length: int) -> NDArray[np.int64]:
    """``indices`` validated against ``length`` as int64, or every index when ``None``."""
    if indices is None:
        return np.arange(length, dtype=np.int64)
    return parse_indices(indices, length)


def centred_grid(
    shape: Sequence[int], patch_size: Sequence[int], stride: Sequence[int], step: Sequence[int]
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``(origin, counts)`` of the corner grid when patches may hang over the edge.

    Corners are ``origin + k * stride`` for ``k`` in ``range(counts)`` per axis, with
    ``origin = -s`` where ``s`` is the largest multiple of ``step`` not above
    ``patch_size // 2``: every patch's centre voxel ``corner + patch_size // 2`` lies in
    ``[0, shape)`` (the first one up to ``step - 1`` voxels past 0; on an axis shorter
    than that the single centre may lie past the end), so the patch always overlaps the
    volume and every voxel can be near a centre.
    """
    origin = tuple(-((p // 2) // m * m) for p, m in zip(patch_size, step))
    counts = tuple(
        max(0, (d - 1 - p // 2 - o) // st) + 1
        for d, p, st, o in zip(shape, patch_size, stride, origin)
    )
    return origin, counts


def check_combination(per_region: int, replacement: bool, weighted: Any, padding: str) -> None:
    """Raise ``ValueError`` when two placement modes that exclude each other are asked for.

    Locality (``patches_per_chunk > 1``), sampling without replacement and weighted
    placement each choose corners their own way; locality also keeps patches inside.
    """
    used = []
    if per_region > 1:
        used.append(f"patches_per_chunk={per_region}")
    if not replacement:
        used.append("replacement=False")
    if weighted is not None:
        used.append("weights=/labels=")
    if per_region > 1 and padding != "none":
        used.append(f"padding={padding!r}")
    if len(used) > 1:
        raise ValueError(
            f"{used[0]} cannot be combined with {used[1]}: locality, sampling without "
            "replacement and weighted placement each choose corners their own way"
        )


def _plain(value: object) -> object:
    """``value`` with NumPy scalars and arrays turned into Python ones (a stable ``repr``)."""
    if isinstance(value, (np.generic, np.ndarray)):
        return value.tolist()
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    return value


def fingerprint_digest(kind: str, parts: Mapping[str, object]) -> str:
    """A 16-hex-digit digest of ``kind`` and ``parts``, the same in every process and release.

    ``parts`` hold ints, floats, strings, ``None``, NumPy scalars or arrays, and tuples,
    lists or dicts of them (NumPy values are compared by value, not by type).
    """
    text = json.dumps({"kind": kind, "parts": _plain(parts)}, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def source_identity(source: Any) -> str:
    """What tells an array source's data apart without reading it, for fingerprints.

    The source's own ``fingerprint()`` when it defines one; otherwise its type, shape,
    dtype and chunk shape. The path is left out (a store that moved is the same data) and
    so is the content: data rewritten in place with the same layout is not told apart.
    """
    custom = getattr(source, "fingerprint", None)
    if callable(custom):
        return f"custom:{custom()}"
    chunks = getattr(source, "chunks", None)
    return fingerprint_digest(
        "array",
        {
            "type": type(source).__qualname__,
            "shape": tuple(int(n) for n in source.shape),
            "dtype": str(np.dtype(source.dtype).descr),
            "chunks": None if chunks is None else tuple(int(c) for c in chunks),
        },
    )
