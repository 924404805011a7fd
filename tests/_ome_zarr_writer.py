"""Write OME-Zarr images with ome-zarr-py, the reference writer, in a child process.

ome-zarr-py imports dask and scikit-image: about 100,000 objects that would stay in the
pytest process and make every later garbage collection of the suite slower. A child
process writes the image instead; the tests read it back here.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

_SCRIPT = """
import json, sys, warnings
import numpy as np
import zarr
with warnings.catch_warnings():  # its import warns about its own deprecated Scaler
    warnings.simplefilter("ignore", DeprecationWarning)
    import ome_zarr.format as fmt_module
    import ome_zarr.writer as writer
args = json.loads(sys.argv[1])
fmt = fmt_module.FormatV04() if args["version"] == "0.4" else fmt_module.FormatV05()
group = zarr.open_group(args["path"], mode="w", zarr_format=fmt.zarr_format)
writer.write_image(
    np.load(args["data"]), group, fmt=fmt, axes=args["axes"],
    scale_factors=args["scale_factors"], scale=args["scale"], axes_units=args["axes_units"],
)
"""


def write_ome_zarr(
    path: Path,
    data: np.ndarray,
    *,
    version: str,
    axes: str,
    scale: dict[str, float],
    axes_units: dict[str, str],
    scale_factors: list[int] | tuple[int, ...] = (),
) -> None:
    """``ome_zarr.writer.write_image(data, group at path, ...)`` in a child process."""
    source = path.with_suffix(".input.npy")
    np.save(source, data)
    args: dict[str, Any] = {
        "path": str(path),
        "data": str(source),
        "version": version,
        "axes": axes,
        "scale": scale,
        "axes_units": axes_units,
        "scale_factors": list(scale_factors),
    }
    subprocess.run(
        [sys.executable, "-c", _SCRIPT, json.dumps(args)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    source.unlink()
