"""Hostile HDF5 input: filter plugins, external and virtual storage, special files, secrets.

Every answer is h5py's own read of the same file; plugin-filtered files are written and read
by h5py in a child that imports ``hdf5plugin`` (this process never does). What a user
without ``hdf5plugin`` sees is checked in a fresh child whose ``sys.meta_path`` refuses to
import it; that mixle loads it by itself where it is installed, in a fresh child that never
imports it.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest

import mixle
from mixle.data.sources.arrays.hdf5.source import HDF5ArraySource
from mixle.errors import SpecialFileError
from mixle.reading.faults import RemoteReadError
from mixle.testing import check_array_source
from mixle.testing_servers import FaultPlan, RangeHTTPServer

pytestmark = pytest.mark.usefixtures("frozen_heap")  # full gc collections scan this module only

REPO = Path(__file__).resolve().parents[1]
SHAPE = (7, 10, 9)
#: Plugin datasets: partial edge chunks on every axis, big enough for blosc to compress.
PLUGIN_SHAPE = (14, 20, 18)
PLUGIN_CHUNKS = (6, 8, 8)
#: (filter id, name) each dataset's message must name.
NEEDS = {
    "blosc": (32001, "blosc"),
    "zstd": (32015, "zstd"),
    "lz4": (32004, "lz4"),
    "bitshuffle": (32008, "bitshuffle"),
    "shuffle-zstd": (32015, "zstd"),
}
STARTS = [(0, 0, 0), (4, 6, 5), (2, 3, 1), (5, 0, 6)]
BOX = (2, 4, 3)

#: Installed before mixle is imported: hdf5plugin cannot be found (tests/test_lazy_deps.py).
BLOCKER = """
import sys

class _Blocked:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "hdf5plugin":
            raise ImportError(f"{name} is blocked in this test process")
        return None

sys.meta_path.insert(0, _Blocked())
"""


def _child(code: str, *args: str, timeout: float = 60) -> Any:
    """Run ``code`` in a fresh interpreter with no plugin path; return its JSON output."""
    env = {k: v for k, v in os.environ.items() if k != "HDF5_PLUGIN_PATH"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


#: Writes one dataset per plugin filter, partly written (unwritten chunks read as the
#: fill), and saves h5py's own read of each. It runs in a child, so that hdf5plugin never
#: registers its filters in the pytest process (that would change what other tests see).
WRITER = """
import json, sys
import h5py, hdf5plugin
import numpy as np

