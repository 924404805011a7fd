"""Pictures of what mixle does: patch footprints, the chunk grid, sampling density.

Needs matplotlib (``pip install -e ".[plot]"``), imported on the first call, never at
``import mixle.plot``. Every function draws with matplotlib's object-oriented API into a new
``Figure`` (or the ``ax`` given) without touching pyplot, and returns the Axes; save with
``ax.figure.savefig("patches.png")``.

- :func:`plot_patches` / :func:`plot_sampler`: patch footprints over a slice or a max/mean
  projection of the volume.
- :func:`plot_chunk_grid`: stored chunk and shard boundaries over a slice.
- :func:`plot_sampling_density`: where a (weighted) sampler's patch centres fall, beside
  where its weight or label map says they should.

Slices read one plane; projections read block by block along chunk boundaries (each
chunk once), so memory stays bounded on a volume bigger than memory.
"""

from mixle.plot.chunks import plot_chunk_grid
from mixle.plot.density import plot_sampling_density
from mixle.plot.patches import plot_patches, plot_sampler
from mixle.plot.planes import MAX_PIXELS, PROJECTIONS, SLAB_BYTES

__all__ = [
    "MAX_PIXELS",
    "PROJECTIONS",
    "SLAB_BYTES",
    "plot_chunk_grid",
    "plot_patches",
    "plot_sampler",
    "plot_sampling_density",
]
