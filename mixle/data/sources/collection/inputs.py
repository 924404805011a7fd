"""Turn the ``volumes`` argument of :func:`mixle.read_volumes` into one entry per volume.

An entry is what opens a volume: a path or URL (``str``), an :class:`ArraySource` (open
sources and adopted array-likes), or for volumes of several aligned arrays a dict of those
by array name. Beside the entries come the keys, the array names, the per-volume metadata
table and how each volume is named in errors. Nothing here reads a volume: a glob lists
files, a table is read for its path (and key) columns, a path is stat-ed.
"""

from __future__ import annotations

import glob as globbing
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mixle.data.sources.arrays.adopt import as_array_source
from mixle.data.sources.arrays.base import ArraySource, listing
from mixle.data.sources.collection.openers import (
    VOLUME_SUFFIXES,
    OpenOptions,
    is_url,
    volume_format,
)
from mixle.data.sources.records.base import MemorySource, RecordSource
from mixle.data.sources.records.dataframe_source import read_dataframe
from mixle.errors import ColumnNotFoundError, UnsupportedStoreError
from mixle.utils.redact import display_path

__all__ = ["Entry", "ParsedVolumes", "TableColumnsLike", "VolumesLike", "parse_volumes"]

#: One array of a volume: a path or URL, or an open source.
ArrayEntry = str | ArraySource
#: One volume: one array, or aligned arrays by name.
Entry = ArrayEntry | dict[str, ArrayEntry]
#: What ``read_volumes(volumes=...)`` accepts.
VolumesLike = Any
#: What ``table_columns=`` accepts: one column, a list of columns, or ``{name: column}``.
TableColumnsLike = str | Sequence[str] | Mapping[str, str] | None

_GLOB_CHARS = frozenset("*?[")
#: Files that make a folder a zarr store (v3, v2 array, v2 group).
_ZARR_METADATA = ("zarr.json", ".zarray", ".zgroup")
#: Image formats mixle does not open: a dict entry naming one is an error, not metadata.
_FOREIGN_IMAGE_SUFFIXES = (".mha", ".mhd", ".nrrd", ".nhdr", ".mgz", ".dcm")


@dataclass
class ParsedVolumes:
    """The volumes of a collection, normalised; see :func:`parse_volumes`."""

    entries: list[Entry]
    keys: tuple[str, ...]
    names: tuple[str, ...] | None
    #: Per-volume metadata (row ``i`` is volume ``i``) and its columns, or ``None``.
    table: RecordSource | None
    columns: tuple[str, ...]
    #: ``"row"`` when volumes are rows of a table, ``"volumes"`` for a list (error wording).
    origin: str
    #: Where the table lives, safe to show (``""`` for lists).
    table_location: str = ""

    def where(self, i: int) -> str:
        """How volume ``i`` is named in errors: ``"row 3 of <table>"`` or ``"volumes[3]"``."""
        if self.origin == "row":
            return f"row {i} of {self.table_location}"
        return f"volumes[{i}]"


def _is_pathlike(value: object) -> bool:
    return isinstance(value, (str, os.PathLike)) and not isinstance(value, bytes)


def _is_array(value: object) -> bool:
    """A source, or an array-like of at least one axis (NumPy scalars are metadata)."""
    if isinstance(value, ArraySource):
        return True
    shape = getattr(value, "shape", None)
    return (
        isinstance(shape, tuple)
        and len(shape) >= 1
        and not isinstance(value, np.generic)
        and hasattr(value, "__getitem__")
    )


def _looks_like_volume_path(value: object) -> bool:
    """Whether a dict entry's value names a volume (array entries by default)."""
    if not _is_pathlike(value):
        return False
    text = os.fspath(value)  # type: ignore[arg-type]
    if text.rstrip("/\\").split("?")[0].lower().endswith(VOLUME_SUFFIXES):
        return True
    # a folder without a suffix counts only when it is a zarr store: a metadata value such
    # as "train" must not turn into an array because a folder of that name is in the cwd
    return not is_url(text) and any(
        os.path.isfile(os.path.join(text, name)) for name in _ZARR_METADATA
    )


def _is_path_column(obj: Any) -> bool:
    """A 1-D array or series of strings (``df["path"].values``): a list of paths."""
    kind = getattr(getattr(obj, "dtype", None), "kind", None)
    return not isinstance(obj, ArraySource) and len(obj.shape) == 1 and kind in ("O", "U", "T")