path, out = sys.argv[1], sys.argv[2]
shape, chunks = (tuple(json.loads(a)) for a in sys.argv[3:5])
filters = {
    "blosc": dict(hdf5plugin.Blosc(cname="lz4", clevel=5, shuffle=hdf5plugin.Blosc.SHUFFLE)),
    "zstd": dict(hdf5plugin.Zstd(clevel=3)),
    "lz4": dict(hdf5plugin.LZ4()),
    "bitshuffle": dict(hdf5plugin.Bitshuffle(cname="lz4")),
    "shuffle-zstd": {"shuffle": True, **hdf5plugin.Zstd()},  # mixle unshuffles, HDF5 unzstds
}
# compressible: an optional filter that cannot shrink a chunk stores it unfiltered
rng = np.random.default_rng(16)
data = (np.arange(np.prod(shape)).reshape(shape) // 6 % 40 * 75).astype("<u2")
data[::2, ::3] += rng.integers(0, 3, size=data[::2, ::3].shape, dtype="<u2")
masks = {}
with h5py.File(path, "w") as f:
    for name, options in filters.items():
        ds = f.create_dataset(name, shape=shape, dtype="<u2", chunks=chunks, fillvalue=7, **options)
        ds[:10] = data[:10]
        masks[name] = [ds.id.get_chunk_info(k).filter_mask for k in range(ds.id.get_num_chunks())]
    f.create_dataset("gzip", data=data, chunks=chunks, compression="gzip")
    # an optional filter nobody has, skipped on every chunk: HDF5 reads it without it
    f.create_dataset(
        "skipped", data=data, chunks=chunks, compression=32003, allow_unknown_filter=True
    )
with h5py.File(path, "r") as f:
    for name in f:
        np.save(f"{out}/{name}-truth.npy", f[name][...])
print(json.dumps(masks))
"""


@pytest.fixture
def plugin_file(tmp_path: Path) -> Path:
    """The file :data:`WRITER` writes; ``<name>-truth.npy`` beside it is h5py's read."""
    path = tmp_path / "plugins.h5"
    masks = _child(
        WRITER, str(path), str(tmp_path), json.dumps(PLUGIN_SHAPE), json.dumps(PLUGIN_CHUNKS)
    )
    assert set(masks) == set(NEEDS)
    for name, filtered in masks.items():  # every chunk went through every filter
        assert filtered == [0] * len(filtered), name
    return path


def _truth(path: Path, name: str) -> np.ndarray:
    return np.load(path.parent / f"{name}-truth.npy")


AUTOLOAD = """
import json, pickle, sys
import numpy as np
import mixle

path, out = sys.argv[1], sys.argv[2]
names, starts, box = (json.loads(a) for a in sys.argv[3:6])
before = "hdf5plugin" in sys.modules
for name in names:
    src = mixle.read_hdf5(path, name)
    np.save(f"{out}/{name}-all.npy", src[...])
    np.save(f"{out}/{name}-boxes.npy", src.read_boxes(starts, box))
    np.save(f"{out}/{name}-rows.npy", src.get_batch([4, 0, 6, 4]))
    np.save(f"{out}/{name}-keys.npy", src[1:6:2, ::-1, 3])
    np.save(f"{out}/{name}-pickled.npy", pickle.loads(pickle.dumps(src))[2:5])
print(json.dumps({"before": before, "after": "hdf5plugin" in sys.modules}))
"""


def test_plugin_filters_load_by_themselves_and_read_as_h5py(plugin_file, tmp_path):
    names = [*NEEDS, "gzip"]
    out = tmp_path / "out"
    out.mkdir()
    got = _child(
        AUTOLOAD, str(plugin_file), str(out), json.dumps(names), json.dumps(STARTS), json.dumps(BOX)
    )
    assert got == {"before": False, "after": True}
    for name in names:
        full = _truth(plugin_file, name)
        assert (full[10:] == 7).all() or name == "gzip"  # unwritten chunks read as the fill
        boxes = np.stack(
            [full[a : a + BOX[0], b : b + BOX[1], c : c + BOX[2]] for a, b, c in STARTS]
        )
        expected = {
            "all": full,
            "boxes": boxes,
            "rows": full[[4, 0, 6, 4]],
            "keys": full[1:6:2, ::-1, 3],
            "pickled": full[2:5],
        }
        for kind, want in expected.items():
            np.testing.assert_array_equal(np.load(out / f"{name}-{kind}.npy"), want, err_msg=kind)


BLOCKED = (
    BLOCKER
    + """
import json
import h5py
import mixle
from mixle.data.sources.arrays.hdf5.source import HDF5ArraySource

path, names = sys.argv[1], json.loads(sys.argv[2])
out = {"errors": {}, "wrapped": {}}
for name in names:
    try:
        mixle.read_hdf5(path, name)
    except ImportError as exc:
        out["errors"][name] = [type(exc).__name__, str(exc)]
    else:
        out["errors"][name] = None
    with h5py.File(path, "r") as f:
        try:
            HDF5ArraySource.from_dataset(f[name])
        except ImportError as exc:
            out["wrapped"][name] = str(exc)
        else:
            out["wrapped"][name] = None
out["gzip"] = int(mixle.read_hdf5(path, "gzip")[...].sum())
out["skipped"] = int(mixle.read_hdf5(path, "skipped")[...].sum())
out["imported"] = "hdf5plugin" in sys.modules
print(json.dumps(out))
"""
)


def test_a_missing_plugin_is_refused_at_open_naming_the_filter_and_the_fix(plugin_file):
    got = _child(BLOCKED, str(plugin_file), json.dumps(list(NEEDS)))
    assert got["imported"] is False
    for name, (code, filter_name) in NEEDS.items():
        assert got["errors"][name] is not None, f"{name} opened without its filter"
        kind, message = got["errors"][name]
        assert kind == "FilterUnavailableError"
        for part in (repr(name), "plugins.h5", f"{code} ({filter_name})", "hdf5plugin package"):
            assert part in message, (part, message)
        assert 'pip install -e ".[hdf5plugin]"' in message
        assert "pip install mixle" not in message
        assert got["wrapped"][name] == message.replace(repr(name), repr("/" + name), 1).replace(
            "'plugins.h5'", repr(str(plugin_file))
        )
    # what needs no plugin still opens and reads as h5py
    assert got["gzip"] == int(_truth(plugin_file, "gzip").sum())
    assert got["skipped"] == int(_truth(plugin_file, "skipped").sum())


def _external_file(tmp_path: Path) -> tuple[Path, Path, np.ndarray]:
    """An HDF5 file in ``h5/`` whose dataset's raw bytes lie in two files in ``raw/``."""
    data = np.arange(np.prod(SHAPE), dtype="<i4").reshape(SHAPE) * 3 - 50
    (tmp_path / "h5").mkdir()
    raw = tmp_path / "raw"
    raw.mkdir()
    blob = data.tobytes()
    half = len(blob) // 2
    (raw / "part0.bin").write_bytes(b"\xff" * 16 + blob[:half])
    (raw / "part1.bin").write_bytes(blob[half:])
    path = tmp_path / "h5" / "ext.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset(
            "e",
            shape=SHAPE,
            dtype="<i4",
            external=[("part0.bin", 16, half), ("part1.bin", 0, len(blob) - half)],
        )
    return path, raw, data


