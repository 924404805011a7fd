"""``mixle inspect`` and ``mixle demo`` on hostile input and a full disk: no hang, no
unbounded memory, no traceback; exit status 1 and one line on stderr that names the path.

Every case runs the command line in a child process, waited on with a timeout, so a hang
fails the test instead of blocking the suite. The children are forked from one interpreter
that has imported mixle's command line, zarr and h5py once (a fresh interpreter spends most
of a second on those imports); each child still gets its own argv, environment, working
directory, standard streams, limits, exit status and interpreter shutdown.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import struct
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from _zygote import Zygote

from mixle.cli import main

zarr = pytest.importorskip("zarr")
h5py = pytest.importorskip("h5py")

ROOT = Path(__file__).resolve().parents[1]
#: Seconds a child may take before it counts as hung.
TIMEOUT_S = 30
#: The child: setup code (argv[1]), ``mixle`` with argv[3:], then code to run after (argv[2]).
CHILD = (
    "import sys\n"
    "exec(sys.argv[1])\n"
    "from mixle.cli import main\n"
    "status = main(sys.argv[3:])\n"
    "exec(sys.argv[2])\n"
    "raise SystemExit(status)\n"
)
#: Child setup: a file-size limit (writes past it fail with EFBIG instead of killing).
FILE_SIZE_LIMIT = (
    "import resource, signal\n"
    "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
    "resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))\n"
)
#: Child setup: peak memory growth measured around the command (VmHWM, never ru_maxrss),
#: with an address-space cap so that a regression fails instead of exhausting the machine.
MEASURE_MEMORY = """
import atexit, resource
import mixle.cli, numpy
resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
def _hwm():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
_base = _hwm()
atexit.register(lambda: print(f"grew {_hwm() - _base}"))
"""


#: Children fork from one interpreter that imported these once (tests/_zygote.py).
FORKS = Zygote(
    "import h5py, numpy, zarr\nimport mixle.cli\n",
    dict(
        os.environ,
        MIXLE_PROGRESS="0",
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    ),
    ROOT,
)


@pytest.fixture(scope="module", autouse=True)
def _forks_end_with_the_module() -> Iterator[None]:
    yield
    FORKS.close()


def run_cli(
    *argv: str,
    setup: str = "",
    after: str = "",
    cwd: Path | None = None,
    env: dict | None = None,
) -> tuple[int, str, str]:
    """``mixle *argv`` in a child; ``(status, stdout, stderr)``; fails the test on a hang."""
    child_env = dict(os.environ if env is None else env, MIXLE_PROGRESS="0")
    child_env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])
    )
    child_env.pop("MIXLE_TRACEBACK", None)
    done = FORKS.run(
        CHILD,
        ["-c", setup, after, *argv],
        env=child_env,
        cwd=cwd if cwd is not None else os.getcwd(),
        timeout=TIMEOUT_S,
    )
    if done.status is None:
        pytest.fail(f"mixle {' '.join(argv)} hung for more than {TIMEOUT_S} s")
    return done.status, done.stdout, done.stderr


def assert_one_line(status: int, err: str, *names: str) -> str:
    """Exit status 1, exactly one line on stderr, naming each of ``names``."""
    assert status == 1, err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    for name in names:
        assert name in lines[0], err
    return lines[0]


# -- special files -----------------------------------------------------------------------
def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _dev_zero(path: Path) -> None:
    path.symlink_to("/dev/zero")


@pytest.mark.parametrize(
    ("make", "kind"),
    [(_fifo, "a FIFO"), (_dev_zero, "a character device")],
    ids=["fifo", "dev-zero-link"],
)
def test_inspect_refuses_a_special_file_given_as_the_path(tmp_path, make, kind):
    path = tmp_path / "scan.npy"
    make(path)
    status, out, err = run_cli("inspect", str(path))
    line = assert_one_line(status, err, str(path), kind)
    assert line.startswith("mixle inspect: ") and out == ""


def test_inspect_refuses_a_socket(tmp_path):
    path = tmp_path / "scan.h5"
    server = socket.socket(socket.AF_UNIX)
    try:
        server.bind(str(path))
        status, _, err = run_cli("inspect", str(path))
    finally:
        server.close()
    assert_one_line(status, err, str(path), "a socket")


def _sharded_store(root: Path) -> Path:
    arr = zarr.create_array(root, shape=(8, 8), chunks=(2, 2), shards=(4, 4), dtype="i2")
    arr[:] = 1
    return root / "c" / "0" / "0"


def _plain_store_v2(root: Path) -> Path:
    arr = zarr.create_array(root, shape=(8,), chunks=(4,), dtype="i2", zarr_format=2)
    arr[:] = 1
    return root / "0"


@pytest.mark.parametrize(
    ("store", "member", "make", "kind"),
    [
        (_sharded_store, None, _fifo, "a FIFO"),  # the shard index would be read
        (_sharded_store, None, _dev_zero, "a character device"),
        (_plain_store_v2, ".zattrs", _fifo, "a FIFO"),
        (_plain_store_v2, ".zarray", _dev_zero, "a character device"),
        (_sharded_store, "zarr.json", _fifo, "a FIFO"),
    ],
    ids=["shard-fifo", "shard-dev-zero", "zattrs-fifo", "zarray-dev-zero", "zarr-json-fifo"],
)
def test_inspect_refuses_special_files_inside_a_zarr_store(tmp_path, store, member, make, kind):
    root = tmp_path / "scan.zarr"
    chunk = store(root)
    target = chunk if member is None else root / member
    target.unlink(missing_ok=True)
    make(target)
    status, _, err = run_cli("inspect", str(root))
    assert_one_line(status, err, str(root), str(target), kind)


def test_inspect_refuses_a_folder_named_like_zarr_metadata(tmp_path):
    root = tmp_path / "scan.zarr"
    (root / ".zarray").mkdir(parents=True)
    status, _, err = run_cli("inspect", str(root))
    assert_one_line(status, err, str(root / ".zarray"), "a directory")


def test_a_zero_chunk_shape_is_a_clear_error(tmp_path):
    root = tmp_path / "scan.zarr"
    _plain_store_v2(root)
    meta = json.loads((root / ".zarray").read_text())
    meta["chunks"] = [0]
    (root / ".zarray").write_text(json.dumps(meta))
    status, _, err = run_cli("inspect", str(root), "--patch", "2")
    assert_one_line(status, err, str(root), "chunk shape (0,)")


# -- sizes and depths ----------------------------------------------------------------------
def test_a_huge_npy_header_is_refused_before_it_is_read(tmp_path):
    path = tmp_path / "big.npy"
    claimed = 200_000_000
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x03\x00" + struct.pack("<I", claimed))
        f.write(b"{'descr': '<i2', 'fortran_order': False, 'shape': (")
        f.truncate(10 + claimed)  # sparse: the 200 MB "header" costs no disk
    status, out, err = run_cli("inspect", str(path), setup=MEASURE_MEMORY)
    assert_one_line(status, err, str(path), "MAX_NPY_HEADER_BYTES")
    grew = int(out.split("grew ")[1])
    assert grew < 32 * 2**20, f"peak RSS grew {grew / 2**20:.0f} MiB"


def _deep(levels: int) -> str:
    return "[" * levels + "]" * levels


def test_deeply_nested_zarr_v2_attributes_are_refused(tmp_path):
    root = tmp_path / "deep.zarr"
    _plain_store_v2(root)
    (root / ".zattrs").write_text('{"a": ' + _deep(100_000) + "}")
    status, _, err = run_cli("inspect", str(root))
    assert_one_line(status, err, str(root), str(root / ".zattrs"), "MAX_METADATA_DEPTH")


def test_deeply_nested_zarr_v3_attributes_are_refused(tmp_path):
    root = tmp_path / "deep.zarr"
    zarr.create_array(root, shape=(4,), chunks=(2,), dtype="i2")
    meta = json.loads((root / "zarr.json").read_text())
    meta["attributes"] = {"a": "__DEEP__"}
    text = json.dumps(meta).replace('"__DEEP__"', _deep(100_000))
    (root / "zarr.json").write_text(text)
    status, _, err = run_cli("inspect", str(root))
    assert_one_line(status, err, str(root), "MAX_METADATA_DEPTH")


def test_nesting_depth_ignores_brackets_in_strings():
    from mixle.inspection import limits

    assert limits.json_depth(b'{"a": [1, {"b": "[[[[{{{{"}], "c": "\\"]]]"}') == 3
    assert limits.json_depth(b"") == 0
    assert limits.json_depth(_deep(5000).encode()) == 5000


def test_metadata_larger_than_the_cap_is_not_read(tmp_path, monkeypatch, capsys):
    from mixle.inspection import limits

    root = tmp_path / "big.zarr"
    _plain_store_v2(root)
    (root / ".zattrs").write_text(json.dumps({"notes": "x" * 5000}))
    monkeypatch.setattr(limits, "MAX_METADATA_BYTES", 1000)
    assert main(["inspect", str(root)]) == 1
    line = assert_one_line(1, capsys.readouterr().err, str(root / ".zattrs"))
    assert "MAX_METADATA_BYTES=1,000" in line


def test_an_hdf5_hard_link_cycle_is_reported_once(tmp_path):
    path = tmp_path / "cycle.h5"
    with h5py.File(path, "w") as f:
        f.create_group("a/b")
        f["a/b/data"] = np.arange(6)
        f["a/loop"] = f["a"]  # the group, hard-linked into itself
        f["alias"] = f["a/b/data"]  # a second name for one dataset
    status, out, err = run_cli("inspect", str(path), "--json")
    assert status == 0 and err == "", err
    report = json.loads(out)
    arrays, codes = [], []

    def walk(node: dict) -> None:
        codes.extend(f["code"] for f in node.get("findings", ()))
        if "children" in node:
            for child in node["children"]:
                walk(child)
        else:
            arrays.append(node["path"])

    walk(report["root"])
    assert arrays == ["/a/b/data"]  # each object once, at its first path
    assert "hard-link-cycle" in codes and "hard-link-repeat" in codes


def test_hdf5_groups_nested_past_the_cap_are_named_not_walked(tmp_path):
    path = tmp_path / "deep.h5"
    with h5py.File(path, "w") as f:
        f.create_group("/".join(["g"] * 1500))  # deeper than Python's recursion limit
    status, out, err = run_cli("inspect", str(path), "--json")
    assert status == 0 and err == "", err
    assert '"too-deep"' in out and "MAX_TREE_DEPTH=256" in out


def test_zarr_groups_nested_past_the_cap_are_named_not_walked(tmp_path, monkeypatch):
    import mixle.inspection.zarr_stores as zarr_stores
    from mixle.inspection import inspect_store

    monkeypatch.setattr(zarr_stores, "MAX_TREE_DEPTH", 3)
    group = zarr.open_group(tmp_path / "deep.zarr", mode="w")
    for _ in range(5):
        group = group.create_group("g")
    node = inspect_store(tmp_path / "deep.zarr").root
    for _ in range(3):
        (node,) = node.children
    assert node.path == "/g/g/g" and node.children == ()
    assert [f.code for f in node.findings] == ["too-deep"]


# -- the command line's error contract -----------------------------------------------------
def test_an_unexpected_error_is_one_line_unless_a_traceback_is_asked_for(
    tmp_path, monkeypatch, capsys
):
    import mixle.cli.inspect as inspect_command

    def broken(*args, **kwargs):
        return 1 // 0

    monkeypatch.setattr(inspect_command, "inspect_store", broken)
    path = str(tmp_path / "x.zarr")
    assert main(["inspect", path]) == 1
    line = assert_one_line(1, capsys.readouterr().err, path, "ZeroDivisionError", "--traceback")
    assert line.startswith("mixle inspect: ")
    with pytest.raises(ZeroDivisionError):
        main(["--traceback", "inspect", path])
    monkeypatch.setenv("MIXLE_TRACEBACK", "1")
    with pytest.raises(ZeroDivisionError):
        main(["inspect", path])


@pytest.mark.parametrize("error", [RecursionError, MemoryError, OverflowError])
def test_raw_errors_become_one_clear_line(tmp_path, monkeypatch, capsys, error):
    import mixle.cli.inspect as inspect_command

    def broken(*args, **kwargs):
        raise error("line one\nline two")

    monkeypatch.setattr(inspect_command, "inspect_store", broken)
    path = str(tmp_path / "x.zarr")
    assert main(["inspect", path]) == 1
    assert_one_line(1, capsys.readouterr().err, path, error.__name__)


# -- mixle demo on a full disk ---------------------------------------------------------------
DEMO = ["demo", "--size", "64", "--patch", "8", "--num-patches", "8", "--no-jax", "--no-png"]


@pytest.mark.parametrize("backend", ["zarr", "hdf5", "memmap"])
def test_demo_on_a_full_disk_cleans_up_and_says_so(tmp_path, backend):
    temp = tmp_path / "temp"
    temp.mkdir()
    env = dict(os.environ, TMPDIR=str(temp))
    status, _, err = run_cli(
        *DEMO, "--backend", backend, setup=FILE_SIZE_LIMIT, cwd=tmp_path, env=env
    )
    assert status >= 0, f"killed by signal {-status}: {err}"
    assert_one_line(status, err, str(temp), "no space left on device")
    assert list(temp.iterdir()) == []


class _FillsUp:
    """A file whose writes of more than a few KiB fail with ``code``: a disk about full."""

    def __init__(self, file, code: int) -> None:
        self._file, self._code = file, code

    def write(self, data) -> int:
        if memoryview(data).nbytes > 4096:
            raise OSError(self._code, os.strerror(self._code))
        return self._file.write(data)

    def __getattr__(self, name: str):
        return getattr(self._file, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self._file.close()


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT, errno.EFBIG])
@pytest.mark.parametrize("backend", ["hdf5", "memmap"])
def test_every_full_disk_errno_is_the_same_clean_stop(tmp_path, monkeypatch, capsys, backend, code):
    import builtins

    import mixle.cli._demo_volume as demo_volume

    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    monkeypatch.chdir(tmp_path)

    def filling_open(path, mode="r", *args, **kwargs):
        return _FillsUp(builtins.open(path, mode, *args, **kwargs), code)

    monkeypatch.setattr(demo_volume, "open", filling_open, raising=False)
    assert main([*DEMO, "--backend", backend]) == 1
    assert_one_line(1, capsys.readouterr().err, str(temp), "no space left on device")
    assert list(temp.iterdir()) == []


#: Child setup: the first chunk write of the second slab fails with ENOSPC while the
#: slab's other chunks are still being written (slowly).
ZARR_ENOSPC = """
import errno, threading, time
import zarr.storage._local as local
_put, _calls, _lock = local._put, [0], threading.Lock()
def put(path, value, exclusive=False):
    if path.name == "zarr.json":
        return _put(path, value, exclusive)
    with _lock:
        _calls[0] += 1
        n = _calls[0]
    if n == 5:
        raise OSError(errno.ENOSPC, "No space left on device")
    if n > 5:
        time.sleep(0.5)
    return _put(path, value, exclusive)
