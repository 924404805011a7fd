"""read_zarr on a local icechunk repository: a read-only session at a branch, tag or snapshot.

Repositories are written with icechunk and zarr-python; every read path is compared with
zarr's own read of icechunk's read-only session store, and nothing mixle does may change
the repository folder.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

zarr = pytest.importorskip("zarr")
icechunk = pytest.importorskip("icechunk")
from _fork_child import in_forked_child  # noqa: E402
from zarr.codecs import (  # noqa: E402
    BloscCodec,
    GzipCodec,
    ShardingCodec,
    TransposeCodec,
    ZstdCodec,
)

from mixle.data.sampling.patch_sampler import PatchSampler  # noqa: E402
from mixle.data.sources.array_source import read_zarr  # noqa: E402
from mixle.data.sources.arrays.zarr.by_path import is_icechunk_repository  # noqa: E402
from mixle.errors import NotAnArrayError  # noqa: E402
from mixle.reading import chunk_cache  # noqa: E402
from mixle.testing import assert_unchanged, check_array_source  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:Combining a `sharding_indexed` codec")

#: name -> (create_array options, the chunk reader mixle picks)
ARRAYS: dict[str, tuple[dict[str, Any], str]] = {
    "raw/img": (
        {
            "shape": (13, 10, 7),
            "chunks": (5, 4, 7),
            "dtype": "uint16",
            "fill_value": 3,
            "compressors": ZstdCodec(level=1),
        },
        "ZarrStoreReader",
    ),
    "small": (  # chunks below icechunk's inline threshold: stored in the manifest
        {"shape": (9, 5), "chunks": (3, 2), "dtype": "float32", "compressors": GzipCodec()},
        "ZarrStoreReader",
    ),
    "sharded": (
        {
            "shape": (8, 12, 6),
            "chunks": (2, 3, 6),
            "shards": (4, 6, 6),
            "dtype": "int64",
            "compressors": BloscCodec(cname="lz4"),
        },
        "ShardedZarrReader",
    ),
    "transposed shards": (  # a layout mixle leaves to zarr's own codec pipeline
        {
            "shape": (12, 10),
            "chunks": (8, 8),
            "dtype": "float32",
            "filters": [TransposeCodec(order=(1, 0))],
            "serializer": ShardingCodec(chunk_shape=(4, 4)),
            "compressors": None,
        },
        "ZarrPipelineReader",
    ),
}


def _values(options: dict[str, Any], seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    shape, dtype = options["shape"], np.dtype(options["dtype"])
    if dtype.kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    return rng.integers(0, 1000, size=shape).astype(dtype)


def _repo(path: Path) -> Any:
    return icechunk.Repository.open(icechunk.local_filesystem_storage(str(path)))


def _commit(path: Path, branch: str, seed: int, message: str) -> str:
    session = _repo(path).writable_session(branch)
    root = zarr.open_group(store=session.store, mode="a")
    for name, (options, _) in ARRAYS.items():
        array = root[name] if name in root else root.create_array(name, **options)
        data = _values(options, seed)
        edge = options["chunks"][0] * ((options["shape"][0] - 1) // options["chunks"][0])
        region = (slice(0, edge),)  # the last row of chunks is never written: the fill value
        array[region] = data[region]
    return str(session.commit(message))


def _zarrs_read(path: Path, component: str, **version: str) -> np.ndarray:
    session = _repo(path).readonly_session(**version)
    return np.asarray(zarr.open_array(store=session.store, path=component, mode="r")[...])


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    path = tmp_path_factory.mktemp("ice") / "repo"
    icechunk.Repository.create(icechunk.local_filesystem_storage(str(path)))
    first = _commit(path, "main", 1, "first")
    _repo(path).create_tag("v1", first)
    second = _commit(path, "main", 2, "second")
    _repo(path).create_branch("dev", second)
    _commit(path, "dev", 3, "on dev")
    return {"path": path, "first": first, "second": second}


def test_the_layout_is_recognised(repo, tmp_path):
    assert is_icechunk_repository(str(repo["path"]))
    zarr.create_array(tmp_path / "plain.zarr", shape=(2,), dtype="i1")
    assert not is_icechunk_repository(str(tmp_path / "plain.zarr"))


@pytest.mark.parametrize("name", list(ARRAYS))
def test_every_read_path_equals_icechunk_and_zarrs_read(repo, name):
    path = repo["path"]
    expected = _zarrs_read(path, name, branch="main")
    with assert_unchanged(path):
        chunk_cache().clear()
        src = read_zarr(path, name)
        assert type(src._reader_for(src.array)).__name__ == ARRAYS[name][1]
        patch = tuple(max(1, s // 2) for s in expected.shape)
        patches, corners = PatchSampler(src, patch, num_patches=6, seed=4).get_batch(np.arange(6))
        for got, corner in zip(patches, corners):
            box = tuple(slice(int(c), int(c) + p) for c, p in zip(corner, patch))
            np.testing.assert_array_equal(got, expected[box])
        check_array_source(src, expected)


def test_branch_tag_and_snapshot_each_read_their_version(repo):
    path = repo["path"]
    with assert_unchanged(path):
        for version in ({"branch": "dev"}, {"tag": "v1"}, {"snapshot": repo["second"]}):
            theirs = {("snapshot_id" if k == "snapshot" else k): v for k, v in version.items()}
            want = _zarrs_read(path, "raw/img", **theirs)
            src = read_zarr(path, "raw/img", **version)
            np.testing.assert_array_equal(src[...], want)
            src.close()
        main, dev = read_zarr(path, "raw/img"), read_zarr(path, "raw/img", branch="dev")
        assert not np.array_equal(main[...], dev[...])
        assert "branch='main' @ snapshot" in repr(main)


def test_a_pickled_copy_reads_the_snapshot_its_parent_opened(tmp_path):
    path = tmp_path / "moving"
    icechunk.Repository.create(icechunk.local_filesystem_storage(str(path)))
    first = _commit(path, "main", 10, "first")
    src = read_zarr(path, "raw/img")
    before = src[...]
    blob = pickle.dumps(src)
    assert first.encode() in blob  # the snapshot id is pinned in the pickle
    _commit(path, "main", 11, "after the pickle")
    copy = pickle.loads(blob)
    np.testing.assert_array_equal(copy[...], before)
    src.release_handle()  # reopening reads the same snapshot too
    np.testing.assert_array_equal(src[...], before)
    fresh = read_zarr(path, "raw/img")
    np.testing.assert_array_equal(fresh[...], _zarrs_read(path, "raw/img", branch="main"))
    assert not np.array_equal(fresh[...], before)


def test_a_missing_branch_lists_the_branches_and_tags(repo):
    with pytest.raises(ValueError, match=r"branch='nope'.*branches: dev, main; tags: v1"):
        read_zarr(repo["path"], "raw/img", branch="nope")
    with pytest.raises(ValueError, match=r"tag='v9'.*branches: dev, main"):
        read_zarr(repo["path"], "raw/img", tag="v9")
    with pytest.raises(ValueError, match=r"snapshot='0000000000000000000A'"):
        read_zarr(repo["path"], "raw/img", snapshot="0000000000000000000A")


def test_the_repository_root_is_a_group_that_lists_its_arrays(repo):
    with pytest.raises(NotAnArrayError, match=r"arrays: .*raw/img \(13, 10, 7\) uint16"):
        read_zarr(repo["path"])


def test_version_arguments_are_checked(repo, tmp_path):
    with pytest.raises(ValueError, match=r"branch='dev' and tag='v1'.*at most one"):
        read_zarr(repo["path"], "raw/img", branch="dev", tag="v1")
    with pytest.raises(TypeError, match=r"branch=3 must be a str"):
        read_zarr(repo["path"], "raw/img", branch=3)  # type: ignore[arg-type]
    folder = tmp_path / "plain.zarr"
    zarr.create_array(folder, shape=(2,), dtype="i1")
    with pytest.raises(ValueError, match=r"branch='main' only applies to a local icechunk"):
        read_zarr(folder, branch="main")
    with pytest.raises(ValueError, match=r"tag='v1' only applies.*memory://"):
        read_zarr("memory://x.zarr", tag="v1")
    absent = tmp_path / "absent"
    with pytest.raises(FileNotFoundError):
        read_zarr(absent, branch="main")
    assert not absent.exists()  # icechunk was never asked to open it (it would create it)


def test_a_forked_child_is_refused_instead_of_hanging(repo):
    src = read_zarr(repo["path"], "small")
    want = src[...]

    def child() -> list[str]:
        try:
            src[0]
        except RuntimeError as exc:
            return [] if "forked" in str(exc) and "spawn" in str(exc) else [str(exc)]
        return ["the child read through icechunk after fork"]

    assert in_forked_child(child) == []
    np.testing.assert_array_equal(src[...], want)


#: Run in a fresh interpreter: the parent does ``PARENT`` with icechunk itself (mixle never
#: opens a repository there), forks, and the child (and a grandchild it forks) reads the
#: repository through mixle. A SIGALRM kills a child that hangs.
_FORK_SCRIPT = """
import os, signal, sys
import icechunk, numpy as np, zarr
from mixle.data.sources.array_source import read_zarr
path = sys.argv[1]
if sys.argv[2] == "used":
    repo = icechunk.Repository.open(icechunk.local_filesystem_storage(path))
    zarr.open_array(repo.readonly_session(branch="main").store, path="small", mode="r")[...]

