"""Many volumes as one lazy collection: :func:`read_volumes` and :class:`VolumeCollection`.

``inputs`` turns the ``volumes`` argument into one entry per volume (paths, sources, dicts
of them, a table's rows) with keys and metadata; ``openers`` opens one path by its format;
``handles`` bounds the volumes with live handles (least recently used, with leases);
``volumes`` is the collection itself.
"""

from mixle.data.sources.collection.volumes import (
    DEFAULT_MAX_OPEN,
    VolumeCollection,
    VolumeMismatchError,
    read_volumes,
)

__all__ = ["DEFAULT_MAX_OPEN", "VolumeCollection", "VolumeMismatchError", "read_volumes"]
