"""Layouts mixle decodes since the bounded-decoding work give zarr's answer on every read path.

Float retyping filters, variable-length strings and bytes (plain, sharded, F order), and
shards compressed as a whole: each written partly by zarr-python (so unwritten chunks read
the fill value), then read through ``src[key]``, ``read_box``/``read_boxes``, ``get_batch``,
``records()`` and ``PatchSampler.get_batch``, and compared with zarr-python's own read.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numcodecs
import numpy as np
import pytest

zarr = pytest.importorskip("zarr")
from zarr.codecs import GzipCodec, ShardingCodec, TransposeCodec, ZstdCodec  # noqa: E402
from zarr.codecs import numcodecs as zarr_numcodecs  # noqa: E402
from zarr.codecs.vlen_utf8 import VLenBytesCodec, VLenUTF8Codec  # noqa: E402
from zarr.core.dtype import VariableLengthBytes  # noqa: E402

import mixle  # noqa: E402
from mixle.data.sources.arrays.zarr.readers import zarr_chunk_reader  # noqa: E402
from mixle.reading import chunk_cache  # noqa: E402

_NOT_IN_SPEC = "Numcodecs codecs are not in the Zarr version 3 specification"
pytestmark = [
    pytest.mark.filterwarnings(f"ignore:{_NOT_IN_SPEC}"),
    pytest.mark.filterwarnings("ignore:Combining a `sharding_indexed` codec"),
    pytest.mark.filterwarnings("ignore:The data type .* does not have a Zarr V3 specification"),
]

SHAPE = (12, 10, 6)
CHUNKS = (6, 5, 6)


def _v3(codec: type, **config: Any) -> Any:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", _NOT_IN_SPEC)
        return codec(**config)


#: name -> (create_array options, the reader mixle must pick)
LAYOUTS: dict[str, tuple[dict[str, Any], str]] = {
    "delta f4 as f2": (
        {"dtype": "float32", "filters": [_v3(zarr_numcodecs.Delta, dtype="f4", astype="f2")]},
        "ZarrCodecReader",
    ),
    "astype f8 as f4, sharded": (
        {
            "dtype": "float64",
            "shards": (12, 10, 6),
            "filters": [_v3(zarr_numcodecs.AsType, decode_dtype="f8", encode_dtype="f4")],
        },
        "ShardedZarrReader",
    ),
    "v3 vlen-utf8 zstd": ({"dtype": str, "compressors": ZstdCodec()}, "ZarrCodecReader"),
    "v3 vlen-utf8 transposed": (
        {"dtype": str, "filters": [TransposeCodec(order=(2, 0, 1))], "compressors": GzipCodec()},
        "ZarrCodecReader",
    ),
    "v3 sharded vlen-bytes": (
        {"dtype": VariableLengthBytes(), "shards": (12, 10, 6), "compressors": GzipCodec()},
        "ShardedZarrReader",
    ),
    "v2 vlen-utf8 order F": (
        {
            "zarr_format": 2,
            "dtype": str,
            "order": "F",
            "filters": [numcodecs.VLenUTF8()],
            "compressors": numcodecs.Zstd(),
        },
        "ZarrCodecReader",
    ),
    "whole shard f4 then zstd": (
        {
            "dtype": "float32",
            "serializer": ShardingCodec(chunk_shape=(3, 5, 3)),
            "compressors": ZstdCodec(),
        },
        "ZarrCodecReader",
    ),
    "whole shard vlen-utf8 then zstd": (
        {
            "dtype": str,
            "serializer": ShardingCodec(chunk_shape=(3, 5, 3), codecs=[VLenUTF8Codec()]),
            "compressors": ZstdCodec(),
        },
        "ZarrCodecReader",
    ),
    "whole shard vlen-bytes then gzip": (
        {
            "dtype": VariableLengthBytes(),
            "serializer": ShardingCodec(chunk_shape=(3, 5, 3), codecs=[VLenBytesCodec()]),
            "compressors": GzipCodec(),
        },
        "ZarrCodecReader",
    ),
}


def _values(dtype: Any) -> np.ndarray:
    rng = np.random.default_rng(3)
    if dtype in ("float32", "float64"):
        return (rng.standard_normal(SHAPE) * 40).astype(dtype)
    words = [f"{'é' * int(n)}w{k}" for k, n in enumerate(rng.integers(0, 9, int(np.prod(SHAPE))))]
    if isinstance(dtype, VariableLengthBytes):
        return np.array([w.encode() for w in words], dtype=object).reshape(SHAPE)
    return np.array(words, dtype=object).reshape(SHAPE)


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, np.ndarray]]:
    """Every layout written partly: ``name -> (path, zarr's read)``."""
    root = tmp_path_factory.mktemp("new-layouts")
    out = {}
    for k, (name, (options, _)) in enumerate(LAYOUTS.items()):
        path = root / f"a{k}.zarr"
        array = zarr.create_array(str(path), shape=SHAPE, chunks=CHUNKS, **options)
        data = _values(options["dtype"])
        array[:6] = data[:6]
        array[6:, :5] = data[6:, :5]  # chunk (1, 1, 0) never written: the fill value
        out[name] = (path, np.asarray(zarr.open_array(str(path), mode="r")[...]))
    return out


READS: dict[str, tuple[Any, Any]] = {
    "src[...]": (lambda s: s[...], lambda e: e),
    "src[int key]": (lambda s: s[7, 3], lambda e: e[7, 3]),
    "src[strided key]": (lambda s: s[::5, ::-3, 1], lambda e: e[::5, ::-3, 1]),
    "src[rows]": (lambda s: s[[11, 0, 6]], lambda e: e[[11, 0, 6]]),
    "read_box": (lambda s: s.read_box((5, 4, 1), (3, 3, 4)), lambda e: e[5:8, 4:7, 1:5]),
    "read_boxes": (
        lambda s: s.read_boxes([[0, 0, 0], [9, 6, 2]], (3, 4, 4)),
        lambda e: np.stack([e[:3, :4, :4], e[9:12, 6:10, 2:6]]),
    ),
    "get_batch": (lambda s: s.get_batch([11, 2, 6]), lambda e: e[[11, 2, 6]]),
    "records": (lambda s: np.stack(list(s)), lambda e: e),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("read", list(READS))
def test_every_read_path_equals_zarr(written, layout, read):
    path, expected = written[layout]
    opened = zarr.open_array(str(path), mode="r")
    assert type(zarr_chunk_reader(opened)).__name__ == LAYOUTS[layout][1]
    ours, theirs = READS[read]
    chunk_cache().clear()
    got, want = ours(mixle.read_zarr(str(path))), theirs(expected)
    assert np.asarray(got).dtype == np.asarray(want).dtype
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_patches_equal_zarrs_read_at_their_corners(written, layout):
    path, expected = written[layout]
    chunk_cache().clear()
    sampler = mixle.PatchSampler(mixle.read_zarr(str(path)), (4, 4, 3), 6, seed=1)
    patches, corners = sampler.get_batch(range(6))
    for patch, corner in zip(patches, corners.tolist(), strict=True):
        np.testing.assert_array_equal(
            patch, expected[tuple(slice(c, c + 4) for c in corner)][..., :3]
        )