def _h5py_with_prefix(path: Path, name: str, prefix: str) -> np.ndarray:
    with h5py.File(path, "r") as f:
        dapl = h5py.h5p.create(h5py.h5p.DATASET_ACCESS)
        dapl.set_efile_prefix(prefix.encode())
        return h5py.Dataset(h5py.h5d.open(f.id, name.encode(), dapl=dapl))[...]


@pytest.mark.parametrize("how", ["folder", "origin", "pathlike"])
def test_efile_prefix_reads_external_storage_in_another_folder_as_h5py(tmp_path, how):
    path, raw, data = _external_file(tmp_path)
    prefix = {"folder": str(raw), "origin": "${ORIGIN}/../raw", "pathlike": raw}[how]
    check_array_source(mixle.read_hdf5(path, "e", efile_prefix=prefix), data)  # closes it
    with mixle.read_hdf5(path, "e", efile_prefix=prefix) as src:
        clone = pickle.loads(pickle.dumps(src))
        np.testing.assert_array_equal(clone.read_boxes(STARTS, BOX)[1], data[4:6, 6:10, 5:8])
        clone.close()
    np.testing.assert_array_equal(_h5py_with_prefix(path, "e", os.fspath(prefix)), data)


def test_missing_external_files_are_named_at_open(tmp_path, monkeypatch):
    path, raw, _data = _external_file(tmp_path)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError) as info:
        mixle.read_hdf5(path, "e")
    message = str(info.value)
    for part in ("part0.bin", "part1.bin", "'e'", "ext.h5", "efile_prefix", str(tmp_path)):
        assert part in message, (part, message)
    for name in ("part0.bin", "part1.bin"):  # beside the HDF5 file: the message says how
        (raw / name).rename(path.parent / name)
    with pytest.raises(FileNotFoundError, match=r"HDF5 file's folder: efile_prefix='\$\{ORIGIN\}'"):
        mixle.read_hdf5(path, "e")
    assert mixle.read_hdf5(path, "e", efile_prefix="${ORIGIN}").shape == SHAPE