def _is_dataframe(obj: object) -> bool:
    for module, cls in (("pandas", "DataFrame"), ("polars", "DataFrame")):
        lib = sys.modules.get(module)
        if lib is not None and isinstance(obj, getattr(lib, cls)):
            return True
    return False


def parse_volumes(
    volumes: VolumesLike,
    *,
    table_columns: TableColumnsLike,
    key: str | Sequence[str] | None,
    options: OpenOptions,
) -> ParsedVolumes:
    """Normalise ``volumes`` (see :func:`mixle.read_volumes`) without reading any volume.

    Raises
    ------
    TypeError
        ``volumes`` (or one of its items) is of a kind not accepted.
    ValueError
        No volumes; a dict with no array entry; duplicate keys; a table row without a path.
    FileNotFoundError
        A glob that matches nothing, a local path that does not exist (named by its row).
    ColumnNotFoundError
        (a ``KeyError``) ``table_columns=`` or ``key=`` names a column the table lacks.
    """
    if isinstance(volumes, (str, os.PathLike)) and not isinstance(volumes, bytes):
        return _parse_list(_glob(os.fspath(volumes)), table_columns, key, options)
    if isinstance(volumes, RecordSource):
        return _parse_table(volumes, table_columns, key, options)
    if _is_dataframe(volumes):
        where = f"the {type(volumes).__module__.split('.')[0]} DataFrame"
        return _parse_table(read_dataframe(volumes), table_columns, key, options, where)
    if _is_array(volumes) and _is_path_column(volumes):
        return _parse_list(list(volumes), table_columns, key, options)
    if _is_array(volumes):
        raise TypeError(
            f"volumes={type(volumes).__name__} is one array: pass a list of volumes "
            "(paths, sources or arrays), e.g. volumes=[array]"
        )
    if isinstance(volumes, Mapping):
        raise TypeError(
            "volumes= is a dict: pass a list of dicts, one per volume, e.g. "
            "[{'image': 'a.zarr', 'label': 'a_label.zarr'}, ...]"
        )
    if isinstance(volumes, (bytes, bytearray)) or not isinstance(volumes, Iterable):
        raise TypeError(
            f"volumes={type(volumes).__name__} is not accepted: pass a list of paths or URLs, "
            "a glob string, a list of sources or arrays, a list of dicts, or a table "
            "(a mixle record source such as read_csv(...), or a pandas DataFrame)"
        )
    return _parse_list(list(volumes), table_columns, key, options)


def _glob(pattern: str) -> list[str]:
    if is_url(pattern):
        raise TypeError(
            f"volumes={display_path(pattern)!r} is a URL: mixle globs local paths only; "
            "pass a list of URLs"
        )
    found = sorted(globbing.glob(os.path.expanduser(pattern), recursive=True))
    if not found:
        what = "glob" if _GLOB_CHARS & set(pattern) else "path"
        raise FileNotFoundError(f"volumes={pattern!r}: the {what} matches no file or folder")
    return found


def _parse_list(
    items: list[Any],
    table_columns: TableColumnsLike,
    key: str | Sequence[str] | None,
    options: OpenOptions,
) -> ParsedVolumes:
    if not items:
        raise ValueError("volumes= is empty: a collection needs at least one volume")
    dicts = [isinstance(item, Mapping) for item in items]
    if any(dicts):
        if not all(dicts):
            first = dicts.index(not dicts[0])
            raise TypeError(
                f"volumes[{first}] is {'a dict' if dicts[first] else 'not a dict'} but "
                f"volumes[0] is {'a dict' if dicts[0] else 'not a dict'}: pass dicts for "
                "every volume or for none"
            )
        return _parse_dicts(items, table_columns, key, options)
    if table_columns is not None:
        raise TypeError(
            "table_columns= applies to a table or a list of dicts; volumes= is a list of "
            "paths or arrays"
        )
    entries = [_array_entry(item, f"volumes[{i}]", options) for i, item in enumerate(items)]
    keys = _list_keys(entries, key)
    return ParsedVolumes(entries, keys, None, None, (), "volumes")


