"""NIfTI-1 and NIfTI-2 headers, parsed by nibabel from a bounded read of the file's head.

Only the header bytes are ever read (at most :data:`HEADER_READ_BYTES`, plus the header
extensions when there are at most :data:`EXTENSIONS_LIMIT` bytes of them): nothing reads
the data block. What a source needs from the header (shape, dtype with its byte order, data
offset, scaling, voxel-to-world geometry) is gathered in a :class:`NiftiHeader`.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

import numpy as np

from mixle.data.sources.arrays.physical import Physical, physical_from_affine
from mixle.utils.optional_deps import require

__all__ = [
    "AXIS_NAMES",
    "EXTENSIONS_LIMIT",
    "HEADER_READ_BYTES",
    "NiftiHeader",
    "header_size",
    "parse_header",
    "physical_of",
]

#: The most bytes read to parse a header: the NIfTI-2 header (540) and the extension flag
#: (4); a NIfTI-1 header is read as its 348 bytes and the flag.
HEADER_READ_BYTES = 544
#: The most bytes of header extensions read into :attr:`NiftiHeader.header`; larger
#: extensions are left unread (they never change the voxel values).
EXTENSIONS_LIMIT = 16 * 2**20
#: NIfTI's names of its seven axes (``dim[1..7]``): three spatial, time, then u, v, w.
AXIS_NAMES = ("i", "j", "k", "t", "u", "v", "w")
#: ``sizeof_hdr`` of each NIfTI version.
_SIZES = {348: 1, 540: 2}


@dataclass(frozen=True)
class NiftiHeader:
    """What a source needs from a NIfTI header, with the nibabel header it came from.

    Attributes
    ----------
    header
        The nibabel header (``Nifti1Header``, ``Nifti2Header`` or their pair variants), as
        stored in the file (its ``vox_offset`` included).
    version
        1 or 2.
    single
        ``True`` for a single file (``.nii``), ``False`` for a ``.hdr``/``.img`` pair.
    shape, dtype
        Shape of the data block (x fastest on disk) and its dtype, byte order included.
    offset
        Byte offset of the data block in its file.
    nbytes
        Bytes of the data block.
    head
        The raw bytes the header was parsed from (to check a decompressed copy against).
    """

    header: Any
    version: int
    single: bool
    shape: tuple[int, ...]
    dtype: np.dtype
    offset: int
    nbytes: int
    head: bytes

    @property
    def end(self) -> int:
        """Bytes the data file must hold at least: ``offset + nbytes``."""
        return self.offset + self.nbytes


def _nibabel() -> Any:
    return require("nibabel", "nifti", feature="read_nifti")


def _version(head: bytes, what: str) -> tuple[int, str]:
    """``(version, byte order)`` from ``sizeof_hdr``, or ``ValueError`` for other files."""
    if len(head) >= 4:
        for order in ("<", ">"):
            size = int(np.frombuffer(head[:4], dtype=f"{order}i4")[0])
            if size in _SIZES:
                return _SIZES[size], order
    raise ValueError(
        f"{what} is not a NIfTI file: its first 4 bytes {head[:4]!r} are not sizeof_hdr 348 "
        "(NIfTI-1) or 540 (NIfTI-2) in either byte order"
    )


def header_size(head: bytes, what: str) -> int:
    """Bytes of the header ``head`` starts with (348 or 540) and its extension flag (+4).

    ``head`` needs only the file's first 4 bytes (``sizeof_hdr``).

    Raises
    ------
    ValueError
        When they are not ``sizeof_hdr`` of a NIfTI-1 or NIfTI-2 header.
    """
    version, _ = _version(head, what)
    return (348 if version == 1 else 540) + 4


def _magic(head: bytes, version: int) -> bytes:
    return head[344:348] if version == 1 else head[4:8]


def parse_header(
    head: bytes, what: str, *, more: Any = None, single: bool | None = None
) -> NiftiHeader:
    """Parse the NIfTI header at the start of ``head``.

    Parameters
    ----------
    head
        The first bytes of a ``.nii`` (or ``.hdr``) file: its header and extension flag
        (:func:`header_size` bytes), or the whole file if it is shorter.
    what
        How errors name the file (``"path='x.nii'"``).
    more
        ``more(n)`` returns the first ``n`` bytes of the file: called to read header
        extensions when the extension flag is set and they are at most
        :data:`EXTENSIONS_LIMIT` bytes; ``None`` skips them.
    single
        ``True`` when the header is in the data's own file (a ``.nii``), ``False`` for the
        ``.hdr`` of a pair (the data in the ``.img``): what nibabel decides from the file
        name, whatever the magic says (a ``.hdr`` with the single-file magic ``n+1`` is
        read as a pair, ``vox_offset`` counting in the ``.img``). ``None``: from the magic
        (``n+1``/``n+2`` single, ``ni1``/``ni2`` pair).

    Raises
    ------
    ValueError
        When the bytes are not a NIfTI-1 or NIfTI-2 header (an Analyze 7.5 header
        included), or the header is one nibabel refuses, or it describes no array.
    """
    nib = _nibabel()
    version, _ = _version(head, what)
    size = 348 if version == 1 else 540
    if len(head) < size:
        raise ValueError(
            f"{what} ends after {len(head)} bytes, inside its {size}-byte NIfTI-{version} header"
        )
    magic = _magic(head, version)
    kinds = {b"n+%d\0" % version: True, b"ni%d\0" % version: False}
    if magic not in kinds:
        if version == 1:
            raise ValueError(
                f"{what} has a 348-byte header without the NIfTI magic 'n+1'/'ni1' (found "
                f"{magic!r}): an Analyze 7.5 file, which read_nifti does not read "
                "(nibabel.AnalyzeImage does)"
            )
        raise ValueError(
            f"{what} has a 540-byte header without the NIfTI-2 magic (found {magic!r})"
        )
    if single is None:
        single = kinds[magic]
    klasses = {
        (1, True): nib.nifti1.Nifti1Header,
        (1, False): nib.nifti1.Nifti1PairHeader,
        (2, True): nib.nifti2.Nifti2Header,
        (2, False): nib.nifti2.Nifti2PairHeader,
    }
    klass = klasses[(version, single)]
    try:
        header = klass.from_fileobj(io.BytesIO(head[:size] + b"\0\0\0\0"), check=True)
        flag = head[size : size + 4]
        if more is not None and len(flag) == 4 and flag[:1] != b"\0":
            header = _with_extensions(klass, header, size, single, more)
        shape = tuple(int(n) for n in header.get_data_shape())
        dtype = np.dtype(header.get_data_dtype())
        offset = int(header.get_data_offset())
    except (
        nib.spatialimages.HeaderDataError,
        nib.spatialimages.HeaderTypeError,
        ValueError,
        TypeError,
        KeyError,
    ) as exc:
        raise ValueError(f"{what} has a NIfTI-{version} header nibabel refuses: {exc}") from None
    if not shape:
        raise ValueError(f"{what} has a NIfTI header whose dim[0] is 0: it holds no array")
    if any(n < 0 for n in shape):
        raise ValueError(f"{what} has a NIfTI header with negative dimensions {shape}")
    if dtype.hasobject or dtype.itemsize == 0:
        raise ValueError(f"{what} has a NIfTI datatype ({dtype}) that cannot be memory-mapped")
    if single and offset < size + 4:
        raise ValueError(
            f"{what} has vox_offset={offset}, inside its own {size + 4}-byte header: the data "
            "block would overlap the header"
        )
    nbytes = int(np.prod(shape, dtype=object)) * dtype.itemsize
    return NiftiHeader(header, version, single, shape, dtype, offset, nbytes, head[:size])


def _with_extensions(klass: Any, header: Any, size: int, single: bool, more: Any) -> Any:
    """The header with its extensions, when they fit in :data:`EXTENSIONS_LIMIT`."""
    end = int(header.get_data_offset()) if single else size + 4 + EXTENSIONS_LIMIT + 1
    if end - size - 4 > EXTENSIONS_LIMIT:
        return header
    raw = more(end)
    if not single and len(raw) > size + 4 + EXTENSIONS_LIMIT:
        return header
    return klass.from_fileobj(io.BytesIO(raw), check=True)


def physical_of(header: Any, shape: tuple[int, ...]) -> Physical | None:
    """The voxel-to-world geometry of an array of ``shape`` with NIfTI ``header``.

    The spatial part is nibabel's best affine (sform, else qform, else the pixdim
    scaling: what ``img.affine`` is). A 4-D or larger array gets an ``(ndim + 1, ndim + 1)``
    affine, block-diagonal: the spatial 4x4 and the pixdim spacing of each further axis (a
    spacing the header leaves 0, negative or not finite counts as 1). ``None`` when the
    affine is singular or not finite. Axes are ``i, j, k, t, u, v, w``; units come from
    ``xyzt_units`` (``None`` where unknown).

    A 1-D or 2-D array is voxels ``(i, 0, 0)`` or ``(i, j, 0)`` of nibabel's 4x4 affine,
    whose world is 3-D, while its own affine is ``(ndim + 1, ndim + 1)``. The spacing is
    always the length of each voxel axis in the 3-D world (nibabel's zooms). The affine:

    - when the voxel axes move only the first ``ndim`` world coordinates (a plane of the
      world's axes, the usual case), the rows and columns of those axes: exact world
      coordinates (the others are the same for every voxel, ``nifti_affine[ndim:3, 3]``);
    - otherwise (an oblique plane) the plane's own coordinates: world positions projected
      onto orthonormal axes of the plane, the first along voxel axis ``i`` (the affine is
      ``R`` and ``Q.T @ t`` where ``Q @ R`` is the QR factorisation of the voxel axes'
      3-D columns with ``R``'s diagonal positive, ``t`` the 3-D origin). Distances and
      angles in the plane are the world's; the 3-D world position of a voxel ``v`` is
      ``nifti_affine @ [*v, 0, 1]`` (the source's ``nifti_affine``), not this affine's.
    """
    n = len(shape)
    best = np.asarray(header.get_best_affine(), dtype=np.float64)
    k = min(n, 3)
    affine = np.eye(n + 1)
    if n < 3 and np.any(best[k:3, :k]):  # an oblique plane (or line): its own coordinates
        q, r = np.linalg.qr(best[:3, :k])
        signs = np.where(np.diag(r) < 0, -1.0, 1.0)
        q, r = q * signs, r * signs[:, None]
        affine[:k, :k] = r
        affine[:k, n] = q.T @ best[:3, 3]
    else:
        affine[:k, :k] = best[:k, :k]
        affine[:k, n] = best[:k, 3]
    zooms = header.get_zooms()
    for axis in range(3, n):
        step = float(zooms[axis])
        affine[axis, axis] = step if np.isfinite(step) and step > 0 else 1.0
    space, time = header.get_xyzt_units()
    units: list[str | None] = [None if space == "unknown" else str(space)] * k
    if n > 3:
        units.append(None if time == "unknown" else str(time))
    units += [None] * (n - len(units))
    try:
        return physical_from_affine(affine, axes=AXIS_NAMES[:n], units=units)
    except ValueError:
        return None