def test_external_files_that_are_fifos_are_refused_at_open(tmp_path):
    path, raw, _data = _external_file(tmp_path)
    (raw / "part1.bin").unlink()
    os.mkfifo(raw / "part1.bin")  # HDF5 reading it would block for ever
    with pytest.raises(SpecialFileError, match=r"part1\.bin.* is a FIFO"):
        mixle.read_hdf5(path, "e", efile_prefix=raw)


def test_virtual_prefix_finds_virtual_sources_in_another_folder_as_h5py(tmp_path):
    data = np.arange(40, dtype="<f8").reshape(4, 10)
    (tmp_path / "sources").mkdir()
    (tmp_path / "vds").mkdir()
    with h5py.File(tmp_path / "sources" / "part.h5", "w") as f:
        f.create_dataset("d", data=data)
    layout = h5py.VirtualLayout(shape=(8, 10), dtype="<f8")
    layout[:4] = h5py.VirtualSource("part.h5", "d", shape=(4, 10))
    layout[4:] = h5py.VirtualSource("part.h5", "d", shape=(4, 10))
    path = tmp_path / "vds" / "v.h5"
    with h5py.File(path, "w") as f:
        f.create_virtual_dataset("v", layout, fillvalue=-1)
    prefix = str(tmp_path / "sources")
    with mixle.read_hdf5(path, "v", virtual_prefix=prefix) as src:
        got = src[...]
        assert pickle.loads(pickle.dumps(src))[5, 3] == got[5, 3]
    with h5py.File(path, "r") as f:
        dapl = h5py.h5p.create(h5py.h5p.DATASET_ACCESS)
        dapl.set_virtual_prefix(prefix.encode())
        want = h5py.Dataset(h5py.h5d.open(f.id, b"v", dapl=dapl))[...]
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got, np.concatenate([data, data]))


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"efile_prefix": 3}, TypeError, r"efile_prefix=3 must be a folder path"),
        ({"virtual_prefix": b"/x"}, TypeError, r"virtual_prefix=b'/x' must be a folder path"),
        ({"efile_prefix": "a\0b"}, ValueError, r"efile_prefix='a\\x00b' contains a NUL"),
        ({"rdcc_nbytes": -1}, ValueError, r"rdcc_nbytes=-1 must be a non-negative integer"),
        ({"rdcc_nslots": "9"}, TypeError, r"rdcc_nslots='9' must be a non-negative integer"),
        ({"rdcc_w0": 2.0}, ValueError, r"rdcc_w0=2.0 must be a number from 0 to 1"),
        ({"efile_prefx": "/x"}, TypeError, r"h5py.File refused the options .*efile_prefix"),
        # only the bad keyword, not the defaults mixle passes along with it
        ({"nosuch": 1}, TypeError, r"refused the options \['nosuch'\] "),
    ],
)
def test_dataset_options_are_checked_with_clear_errors(tmp_path, options, error, match):
    path = tmp_path / "a.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("a", data=np.zeros(4))
    with pytest.raises(error, match=match):
        mixle.read_hdf5(path, "a", **options)


SPECIAL = """
import json, os, sys
import mixle

out = {}
for label, path in json.loads(sys.argv[1]).items():
    try:
        mixle.read_hdf5(path, "x")
    except Exception as exc:
        out[label] = [type(exc).__name__, str(exc)]
    else:
        out[label] = None
print(json.dumps(out))
"""


