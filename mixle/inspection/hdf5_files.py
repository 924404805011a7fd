"""HDF5 files, local or behind fsspec URLs: groups, datasets, filters and storage sizes."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from mixle.data.sources.arrays.cf import hdf5_cf_attributes
from mixle.data.sources.arrays.hdf5.chunks import (
    FILTER_DEFLATE,
    FILTER_SHUFFLE,
    chunk_filters,
    unwritten_chunk_value,
)
from mixle.inspection.findings import cf_packed_finding, with_findings
from mixle.inspection.formatting import (
    BLOSC_SHUFFLE,
    count_text,
    filter_label,
    plain_value,
)
from mixle.inspection.limits import MAX_TREE_DEPTH, depth_of, too_deep_finding
from mixle.inspection.locations import is_remote
from mixle.inspection.patches import chunk_data_elements
from mixle.inspection.report import ArrayReport, GroupReport, LayoutFinding, UnsupportedStoreError
from mixle.utils.files import require_regular_file
from mixle.utils.redact import display_path

__all__ = ["inspect_hdf5"]

#: HDF5 filter id of ``H5Z_FILTER_FLETCHER32`` (a checksum).
_FILTER_FLETCHER32 = 3
#: HDF5 filter id of the Bitshuffle plugin (``hdf5plugin.Bitshuffle``, bitshuffle's h5 filter).
_FILTER_BITSHUFFLE = 32008
#: HDF5 filter ids that only check or rearrange bytes (everything else compresses).
_HDF5_NOT_COMPRESSING = frozenset({FILTER_SHUFFLE, _FILTER_FLETCHER32})
#: How netCDF-4 begins the ``NAME`` of a dimension that has no coordinate variable.
_NETCDF_DIMENSION_MARKER = "This is a netCDF dimension but not a netCDF variable"


def inspect_hdf5(
    location: str, storage_options: dict[str, Any] | None, patch: tuple[int, ...] | None
) -> GroupReport:
    """The root group of the HDF5 file at ``location`` (a path or an fsspec URL), read-only."""
    from mixle.utils.optional_deps import require

    h5py = require("h5py", "hdf5", feature="mixle inspect")
    remote = is_remote(location)
    if not remote:
        require_regular_file(location, "path")  # a FIFO or a device: refused, nothing read
    handle = None
    if remote:
        from mixle.data.sources.arrays.hdf5.remote import open_remote_file

        _fs, _path, handle = open_remote_file(location, storage_options)
    try:
        try:
            file = h5py.File(handle if handle is not None else location, "r")
        except OSError as exc:
            raise UnsupportedStoreError(
                f"{display_path(location)!r} looks like an HDF5 file but h5py cannot open it: {exc}"
            ) from None
        with file:
            return _hdf5_group(h5py, file, "/", patch, remote, {_object_key(h5py, file): "/"})
    finally:
        if handle is not None:
            handle.close()


def _object_key(h5py: Any, node: Any) -> tuple[int, int]:
    """``(file number, object address)``: the same for every hard link to one object."""
    info = h5py.h5o.get_info(node.id)
    return int(info.fileno), int(info.addr)


def _seen_finding(name: str, kind: str, path: str, first: str) -> LayoutFinding:
    """The finding for a hard link to an object already shown at ``first``."""
    if path == first or path.startswith(first.rstrip("/") + "/"):
        return LayoutFinding(
            "hard-link-cycle",
            "warning",
            f"{kind} {name!r} is a hard link back to {first!r}, which contains it: a cycle "
            "in the file's tree, not descended (tools that walk the file recursively loop "
            "for ever on it)",
        )
    return LayoutFinding(
        "hard-link-repeat",
        "info",
        f"{kind} {name!r} is a hard link to the {kind} shown at {first!r}: listed there only",
    )


def _hdf5_group(
    h5py: Any,
    group: Any,
    path: str,
    patch: tuple[int, ...] | None,
    remote: bool,
    seen: dict[tuple[int, int], str],
) -> GroupReport:
    """The group at ``path`` and what it holds; ``seen`` maps objects shown to their path.

    Each object is described once, at the first path that reaches it: a hard link to an
    object already shown (a second name for a dataset, or a group linked into itself) is
    a finding, so a cycle of hard links ends the walk instead of recursing for ever.
    """
    children: list[GroupReport | ArrayReport] = []
    notes: list[LayoutFinding] = []
    dimensions: list[str] = []
    too_deep: list[str] = []
    for name in group:
        link = group.get(name, getlink=True)
        child_path = f"{path.rstrip('/')}/{name}"
        if isinstance(link, (h5py.SoftLink, h5py.ExternalLink)):
            target = (
                link.path if isinstance(link, h5py.SoftLink) else f"{link.filename}:{link.path}"
            )
            notes.append(
                LayoutFinding(
                    "link-not-followed", "info", f"link {name!r} -> {target!r} not followed"
                )
            )
            continue
        node = group.get(name)
        if isinstance(node, (h5py.Group, h5py.Dataset)):
            key = _object_key(h5py, node)
            if key in seen:
                kind = "group" if isinstance(node, h5py.Group) else "dataset"
                notes.append(_seen_finding(name, kind, child_path, seen[key]))
                continue
            seen[key] = child_path
        if isinstance(node, h5py.Group) and depth_of(child_path) > MAX_TREE_DEPTH:
            too_deep.append(name)
        elif isinstance(node, h5py.Group):
            children.append(_hdf5_group(h5py, node, child_path, patch, remote, seen))
        elif isinstance(node, h5py.Dataset):
            if node.shape is None:
                notes.append(
                    LayoutFinding(
                        "no-dataspace", "info", f"dataset {name!r} is empty (no dataspace)"
                    )
                )
            elif _dimension_only(h5py, node):
                dimensions.append(f"{name} ({'x'.join(map(str, node.shape))})")
            else:
                children.append(_hdf5_dataset(h5py, node, child_path, patch, remote))
    if too_deep:
        notes.append(too_deep_finding(too_deep))
    if dimensions:
        notes.append(
            LayoutFinding(
                "dimension-scales",
                "info",
                f"{count_text(len(dimensions), 'dimension')} without values, not listed as "
                f"arrays: {', '.join(dimensions)} (dimension scales that hold no data, such "
                "as netCDF-4 dimensions without a coordinate variable; the datasets attached "
                "to them are listed)",
            )
        )
    return GroupReport(path, "hdf5", len(group.attrs), tuple(children), tuple(notes))


def _dimension_only(h5py: Any, dataset: Any) -> bool:
    """Whether ``dataset`` is a netCDF-4 dimension with no data: a dimension, not an array.

    netCDF-4 writes one for every dimension without a coordinate variable, a dimension scale
    never written whose ``NAME`` is "This is a netCDF dimension but not a netCDF variable."
    and the length. Any other scale, a never-written one with a fill value or an empty
    coordinate variable, reads as values and is listed as an array.
    """
    if dataset.id.get_storage_size() or not h5py.h5ds.is_scale(dataset.id):
        return False
    name = dataset.attrs.get("NAME")
    if isinstance(name, np.ndarray) and name.shape in ((), (1,)):
        name = name.reshape(()).item()
    if isinstance(name, bytes):
        name = name.decode("latin-1")
    if not isinstance(name, str) or not name.startswith(_NETCDF_DIMENSION_MARKER):
        return False
    return dataset.id.get_create_plist().get_layout() != h5py.h5d.VIRTUAL


def _hdf5_dataset(
    h5py: Any, dataset: Any, path: str, patch: tuple[int, ...] | None, remote: bool
) -> ArrayReport:
    dcpl = dataset.id.get_create_plist()
    layout = {
        h5py.h5d.CONTIGUOUS: "contiguous",
        h5py.h5d.CHUNKED: "chunked",
        h5py.h5d.COMPACT: "compact",
        h5py.h5d.VIRTUAL: "virtual",
    }.get(dcpl.get_layout(), "unknown")
    if dataset.external:
        layout = "external"
    filters = [dcpl.get_filter(i) for i in range(dcpl.get_nfilters())]
    codecs = tuple(_hdf5_filter(code, values, name) for code, _flags, values, name in filters)
    compressed = any(_compresses(code, values) for code, _flags, values, _name in filters)
    dtype = dataset.dtype
    shape = tuple(int(s) for s in dataset.shape)
    chunks = None if dataset.chunks is None else tuple(int(c) for c in dataset.chunks)
    itemsize = None if dtype.hasobject else dtype.itemsize  # variable-length: no fixed size
    nbytes = None if itemsize is None else math.prod(shape) * itemsize
    stored: int | None = int(dataset.id.get_storage_size())
    data: int | None
    if chunks is not None:
        grid = math.prod(math.ceil(d / c) for d, c in zip(shape, chunks))
        n_stored = int(dataset.id.get_num_chunks())
        chunk_nbytes = None if itemsize is None else math.prod(chunks) * itemsize
        decoded = None if chunk_nbytes is None else n_stored * chunk_nbytes
        data = None if itemsize is None else _chunk_data_bytes(dataset, n_stored, grid, itemsize)
    else:
        grid = n_stored = None  # type: ignore[assignment]
        chunk_nbytes = None
        decoded = data = nbytes if stored or nbytes is None else 0
    sources: tuple[str, ...] = ()
    if layout == "virtual":
        sources = tuple(f"{m.file_name}:{m.dset_name}" for m in dataset.virtual_sources())
        stored = decoded = data = None  # the data lives in the sources
    notes: list[LayoutFinding] = []
    if chunks is not None and filters and chunk_filters(dataset) is None:
        names = ", ".join(c.split("(")[0] for c in codecs)
        notes.append(
            LayoutFinding(
                "serial-decode",
                "info",
                f"h5py decodes these chunks ({names}) under its process-wide lock, so threads "
                "cannot decode them in parallel; mixle decodes gzip and shuffle itself, in "
                "parallel",
            )
        )
    packed = cf_packed_finding(hdf5_cf_attributes(dataset), dtype, "read_hdf5")
    if packed is not None:
        notes.append(packed)
    report = ArrayReport(
        path=path,
        format="hdf5",
        shape=shape,
        dtype=str(dtype),
        itemsize=itemsize,
        layout=layout,
        chunks=chunks,
        shards=None,
        codecs=codecs,
        inner_codecs=(),
        compressed=compressed,
        fill_value=plain_value(unwritten_chunk_value(dataset)),  # None: undefined
        order="C",
        attributes=len(dataset.attrs),
        nbytes=nbytes,
        chunk_nbytes=chunk_nbytes,
        chunks_in_grid=grid,
        chunks_stored=n_stored,
        shards_in_grid=None,
        shards_stored=None,
        stored_bytes=stored,
        decoded_bytes=decoded,
        data_bytes=data,
        virtual_sources=sources,
    )
    if sources:
        notes.append(
            LayoutFinding(
                "virtual",
                "info",
                f"a virtual dataset: it stores no data itself and reads from "
                f"{count_text(len(sources), 'source dataset')} ({', '.join(sources)}; "
                "'.' is this file); regions no source maps read as the fill value",
            )
        )
    return with_findings(report, patch, remote, notes)


def _chunk_data_bytes(dataset: Any, n_stored: int, grid: int, itemsize: int) -> int:
    """Bytes of array data in the stored chunks of ``dataset``, edge padding left out."""
    shape, chunks = dataset.shape, dataset.chunks
    if n_stored == grid:
        return math.prod(shape) * itemsize
    offsets: list[tuple[int, ...]] = []
    dsid = dataset.id
    if hasattr(dsid, "chunk_iter"):
        dsid.chunk_iter(lambda info: offsets.append(info.chunk_offset))
    else:
        offsets = [dsid.get_chunk_info(i).chunk_offset for i in range(n_stored)]
    coords = [tuple(o // c for o, c in zip(off, chunks)) for off in offsets]
    return chunk_data_elements(shape, chunks, coords) * itemsize


def _compresses(code: int, values: tuple[int, ...]) -> bool:
    """Whether HDF5 filter ``code`` with client ``values`` compresses (Bitshuffle may not)."""
    if code == _FILTER_BITSHUFFLE:
        return len(values) < 5 or values[4] != 0
    return code not in _HDF5_NOT_COMPRESSING


def _hdf5_filter(code: int, values: tuple[int, ...], name: bytes) -> str:
    """One HDF5 filter spelled out from its id and client values."""
    if code == FILTER_DEFLATE:
        return f"gzip(level={values[0] if values else 6})"
    if code == FILTER_SHUFFLE:
        return "shuffle"
    if code == _FILTER_FLETCHER32:
        return "fletcher32"
    if code == 4 and len(values) >= 2:
        coding = "nn" if values[0] & 32 else "ec" if values[0] & 4 else f"mask={values[0]}"
        return f"szip(coding={coding}, pixels_per_block={values[1]})"
    if code == 5:
        return "nbit"
    if code == 6 and len(values) >= 2:
        kind = {0: "float_dscale", 1: "float_escale", 2: "int"}.get(values[0], str(values[0]))
        return f"scaleoffset(type={kind}, factor={values[1]})"
    if code == 32000:
        return "lzf"
    if code == 32001 and len(values) >= 7:
        cname = {0: "blosclz", 1: "lz4", 2: "lz4hc", 3: "snappy", 4: "zlib", 5: "zstd"}
        shuffle = BLOSC_SHUFFLE.get(values[5], str(values[5]))
        return (
            f"blosc(cname={cname.get(values[6], values[6])}, clevel={values[4]}, shuffle={shuffle})"
        )
    if code == 32015:
        return f"zstd(level={values[0] if values else 3})"
    if code == _FILTER_BITSHUFFLE and len(values) >= 5:
        coder = {0: "none", 2: "lz4", 3: "zstd"}.get(values[4], str(values[4]))
        level = f", level={values[5]}" if values[4] == 3 and len(values) >= 6 else ""
        return f"bitshuffle(block_size={values[3]}, compression={coder}{level})"
    return f"{filter_label(name)}(id={code}, values={list(values)})"