def child():
    signal.alarm(20)
    try:
        print("read", read_zarr(path, "small")[...].sum(), flush=True)
    except RuntimeError as exc:
        print("refused", exc, flush=True)
    grandchild = os.fork()
    if grandchild == 0:
        signal.alarm(20)
        try:
            print("grandchild read", read_zarr(path, "small")[...].sum(), flush=True)
        except RuntimeError as exc:
            print("grandchild refused", exc, flush=True)
        os._exit(0)
    os._exit(os.waitpid(grandchild, 0)[1])

pid = os.fork()
if pid == 0:
    child()
print("child status", os.waitpid(pid, 0)[1], flush=True)
"""


def _fork_after(repo: dict[str, Any], parent: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_FORK_SCRIPT), str(repo["path"]), parent],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    ours = ("read", "refused", "grandchild", "child status")  # not icechunk's log lines
    return [line for line in done.stdout.splitlines() if line.startswith(ours)]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_child_forked_after_the_parent_used_icechunk_itself_is_refused(repo):
    lines = _fork_after(repo, "used")
    assert lines[-1] == "child status 0", lines  # 14: the child hung in read_zarr (SIGALRM)
    refusals = [line for line in lines if line.startswith(("refused", "grandchild refused"))]
    assert len(refusals) == 2, lines
    for line in refusals:
        assert "forked after the parent used icechunk" in line
        assert "'spawn' or 'forkserver'" in line


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="threads listed in /proc")
def test_a_child_forked_after_icechunk_was_only_imported_reads(repo):
    want = str(_zarrs_read(repo["path"], "small", branch="main").sum())
    lines = _fork_after(repo, "imported")
    assert lines[0] == f"read {want}", lines  # import alone starts no runtime: no refusal
    assert lines[1].startswith("grandchild refused"), lines  # the child's read started it
    assert "forked after the parent used icechunk" in lines[1]
    assert lines[2:] == ["child status 0"], lines


def test_without_icechunk_the_error_names_the_extra(repo, monkeypatch):
    monkeypatch.setitem(sys.modules, "icechunk", None)  # import icechunk now fails
    with pytest.raises(ImportError, match=r'pip install -e "\.\[icechunk\]"'):
        read_zarr(repo["path"], "small")


def test_nothing_is_written_to_the_repository(repo):
    path = repo["path"]
    with assert_unchanged(path):
        src = read_zarr(path, "sharded", tag="v1")
        src.read_boxes([(0, 0, 0), (4, 6, 0)], (4, 6, 6))
        with pytest.raises(icechunk.IcechunkError, match="read-only store"):
            src.array[0, 0, 0] = 1
        src.close()


def test_inspect_reports_the_version_and_icechunks_stored_chunks(repo):
    from mixle.inspection.icechunk_repos import inspect_icechunk, is_icechunk

    path = repo["path"]
    assert is_icechunk(str(path))
    with assert_unchanged(path):
        root = inspect_icechunk(str(path), None, (2, 2), tag="v1")
    (finding,) = [f for f in root.findings if f.code == "icechunk"]
    assert f"snapshot {repo['first']}" in finding.message
    assert "branches: dev, main; tags: v1" in finding.message
    assert f"snapshot={repo['first']!r}" in finding.message
    session = _repo(path).readonly_session(tag="v1")
    theirs = zarr.open_array(store=session.store, path="small", mode="r")
    (small,) = [c for c in root.children if c.path == "/small"]
    assert (small.shape, small.chunks) == (theirs.shape, theirs.chunks)
    assert small.chunks_stored == theirs.nchunks_initialized
    with pytest.raises(ValueError, match=r"branch='gone'.*branches: dev, main"):
        inspect_icechunk(str(path), None, None, branch="gone")


def test_a_session_store_given_as_path_is_refused_in_a_forked_child(repo):
    session = _repo(repo["path"]).readonly_session(branch="main")
    src = read_zarr(session.store, "small")
    want = src[...]

    def child() -> list[str]:
        try:
            src.release_handle()  # reopen from the store object, as after any fork
            src[0]
        except RuntimeError as exc:
            return [] if "forked" in str(exc) else [str(exc)]
        return ["the child read through the parent's icechunk store"]

    assert in_forked_child(child) == []
    np.testing.assert_array_equal(src[...], want)