def test_special_files_are_refused_before_h5py_opens_them(tmp_path):
    fifo = tmp_path / "pipe.h5"
    os.mkfifo(fifo)  # h5py opening it would block for ever
    (tmp_path / "folder.h5").mkdir()
    (tmp_path / "zero.h5").symlink_to("/dev/zero")
    paths = {
        "fifo": str(fifo),
        "directory": str(tmp_path / "folder.h5"),
        "device": "/dev/null",
        "link to /dev/zero": str(tmp_path / "zero.h5"),
    }
    got = _child(SPECIAL, json.dumps(paths), timeout=30)
    for label, path in paths.items():
        assert got[label] is not None, label
        kind, message = got[label]
        assert kind == "SpecialFileError", (label, message)
        assert path in message


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    stack: list[BaseException | None] = [exc]
    while stack:
        item = stack.pop()
        if item is None or any(item is s for s in seen):
            continue
        seen.append(item)
        stack += [item.__cause__, item.__context__]
        stack += [a for a in item.args if isinstance(a, BaseException)]
    return seen


def _texts(exc: BaseException) -> str:
    parts = []
    for item in _chain(exc):
        parts += [str(item), repr(item), *map(repr, item.args)]
        parts += [repr(v) for v in vars(item).values()] if hasattr(item, "__dict__") else []
    return "\n".join(parts)


@pytest.mark.usefixtures("fast_retries")
def test_remote_open_errors_hold_no_secret_anywhere_in_their_chain(tmp_path):
    (tmp_path / "not-hdf5.h5").write_bytes(b"this is no HDF5 file\n" * 100)
    secrets = ("hunter2pw", "SEKRITtoken", "aHVudGVy", "Bearer-XYZZY")
    with RangeHTTPServer(tmp_path) as server:
        base = server.url.replace("http://", "http://user:hunter2pw@")
        cases = [
            (f"{base}/missing.h5?token=SEKRITtoken", None, FileNotFoundError),
            (
                f"{server.url}/missing.h5",
                {"headers": {"Authorization": "Bearer-XYZZY"}},
                FileNotFoundError,
            ),
            (f"{base}/not-hdf5.h5?token=SEKRITtoken", None, OSError),
        ]
        for url, options, kind in cases:
            with pytest.raises(kind) as info:
                HDF5ArraySource(url, "x", storage_options=options)
            _assert_no_secret(info.value, secrets, "missing.h5" in url)
    with RangeHTTPServer(tmp_path, FaultPlan(range_fault="html")) as server:  # every range
        url = (
            server.url.replace("http://", "http://user:hunter2pw@")
            + "/not-hdf5.h5?token=SEKRITtoken"
        )
        with pytest.raises(RemoteReadError) as info:
            HDF5ArraySource(url, "x", storage_options={"headers": {"X-Key": "Bearer-XYZZY"}})
        _assert_no_secret(info.value, secrets, False)


def _assert_no_secret(error: BaseException, secrets: tuple[str, ...], missing: bool) -> None:
    text = _texts(error)
    assert "missing.h5" in text if missing else "not-hdf5.h5" in text
    for secret in secrets:
        assert secret not in text, (secret, text)


def test_a_dataset_open_elsewhere_with_another_efile_prefix_is_a_clear_error(tmp_path):
    path, raw, data = _external_file(tmp_path)
    with h5py.File(path, "r") as f:
        dapl = h5py.h5p.create(h5py.h5p.DATASET_ACCESS)
        dapl.set_efile_prefix(b"/elsewhere")
        held = h5py.Dataset(h5py.h5d.open(f.id, b"e", dapl=dapl))
        with pytest.raises(ValueError, match=r"dataset='e' is already open .*efile_prefix"):
            mixle.read_hdf5(path, "e", efile_prefix=raw)
        del held
    np.testing.assert_array_equal(mixle.read_hdf5(path, "e", efile_prefix=raw)[...], data)


VDS_OPEN = """
import json, sys
import mixle

try:
    mixle.read_hdf5(sys.argv[1], "v")[0:5]
except Exception as exc:
    print(json.dumps([type(exc).__name__, str(exc)]))
else:
    print(json.dumps(None))
"""