def _array_entry(value: object, what: str, options: OpenOptions) -> ArrayEntry:
    """A path (checked: exists, known format) or a source for one array of a volume."""
    if _is_pathlike(value):
        path = os.fspath(value)  # type: ignore[arg-type]
        volume_format(path, options, what)
        return path
    if isinstance(value, ArraySource) or _is_array(value):
        return as_array_source(value, name=what)
    raise TypeError(
        f"{what} is {type(value).__name__}: pass a path or URL, a mixle source "
        "(read_zarr, read_hdf5, read_npy, read_memmap) or an array (numpy, zarr, h5py)"
    )


def _entry_key(entry: ArrayEntry, i: int) -> str:
    return display_path(entry) if isinstance(entry, str) else f"#{i}"


def _list_keys(entries: list[Entry], key: str | Sequence[str] | None) -> tuple[str, ...]:
    if key is None:
        keys = []
        for i, entry in enumerate(entries):
            first = next(iter(entry.values())) if isinstance(entry, dict) else entry
            keys.append(_entry_key(first, i))
        return _unique(tuple(keys), "volumes")
    if isinstance(key, str) or not isinstance(key, Sequence):
        raise TypeError(
            f"key={key!r}: for a list of paths or arrays pass one key string per volume "
            "(a list), or leave it out"
        )
    if len(key) != len(entries):
        raise ValueError(f"key= has {len(key)} keys for {len(entries)} volumes")
    if not all(isinstance(k, str) for k in key):
        raise TypeError("key= must hold strings, one per volume")
    return _unique(tuple(key), "key")


def _unique(keys: tuple[str, ...], argument: str) -> tuple[str, ...]:
    seen: dict[str, int] = {}
    for i, k in enumerate(keys):
        j = seen.setdefault(k, i)
        if j != i:
            raise ValueError(
                f"{argument}= gives volumes {j} and {i} the same key {k!r}: keys must be "
                "unique (pass key= naming a column or entry of unique ids)"
            )
    return keys


def _is_volume_entry(value: object) -> bool:
    """Whether a dict entry is an array of the volume by default (else it is metadata).

    Sources, paths with a volume suffix, zarr store folders, and in-memory arrays of two or
    more axes;
    NumPy scalars and 1-D arrays (a spacing vector) are metadata unless ``table_columns=``
    names them.
    """
    if isinstance(value, ArraySource) or _looks_like_volume_path(value):
        return True
    return _is_array(value) and len(value.shape) >= 2  # type: ignore[attr-defined]


def _foreign_image(value: object) -> bool:
    """Whether ``value`` names an image in a format mixle does not open (NRRD, DICOM...)."""
    if not _is_pathlike(value):
        return False
    text = os.fspath(value).rstrip("/\\").split("?")[0].lower()  # type: ignore[arg-type]
    return text.endswith(_FOREIGN_IMAGE_SUFFIXES)


def _array_names(first: Mapping[str, Any], table_columns: TableColumnsLike) -> dict[str, str]:
    """``{array name: entry}`` of dict volumes (entries not listed are metadata)."""
    if table_columns is None:
        foreign = [k for k, v in first.items() if _foreign_image(v)]
        if foreign:  # silently keeping a label image as metadata would lose the array
            k = foreign[0]
            raise UnsupportedStoreError(
                f"volumes[0][{k!r}]={first[k]!r} names an image in a format mixle does not "
                "open (zarr, HDF5, TIFF, NIfTI, N5, .b2nd, .npz, .npy and raw files are); "
                "convert it (e.g. to zarr), or "
                f"pass table_columns= naming the array entries to keep {k!r} as metadata"
            )
        return {str(k): str(k) for k, v in first.items() if _is_volume_entry(v)}
    if isinstance(table_columns, str):
        return {table_columns: table_columns}
    if isinstance(table_columns, Mapping):
        return {str(k): str(v) for k, v in table_columns.items()}
    if isinstance(table_columns, Sequence) and all(isinstance(c, str) for c in table_columns):
        return {c: c for c in table_columns}
    raise TypeError(
        f"table_columns={table_columns!r} must be a column name, a list of them, or "
        "{array name: column}"
    )


