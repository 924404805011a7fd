"""zarr arrays: the source, its chunk and shard readers and the bounded chunk codecs.

:func:`set_vlen_limit` sets how many bytes per element a chunk of variable-length strings
or bytes may decode to (:class:`VlenLimitError` when one would decode to more).
"""

from mixle.data.sources.arrays.zarr.vlen import VlenLimitError, set_vlen_limit, vlen_limit

__all__ = ["VlenLimitError", "set_vlen_limit", "vlen_limit"]
