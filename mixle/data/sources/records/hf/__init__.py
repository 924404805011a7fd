"""Hugging Face ``datasets`` as mixle sources: :func:`read_hf`.

A map-style ``Dataset`` (or a ``save_to_disk`` folder) becomes an :class:`HFSource`, a lazy,
index-addressable record source like :func:`mixle.read_parquet`'s; an ``IterableDataset``
becomes an :class:`HFStreamSource`, a stream of records with no length. ``datasets`` is
imported only when a source opens (``pip install -e ".[hf]"``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from mixle.data.sources.records.hf.map_source import TAKE_RUNS, HFSource
from mixle.data.sources.records.hf.opening import ACCEPTED, pick_split
from mixle.data.sources.records.hf.stream_source import HFStreamSource
from mixle.utils.optional_deps import require

__all__ = ["TAKE_RUNS", "HFSource", "HFStreamSource", "read_hf"]


def read_hf(
    dataset_or_path: Any,
    split: str | None = None,
    columns: Sequence[str] | None = None,
) -> HFSource | HFStreamSource:
    """Open a Hugging Face ``datasets`` dataset as a mixle source.

    Parameters
    ----------
    dataset_or_path
        A ``datasets.Dataset``; a ``DatasetDict``; the path of a folder written by
        ``Dataset.save_to_disk`` or ``DatasetDict.save_to_disk`` (opened memory-mapped,
        only the chosen split); or an ``IterableDataset`` / ``IterableDatasetDict``.
    split
        The split of a ``DatasetDict`` (object or folder) to read; may be left out when it
        has exactly one. Not accepted with a ``Dataset``.
    columns
        Columns to read, in this order (default: all).

    Returns
    -------
    HFSource
        For a map-style dataset: ``len``, ``src[i]`` (a dict of NumPy values),
        ``get_batch(indices)`` (a dict of NumPy columns, rows in the order asked, repeats
        and negative indices allowed), ``records()``, ``iter_batches()``,
        ``element_spec()``, ``close()``, as every mixle record source.
    HFStreamSource
        For an ``IterableDataset``: ``iter(src)`` (a fresh pass each call),
        ``element_spec()`` (``None`` when the dataset has no ``features``), ``close()``.

    Raises
    ------
    TypeError
        ``dataset_or_path`` is none of the above, or ``split``/``columns`` have the wrong
        type.
    ImportError
        ``datasets`` is not installed (``pip install -e ".[hf]"``); for a path, at first use.
    FileNotFoundError
        Nothing at the path, or a folder ``save_to_disk`` did not write.
    KeyError
        ``split`` is not a split of the ``DatasetDict`` (the message lists them).
    ValueError
        ``split`` is needed (several splits) or given for a ``Dataset``; the dataset has a
        custom transform (``with_transform``), which would be skipped.
    ColumnNotFoundError
        (a ``KeyError``) A name in ``columns`` is not a column (the message lists them).

    Notes
    -----
    Rows are read from the Arrow data, as :func:`mixle.read_parquet` reads Parquet: numbers
    keep their dtype (``ClassLabel`` columns are their integer labels); an integer column
    with a null anywhere in the underlying table is ``float64`` with ``NaN``, a boolean one
    ``object``; fixed-size lists (``List(..., length=k)``) and fixed-shape ``Array2D``..
    ``Array5D`` columns without nulls are array columns of that shape; strings,
    variable-length lists, structs and media features (``Image``, ``Audio``..., left
    undecoded: dicts of ``bytes`` and ``path``) are ``object`` columns of Python values
    (``None`` for a null). A format set with ``set_format``/``with_format`` is ignored.
    ``element_spec()`` comes from the Arrow schema and null counts, never the values.

    A batch maps its rows through the dataset's indices mapping (``select``, ``shuffle``,
    ``filter``), then reads them with one Arrow ``take`` (a table of one record batch) or,
    from a memory-mapped table of many record batches, a ``take`` or zero-copy slices per
    record batch it touches (see :data:`TAKE_RUNS`); no column is ever read whole.

    Pickling: an :class:`HFSource` opened from a path pickles the path, split and columns;
    one opened from a ``Dataset`` pickles its Arrow tables as ``datasets`` does, lazily
    unpickled: memory-mapped cache files (``load_from_disk``, ``map`` results...) as their
    paths and the operations replayed on them, in-memory tables (``Dataset.from_dict``...)
    as their data, and the indices mapping (8 bytes a row) when it is in memory. After
    ``fork`` a child reopens the folder, or reuses the inherited memory maps.

    An :class:`HFStreamSource` iterates the ``IterableDataset`` itself (its shuffling and
    sharding are ``datasets``'); values are converted as above, from the ``features``: a
    missing value (``None``) in a column whose dtype cannot hold it (integers, booleans,
    arrays) raises ``ValueError`` naming the column, since the stream cannot know of nulls
    in advance. It pickles the ``IterableDataset``.
    """
    if isinstance(dataset_or_path, (str, os.PathLike)):
        return HFSource(dataset_or_path, split, columns)
    module = type(dataset_or_path).__module__.split(".")[0]
    if module != "datasets":
        raise TypeError(f"dataset_or_path={type(dataset_or_path).__name__} must be {ACCEPTED}")
    datasets = require("datasets", feature="read_hf")
    if isinstance(dataset_or_path, (datasets.DatasetDict, datasets.IterableDatasetDict)):
        kind = type(dataset_or_path).__name__
        chosen = pick_split(split, [str(s) for s in dataset_or_path], f"the {kind}")
        dataset_or_path, split = dataset_or_path[chosen], None
    if isinstance(dataset_or_path, datasets.IterableDataset):
        if split is not None:
            raise ValueError(
                f"split={split!r}, but dataset_or_path is an IterableDataset (one split); "
                "leave split out"
            )
        return HFStreamSource(dataset_or_path, columns)
    if isinstance(dataset_or_path, datasets.Dataset):
        return HFSource(dataset_or_path, split, columns)
    raise TypeError(f"dataset_or_path={type(dataset_or_path).__name__} must be {ACCEPTED}")