@pytest.mark.parametrize("named", ["absolute", "relative"])
def test_virtual_sources_that_are_fifos_are_refused_at_open(tmp_path, named):
    folder = tmp_path / "vds"
    folder.mkdir()
    source = folder / "src.h5"
    with h5py.File(source, "w") as f:
        f.create_dataset("x", data=np.arange(100.0))
    layout = h5py.VirtualLayout(shape=(100,), dtype="f8")
    # a relative name is found in the virtual dataset's own folder, as HDF5 finds it
    layout[:] = h5py.VirtualSource(str(source) if named == "absolute" else "src.h5", "x", (100,))
    with h5py.File(folder / "v.h5", "w") as f:
        f.create_virtual_dataset("v", layout, fillvalue=-1)
    with mixle.read_hdf5(folder / "v.h5", "v") as src:  # a regular source reads as h5py
        np.testing.assert_array_equal(src[...], np.arange(100.0))
    source.unlink()
    os.mkfifo(source)
    # in a child: HDF5 opening the FIFO would block this process for ever
    error = _child(VDS_OPEN, str(folder / "v.h5"), timeout=30)
    assert error is not None and error[0] == "SpecialFileError"
    assert "FIFO" in error[1] and str(source) in error[1] and "'v'" in error[1]


PLUGIN_BOMBS = """
import json, struct, sys
import h5py, hdf5plugin, numcodecs
import mixle

def hwm():
    with open("/proc/self/status") as status:
        return int(next(line for line in status if line.startswith("VmHWM")).split()[1])

def lz4(n):  # hdf5plugin's framing: 8-byte BE total, 4-byte BE block size, sized blocks
    block = numcodecs.LZ4().encode(bytes(1 << 20))[4:]
    return struct.pack(">qi", n << 20, 1 << 20) + (struct.pack(">i", len(block)) + block) * n

bombs = {
    "zstd": (hdf5plugin.Zstd(), bytes(numcodecs.Zstd(1).encode(bytes(64 << 20)))),
    "lz4": (hdf5plugin.LZ4(), lz4(64)),
    "blosc": (hdf5plugin.Blosc(), bytes(numcodecs.Blosc("lz4").encode(bytes(64 << 20)))),
}
path = sys.argv[1]
with h5py.File(path, "w") as f:
    for name, (options, bomb) in bombs.items():
        ds = f.create_dataset(name, shape=(64, 512), chunks=(32, 256), dtype="<i4", **options)
        ds[...] = 1
        ds.id.write_direct_chunk((0, 0), bomb)
out = {}
for name in bombs:
    with mixle.read_hdf5(path, name) as src:
        assert (src[-1:, -1:] == 1).all()  # a sound chunk reads as h5py
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")
        base = hwm()
        for how in ("getitem", "boxes"):
            try:
                src[0:1, 0:1] if how == "getitem" else src.read_boxes([[0, 0]], [1, 1])
            except Exception as exc:
                out[f"{name} {how}"] = [type(exc).__name__, str(exc), hwm() - base]
print(json.dumps(out))
"""


def test_plugin_chunks_stating_more_than_a_chunk_are_refused_before_hdf5_decodes(tmp_path):
    out = _child(PLUGIN_BOMBS, str(tmp_path / "bombs.h5"), timeout=120)
    assert sorted(out) == sorted(
        f"{n} {h}" for n in ("zstd", "lz4", "blosc") for h in ("getitem", "boxes")
    )
    for label, (error, message, growth_kib) in out.items():
        name = label.split()[0]
        assert error == "CorruptChunkError", label
        assert f"chunk (0, 0) of HDF5 dataset '/{name}'" in message, label
        assert f"its {name} data" in message and "a chunk has 32768" in message, label
        assert str(64 << 20) in message, label
        assert growth_kib < 16 * 1024, label  # the 64 MiB HDF5 would allocate never was
