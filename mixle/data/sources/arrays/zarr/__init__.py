"""zarr arrays: the source, its chunk and shard readers and the bounded chunk codecs."""