def _parse_dicts(
    items: list[Mapping[str, Any]],
    table_columns: TableColumnsLike,
    key: str | Sequence[str] | None,
    options: OpenOptions,
) -> ParsedVolumes:
    arrays = _array_names(items[0], table_columns)
    if not arrays:
        raise ValueError(
            f"volumes[0] has no array entry: its entries {sorted(map(str, items[0]))} hold no "
            "path with a volume suffix, folder, source or array; name them with "
            "table_columns=['image', ...]"
        )
    if key is not None and not isinstance(key, str):
        raise TypeError(f"key={key!r}: for a list of dicts pass the entry naming each volume")
    single = isinstance(table_columns, str)
    entries: list[Entry] = []
    metadata: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        missing = [entry for entry in arrays.values() if entry not in item]
        if missing:
            raise ValueError(
                f"volumes[{i}] has no entry {missing[0]!r} (an array of volumes[0]); its "
                f"entries: {', '.join(map(str, item))}"
            )
        volume = {
            name: _array_entry(item[entry], f"volumes[{i}][{entry!r}]", options)
            for name, entry in arrays.items()
        }
        entries.append(volume[next(iter(volume))] if single else volume)
        metadata.append({str(k): v for k, v in item.items() if k not in arrays.values()})
    if key is not None:
        for i, item in enumerate(items):
            if key not in item:
                raise ColumnNotFoundError(
                    f"key={key!r} is not an entry of volumes[{i}]; its entries: "
                    f"{', '.join(map(str, item))}"
                )
        keys = _unique(tuple(_key_text(item[key]) for item in items), "key")
    else:
        keys = _list_keys(entries, None)
    columns = tuple(metadata[0])
    for i, row in enumerate(metadata):
        if tuple(row) != columns and set(row) != set(columns):
            raise ValueError(
                f"volumes[{i}] has metadata entries {sorted(row)} but volumes[0] has "
                f"{sorted(columns)}: give every volume the same entries"
            )
    table = None
    if columns:
        try:
            table = MemorySource([{c: row[c] for c in columns} for row in metadata])
        except ValueError as exc:  # values of one entry that do not stack (LeafMismatchError)
            raise ValueError(f"volumes= metadata entries do not form a table: {exc}") from exc
    return ParsedVolumes(
        entries, keys, None if single else tuple(arrays), table, columns, "volumes"
    )


def _parse_table(
    table: RecordSource,
    table_columns: TableColumnsLike,
    key: str | Sequence[str] | None,
    options: OpenOptions,
    where: str = "",
) -> ParsedVolumes:
    where = where or repr(table)
    if table_columns is None:
        raise TypeError(
            f"volumes= {where} is a table: pass table_columns= naming its path column "
            f"('path') or columns ({{'image': 'image_path', 'label': 'label_path'}}); "
            f"{listing(list(table.columns), 'columns')}"
        )
    arrays = _array_names({}, table_columns)
    if key is not None and not isinstance(key, str):
        raise TypeError(f"key={key!r}: for a table pass the column naming each volume")
    wanted = list(dict.fromkeys([*arrays.values(), *([key] if key is not None else [])]))
    for column in wanted:
        if column not in table.columns:
            argument = "key" if column == key and column not in arrays.values() else "table_columns"
            raise ColumnNotFoundError(
                f"{argument}={column!r} is not a column of volumes= {where}; "
                f"{listing(list(table.columns), 'columns')}"
            )
    values: dict[str, list[Any]] = {column: [] for column in wanted}
    for block in table.iter_batches():
        for column in wanted:
            values[column].extend(block[column].tolist())
    n = len(values[wanted[0]])
    if not n:
        raise ValueError(f"volumes= {where} has no rows: a collection needs at least one volume")
    parsed = ParsedVolumes([], (), None, table, (), "row", where)
    single = isinstance(table_columns, str)
    for i in range(n):
        volume: dict[str, ArrayEntry] = {}
        for name, column in arrays.items():
            value = values[column][i]
            if not isinstance(value, str) or not value:
                raise ValueError(
                    f"volumes= {parsed.where(i)}: column {column!r} holds {value!r}, not a "
                    "path: every row needs a path or URL there"
                )
            what = f"volumes= {parsed.where(i)} (column {column!r})"
            volume[name] = _array_entry(value, what, options)
        parsed.entries.append(volume[next(iter(volume))] if single else volume)
    if key is not None:
        keys = tuple(_key_text(v) for v in values[key])
        parsed.keys = _unique(keys, "key")
    else:
        parsed.keys = _list_keys(parsed.entries, None)
    parsed.names = None if single else tuple(arrays)
    parsed.columns = tuple(c for c in table.columns if c not in arrays.values())
    return parsed


def _key_text(value: object) -> str:
    if isinstance(value, (bytes, np.bytes_)):
        return value.decode()
    return str(value)
