"""``scl_slope`` / ``scl_inter``: NIfTI's stored-to-real value scaling, applied as nibabel does.

nibabel's ``img.dataobj[...]`` returns ``stored * slope + inter`` in a dtype it picks from
the stored dtype and the scale factors (``nibabel.volumeutils.apply_read_scaling``); a
slope of 0 or NaN means "no scaling". :class:`Scaling` applies the same function to the
same float64 factors, so every value and the dtype equal nibabel's.
"""

from __future__ import annotations

import threading
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from mixle.errors import NiftiScalingWarning
from mixle.utils.optional_deps import require

__all__ = ["NiftiScalingWarning", "Scaling", "scaling_of", "warn_unscaled"]


@dataclass(frozen=True)
class Scaling:
    """The scale factors nibabel applies, and the dtype of scaled values.

    Attributes
    ----------
    slope, inter
        The factors as nibabel uses them: 1.0 and 0.0 when the header's slope is 0 or not
        finite (no scaling).
    dtype
        The dtype of ``stored * slope + inter`` for the stored dtype (the stored dtype
        itself when the scaling is trivial).
    """

    slope: float
    inter: float
    dtype: np.dtype

    @property
    def trivial(self) -> bool:
        """Whether scaling changes nothing (slope 1, intercept 0)."""
        return (self.slope, self.inter) == (1.0, 0.0)

    def apply(self, raw: np.ndarray) -> np.ndarray:
        """``raw * slope + inter`` as nibabel's ``dataobj[...]`` computes it, in a new array."""
        if self.trivial:
            return np.array(raw, copy=True)
        volumeutils = require("nibabel.volumeutils", "nifti", feature="read_nifti")
        scaled = volumeutils.apply_read_scaling(
            raw, np.asanyarray(self.slope), np.asanyarray(self.inter)
        )
        return np.asarray(scaled).astype(self.dtype, copy=False)


def scaling_of(header: Any, stored: np.dtype, what: str) -> Scaling:
    """The :class:`Scaling` of a nibabel NIfTI ``header`` for data of dtype ``stored``.

    Raises
    ------
    ValueError
        When the slope is valid but the intercept is not finite (nibabel refuses the image
        too), or a scaled image stores a compound dtype (RGB).
    """
    nib = require("nibabel", "nifti", feature="read_nifti")
    try:
        slope, inter = header.get_slope_inter()
    except nib.spatialimages.HeaderDataError as exc:
        raise ValueError(f"{what} has scale factors nibabel refuses: {exc}") from None
    slope = 1.0 if slope is None else float(slope)
    inter = 0.0 if inter is None else float(inter)
    if (slope, inter) == (1.0, 0.0):
        return Scaling(slope, inter, stored)
    if stored.fields is not None:
        raise ValueError(
            f"{what} stores {stored} (a compound type) with scl_slope={slope}, "
            f"scl_inter={inter}: such values cannot be scaled"
        )
    volumeutils = require("nibabel.volumeutils", "nifti", feature="read_nifti")
    probe = volumeutils.apply_read_scaling(
        np.zeros(1, dtype=stored), np.asanyarray(slope), np.asanyarray(inter)
    )
    return Scaling(slope, inter, np.asarray(probe).dtype)


_warned: set[str] = set()
_warned_lock = threading.Lock()


def warn_unscaled(path: str, scaling: Scaling) -> None:
    """Warn, once per path in this process, that ``path`` is read without its scaling."""
    with _warned_lock:
        if path in _warned:
            return
        _warned.add(path)
    warnings.warn(
        f"{path!r} stores scaled values (scl_slope={scaling.slope}, "
        f"scl_inter={scaling.inter}): read_nifti returns the raw stored values by default; "
        "pass scale=True for stored * scl_slope + scl_inter as nibabel's img.dataobj gives "
        f"them ({scaling.dtype})",
        NiftiScalingWarning,
        stacklevel=7,  # the caller of read_nifti
    )
