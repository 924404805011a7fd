"""NIfTI-1/NIfTI-2 images: headers parsed by nibabel, data memory-mapped (gzip via a cache)."""

from mixle.data.sources.arrays.nifti.scaling import NiftiScalingWarning
from mixle.data.sources.arrays.nifti.source import NiftiArraySource, read_nifti

__all__ = ["NiftiArraySource", "NiftiScalingWarning", "read_nifti"]