local._put = put
"""


def test_demo_zarr_waits_for_writes_in_flight_before_removing_the_folder(tmp_path):
    temp = tmp_path / "temp"
    temp.mkdir()
    env = dict(os.environ, TMPDIR=str(temp))
    argv = [*DEMO, "--backend", "zarr", "--size", "128"]  # 4 chunks a slab, 2 slabs
    after = "import time; time.sleep(1.5)"  # a stray write would land by now
    status, _, err = run_cli(*argv, setup=ZARR_ENOSPC, after=after, cwd=tmp_path, env=env)
    assert list(temp.iterdir()) == []  # no chunk written after the folder was removed
    assert_one_line(status, err, str(temp), "no space left on device")


# -- remote stores: stalls, query strings, warnings ----------------------------------------
#: Child setup: a short request timeout and quick retries (the CLI's own defaults are 30 s
#: per request and 300 s in all).
QUICK_TIMEOUTS = (
    "from mixle.reading import set_retry_policy\n"
    "set_retry_policy(timeout=0.5, base_delay=0.01, max_delay=0.05)\n"
)
#: Credentials put in URLs; no output may hold them.
PASSWORD, TOKEN = "PASS" + "W0RD", "TOK" + "EN123"


def _remote_samples(root: Path) -> Path:
    zarr.create_array(root / "v2.zarr", shape=(64, 64), chunks=(32, 32), dtype="f4", zarr_format=2)[
        ...
    ] = 1
    zarr.create_array(root / "v3.zarr", shape=(64, 64), chunks=(32, 32), dtype="f4")[...] = 1
    with h5py.File(root / "v.h5", "w") as f:
        f.create_dataset("k", data=np.ones((64, 64), "f4"), chunks=(32, 32))
    np.save(root / "v.npy", np.ones(10))
    return root


@pytest.mark.parametrize(
    ("store", "match"),
    [("v3.zarr", ""), ("v2.zarr", ".zattrs"), ("v.h5", "")],
    ids=["probe", "zarr-open", "hdf5"],
)
def test_inspect_gives_up_on_a_stalled_server_after_the_request_timeout(tmp_path, store, match):
    from mixle.testing_servers import FaultPlan, RangeHTTPServer

    plan = FaultPlan(stall="headers", stall_match=match, stall_for=60)
    with RangeHTTPServer(_remote_samples(tmp_path), plan) as server:
        start = time.monotonic()
        status, out, err = run_cli("inspect", f"{server.url}/{store}", setup=QUICK_TIMEOUTS)
        took = time.monotonic() - start
    assert_one_line(status, err, store, "0.5 s request timeout")
    assert out == "" and took < 20, took


def test_inspect_deadline_and_timeout_options_bound_the_whole_inspection(tmp_path):
    from mixle.testing_servers import FaultPlan, RangeHTTPServer

    plan = FaultPlan(stall="headers", stall_for=60)
    with RangeHTTPServer(_remote_samples(tmp_path), plan) as server:
        url = f"{server.url}/v3.zarr"
        start = time.monotonic()
        status, _, err = run_cli("inspect", "--timeout", "5", "--deadline", "1", url)
        took = time.monotonic() - start
    assert_one_line(status, err, url, "1 s deadline", "--deadline")
    assert took < 15, took


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "soon"])
def test_inspect_timeout_options_must_be_positive_seconds(value, capsys):
    with pytest.raises(SystemExit) as stop:
        main(["inspect", "--timeout", value, "x.zarr"])
    assert stop.value.code == 2
    assert "is not a number of seconds > 0" in capsys.readouterr().err


@pytest.mark.parametrize(("name", "title"), [("v.h5", "hdf5 group"), ("v.npy", "npy array")])
def test_inspect_a_url_with_a_query_string_and_a_password(tmp_path, name, title):
    from mixle.testing_servers import RangeHTTPServer

    with RangeHTTPServer(_remote_samples(tmp_path)) as server:
        base = server.url.replace("http://", f"http://user:{PASSWORD}@")
        status, out, err = run_cli("inspect", f"{base}/{name}?token={TOKEN}")
    assert status == 0 and err == "", err
    assert f"/{name}  {title}" in out.splitlines()[0]
    assert PASSWORD not in out + err and TOKEN not in out + err


def test_warnings_while_inspecting_are_one_line_each_without_credentials(tmp_path):
    from mixle.testing_servers import RangeHTTPServer

    root = _remote_samples(tmp_path)
    both = root / "v3.zarr"
    (both / ".zarray").write_text((root / "v2.zarr" / ".zarray").read_text())  # zarr warns
    with RangeHTTPServer(root) as server:
        base = server.url.replace("http://", f"http://user:{PASSWORD}@")
        status, out, err = run_cli("inspect", f"{base}/v3.zarr")
    assert status == 0, err
    assert "zarr v3 array (64, 64) float32" in out.splitlines()[0]
    lines = err.splitlines()
    assert lines and all(line.startswith("mixle inspect: warning: ") for line in lines), err
    assert "Zarr v3 will be used" in err
    assert PASSWORD not in out + err and "Traceback" not in err


# -- damaged shards and metadata -----------------------------------------------------------
@pytest.mark.parametrize(
    "blob", [b"", b"xx", None], ids=["empty", "index-truncated", "index-checksum"]
)
def test_a_corrupt_shard_is_a_finding_and_the_rest_is_reported(tmp_path, blob):
    store = tmp_path / "s.zarr"
    a = zarr.create_array(store, shape=(64, 64), chunks=(8, 8), shards=(32, 32), dtype="f4")
    a[...] = 1
    shard = store / "c" / "0" / "1"
    raw = shard.read_bytes()
    shard.write_bytes(raw[:-20] + b"\xff" * 20 if blob is None else blob)
    status, out, err = run_cli("inspect", str(store), "--json")
    assert status == 0 and err == "", err
    report = json.loads(out)["root"]
    found = [f for f in report["findings"] if f["code"] == "corrupt-shard"]
    assert len(found) == 1 and found[0]["severity"] == "warning"
    assert "'c/0/1'" in found[0]["message"] and "CorruptChunkError" in found[0]["message"]
    assert report["shards_stored"] == 4 and report["chunks_stored"] == 48  # 3 sound shards
    status, out, err = run_cli("inspect", str(store))
    assert status == 0 and "1 stored shard cannot be read" in out, err


HOSTILE_METADATA = {
    "null": ("zarr.json", b"null", "holds a JSON null, not an object"),
    "list": ("zarr.json", b"[1,2,3]", "holds a JSON list, not an object"),
    "truncated-v3": ("zarr.json", b'{"zarr_format": 3, "node_type": "arr', "is not valid JSON"),
    "truncated-v2": (".zarray", b'{"zarr_format": 2, "shape": [10', "is not valid JSON"),
    "not-utf8": ("zarr.json", b'{"zarr_format": 3, \xff\xfe}', "is not UTF-8 text"),
    "empty": (".zarray", b"", "is empty"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_METADATA))
def test_hostile_zarr_metadata_is_one_line_naming_the_file(tmp_path, case):
    name, body, what = HOSTILE_METADATA[case]
    store = tmp_path / "h.zarr"
    store.mkdir()
    (store / name).write_bytes(body)
    status, _, err = run_cli("inspect", str(store))
    line = assert_one_line(status, err, f"{store / name}'", what)
    assert "a bug?" not in line and "--traceback" not in line


@pytest.mark.parametrize("case", ["null", "list", "truncated-v3"])
def test_hostile_zarr_metadata_over_http_names_the_file(tmp_path, case):
    from mixle.testing_servers import RangeHTTPServer

    name, body, what = HOSTILE_METADATA[case]
    (tmp_path / "h.zarr").mkdir()
    (tmp_path / "h.zarr" / name).write_bytes(body)
    with RangeHTTPServer(tmp_path) as server:
        status, _, err = run_cli("inspect", f"{server.url}/h.zarr", setup=QUICK_TIMEOUTS)
    line = assert_one_line(status, err, f"{server.url}/h.zarr/{name}'", what)
    assert "a bug?" not in line


def _v3_metadata(**over: object) -> bytes:
    meta = {
        "zarr_format": 3,
        "node_type": "array",
        "shape": [10, 10],
        "data_type": "float32",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [5, 5]}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": 0.0,
        "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
    }
    return json.dumps({**meta, **over}).encode()


@pytest.mark.parametrize(
    ("over", "what"),
    [
        ({"shape": [10.5, 10]}, "holds zarr metadata (zarr.json) but zarr cannot open it"),
        ({"node_type": "group"}, "holds zarr metadata (zarr.json) but zarr cannot open it"),
        ({"shape": [10**30, 10]}, "an axis longer than 2**63 - 1"),
    ],
    ids=["float-shape", "group-with-array-fields", "huge-shape"],
)
def test_zarr_metadata_zarr_refuses_is_one_line_not_a_bug(tmp_path, over, what):
    store = tmp_path / "m.zarr"
    store.mkdir()
    (store / "zarr.json").write_bytes(_v3_metadata(**over))
    status, _, err = run_cli("inspect", str(store))
    line = assert_one_line(status, err, str(store), what)
    assert "a bug?" not in line
