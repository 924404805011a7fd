"""HDF5 datasets: the source, dataset-access options, the chunk reader and remote files."""
