"""``mixle demo``: the report's facts, the picture, the options, cleanup, the console script.

In-process runs use ``--no-jax`` (JAX must not start in the pytest process); the JAX run,
Ctrl-C and a closed stdout pipe are checked in child processes.
"""

from __future__ import annotations

import importlib.metadata
import io
import os
import signal
import subprocess
import sys
import tempfile
import types
from pathlib import Path

import numpy as np
import pytest

from mixle.cli import demo as demo_module
from mixle.cli import main
from mixle.cli._demo_volume import (
    _deferred_interrupt,
    checksum,
    checksum_weights,
    ct_slab,
    write_volume,
)
from mixle.cli.demo import DEFAULT_PNG, run_demo
from mixle.reading import chunk_cache, default_chunk_cache_bytes, set_chunk_cache_bytes
from mixle.reading.cache import DEFAULT_CHUNK_CACHE_BYTES

ROOT = Path(__file__).resolve().parents[1]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
SMALL = ["--size", "48", "--patch", "8", "--batch-size", "8", "--num-patches", "40"]
TIMEOUT_S = 240


@pytest.fixture
def own_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The demo's temporary folders go under a folder of this test, the cwd is another."""
    temp = tmp_path / "temp"
    temp.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    monkeypatch.chdir(work)
    return temp


def table(text: str) -> dict[str, list[str]]:
    """The report's table: run name -> its cells, after checking the header."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if "patches/s" in line)
    header = lines[start]
    for column in ("run", "patches", "batches", "patches/s", "MiB/s", "cache hits", "peak RSS"):
        assert column in header
    rows = {}
    for line in lines[start + 2 :]:
        if not line.strip():
            break
        cells = line.split()
        rows[cells[0]] = cells[1:]
    return rows


def check_row(cells: list[str], patches: int) -> None:
    count, batches, per_s, mib_s, hits, rss = cells
    assert int(count) == patches and int(batches) > 0
    assert float(per_s) > 0 and float(mib_s) > 0
    assert hits == "-" or (hits.endswith("%") and 0 <= float(hits[:-1]) <= 100)
    assert rss == "?" or float(rss) > 0


def demo_folder(text: str) -> Path:
    line = next(line for line in text.splitlines() if line.startswith("  to "))
    return Path(line[len("  to ") :])


# -- the volume ---------------------------------------------------------------------------
def test_ct_slab_is_deterministic_int16_hounsfield_units():
    shape = (24, 20, 22)
    whole = ct_slab(shape, 0, 24, seed=3)
    assert whole.dtype == np.int16 and whole.shape == shape
    parts = np.concatenate([ct_slab(shape, 0, 5, seed=3), ct_slab(shape, 5, 24, seed=3)])
    assert np.array_equal(whole, parts)  # a plane depends on (shape, seed, z) only
    assert not np.array_equal(whole, ct_slab(shape, 0, 24, seed=4))
    assert whole.min() < -900 and whole.max() > 500  # air and bone
    assert abs(int(whole[0, 0, 0]) + 1000) < 100  # a corner is air


def test_checksum_adds_over_blocks_and_sees_a_misplaced_voxel():
    rng = np.random.default_rng(0)
    block = rng.integers(-1000, 1000, size=(9, 7, 5)).astype(np.int16)
    w = checksum_weights(block.shape, seed=1)
    total = checksum(block, w)
    halves = checksum(block[:4], (w[0][:4], *w[1:])) + checksum(block[4:], (w[0][4:], *w[1:]))
    assert halves % 2**64 == total
    swapped = block.copy()
    swapped[0, 0, 0], swapped[0, 0, 1] = block[0, 0, 1], block[0, 0, 0]
    assert block[0, 0, 0] != block[0, 0, 1] and checksum(swapped, w) != total


@pytest.mark.parametrize("backend", ["zarr", "hdf5", "memmap"])
def test_write_volume_holds_the_slabs(tmp_path, backend):
    shape = (20, 18, 16)
    calls = []
    volume = write_volume(tmp_path, shape, backend, chunk=8, seed=2, on_slab=calls.append)
    with volume.source as src:
        data = src[:]
    assert np.array_equal(data, ct_slab(shape, 0, 20, seed=2))
    assert calls == [8, 8, 4] and volume.chunks == (8, 8, 8)
    assert checksum(data, checksum_weights(shape, 2)) == volume.checksum


def test_ctrl_c_during_a_store_write_is_held_until_the_write_ends():
    # Python's own handler, set here: pytest started in the background (``... &``) inherits
    # SIGINT ignored, and an ignored Ctrl-C is (rightly) dropped, not raised
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    reached = []

    def write() -> None:
        with _deferred_interrupt():
            os.kill(os.getpid(), signal.SIGINT)
            reached.append("the rest of the write ran")

    try:
        with pytest.raises(KeyboardInterrupt):
            write()
        assert reached and signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, signal.SIG_DFL if inherited is None else inherited)


def test_sigterm_during_a_store_write_is_held_until_the_write_ends():
    before = signal.getsignal(signal.SIGTERM)
    reached, delivered = [], []

    def handler(signum, frame):
        delivered.append(signum)

    signal.signal(signal.SIGTERM, handler)
    try:
        with _deferred_interrupt():
            os.kill(os.getpid(), signal.SIGTERM)
            reached.append("the rest of the write ran")
            assert delivered == []  # held
        assert reached and delivered == [signal.SIGTERM]
        assert signal.getsignal(signal.SIGTERM) is handler
    finally:
        signal.signal(signal.SIGTERM, before)


def test_write_volume_rejects_an_unknown_backend(tmp_path):
    with pytest.raises(ValueError, match="backend='tiff'"):
        write_volume(tmp_path, (8, 8, 8), "tiff")


# -- run_demo -----------------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["auto", "zarr", "hdf5", "memmap"])
def test_demo_runs_and_cleans_up(own_tmp, backend):
    out = io.StringIO()
    result = run_demo(
        size=48, backend=backend, patch=8, batch_size=8, num_patches=40, use_jax=False, out=out
    )
    text = out.getvalue()
    resolved = "zarr" if backend == "auto" else backend
    assert result.backend == resolved and f"as {resolved}" in text
    assert [r.name for r in result.runs] == ["random", "grid"]
    random, grid = result.run("random"), result.run("grid")
    assert random.patches == 40 and random.batches == 5 and random.patches_per_s > 0
    assert random.nbytes == 40 * 8**3 * 2 and random.mib_per_s > 0
    assert grid.patches == 6**3 and grid.facts["checksum_ok"] is True
    assert "checksum equals the written volume's" in text
    assert result.volume_mib == 48**3 * 2 / 2**20 and result.chunks == (48, 48, 48)
    rows = table(text)
    check_row(rows["random"], 40)
    check_row(rows["grid"], 6**3)
    assert "jax" not in rows and "jax: skipped (--no-jax)" in text
    # memmaps never look in the chunk cache; chunked stores do, and the grid hits it
    assert (rows["grid"][4] == "-") == (resolved == "memmap")
    assert (grid.cache_hits > 0) == (resolved != "memmap")
    assert "peak RSS" in text and result.decode_threads >= 1
    assert f"removed {result.folder}" in text and not result.folder.exists()
    assert list(own_tmp.iterdir()) == [] and not result.kept
    with pytest.raises(KeyError, match="'jax'"):
        result.run("jax")


def test_demo_keeps_the_folder_when_asked(own_tmp):
    out = io.StringIO()
    result = run_demo(size=32, patch=8, num_patches=8, use_jax=False, keep=True, out=out)
    assert result.kept and result.folder.is_dir() and result.folder.parent == own_tmp
    assert (result.folder / "volume.zarr").is_dir()
    assert f"kept {result.folder}" in out.getvalue()


def test_demo_restores_the_cache_budget_and_shows_progress(own_tmp, capsys):
    before = chunk_cache().budget
    try:
        set_chunk_cache_bytes(3 * 2**20)
        result = run_demo(
            size=32, patch=8, num_patches=8, use_jax=False, cache_mib=1, progress=True
        )
        assert result.cache_mib == 1 and chunk_cache().budget == 3 * 2**20
        assert chunk_cache().stats().bytes == 0  # no chunks of the removed volume stay
    finally:
        set_chunk_cache_bytes(None if before == default_chunk_cache_bytes() else before)
    err = capsys.readouterr().err
    for bar in ("writing volume", "random patches", "grid tiles"):
        assert bar in err


def test_demo_leaves_the_default_budget_rule_in_place(own_tmp, monkeypatch):
    # a process on the default rule stays on it: a DataLoader worker forked later still
    # gets its share of the default, not the budget the demo restored as a setting
    set_chunk_cache_bytes(None)
    run_demo(size=32, patch=8, num_patches=4, use_jax=False, cache_mib=1)
    worker = types.ModuleType("torch.utils.data._utils.worker")
    worker._worker_info = types.SimpleNamespace(num_workers=4)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch.utils.data._utils.worker", worker)
    try:
        assert chunk_cache().budget == DEFAULT_CHUNK_CACHE_BYTES // 4
    finally:
        monkeypatch.delitem(sys.modules, "torch.utils.data._utils.worker")
        set_chunk_cache_bytes(None)
    assert chunk_cache().budget == DEFAULT_CHUNK_CACHE_BYTES


def test_demo_removes_the_folder_after_an_error(own_tmp, monkeypatch):
    def broken(*args, **kwargs):
        raise OSError("disk on fire")

    monkeypatch.setattr(demo_module, "run_grid", broken)
    with pytest.raises(OSError, match="disk on fire"):
        run_demo(size=32, patch=8, num_patches=8, use_jax=False, out=io.StringIO())
    assert list(own_tmp.iterdir()) == []


def test_demo_says_so_when_the_folder_could_not_be_removed(own_tmp, monkeypatch):
    monkeypatch.setattr(demo_module.shutil, "rmtree", lambda path, ignore_errors: None)
    out = io.StringIO()
    result = run_demo(size=32, patch=8, num_patches=8, use_jax=False, out=out)
    text = out.getvalue()
    assert result.folder.is_dir()
    assert f"could not remove {result.folder}" in text and "removed" not in text


def test_report_states_memory_facts_it_can_back():
    from mixle.cli._demo_report import mib_text, report_lines
    from mixle.cli._demo_runs import RunStats

    def report(**options):
        return " ".join(line.strip() for line in report_lines(runs, backend="zarr", **options))

    runs = [RunStats("grid", 8, 1, 8, 1.0, 1, 1, 100.0, {"tiles": 8, "checksum_ok": True})]
    lines = report(volume_mib=256, cache_mib=64)
    assert "at most 64 MiB of decoded chunks are kept" in lines
    assert "never held in memory whole" in lines and "never the whole volume" not in lines
    off = report(volume_mib=256, cache_mib=0)
    assert "chunk cache off" in off and "at most 0 MiB" not in off
    small = report(volume_mib=0.5, cache_mib=64)  # sizes under 1 MiB in KiB, never "0.0 MiB"
    assert "for a 512 KiB volume" in small
    assert [mib_text(m) for m in (256, 0.5, 1 / 128)] == ["256 MiB", "512 KiB", "8 KiB"]


def test_demo_writes_a_png(own_tmp):
    import matplotlib.image

    out = io.StringIO()
    target = Path("picture.png")
    result = run_demo(size=48, patch=8, num_patches=40, use_jax=False, png=target, out=out)
    assert result.png == target and target.read_bytes().startswith(PNG_SIGNATURE)
    image = matplotlib.image.imread(target)
    assert image.ndim == 3 and image.shape[0] > 300 and image.shape[1] > 600
    assert f"picture of the patch locations: {target.resolve()}" in out.getvalue()


def test_demo_never_replaces_a_png_unless_told(own_tmp):
    target = Path("mine.png")
    target.write_bytes(b"my own picture")
    with pytest.raises(FileExistsError, match=r"mine\.png"):
        run_demo(size=32, patch=8, num_patches=8, use_jax=False, png=target, out=io.StringIO())
    assert target.read_bytes() == b"my own picture" and list(own_tmp.iterdir()) == []
    run_demo(
        size=32,
        patch=8,
        num_patches=8,
        use_jax=False,
        png=target,
        overwrite_png=True,
        out=io.StringIO(),
    )
    assert target.read_bytes().startswith(PNG_SIGNATURE)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"backend": "tiff"}, "backend='tiff'"),
        ({"size": 4}, "size=4"),
        ({"size": 16, "patch": 32}, "patch=32 must be at most size=16"),
        ({"patch": 0}, "patch=0"),
        ({"batch_size": 0}, "batch_size=0"),
        ({"num_patches": 0}, "num_patches=0"),
        ({"num_patches": 2.5}, "num_patches=2.5"),
        ({"cache_mib": -1}, "cache_mib=-1"),
    ],
)
def test_run_demo_rejects_bad_arguments(own_tmp, options, message):
    with pytest.raises(ValueError, match=message):
        run_demo(use_jax=False, out=io.StringIO(), **options)
    assert list(own_tmp.iterdir()) == []  # nothing was written


def test_run_demo_rejects_a_seed_that_is_not_an_int():
    with pytest.raises(TypeError, match="seed='1'"):
        run_demo(seed="1", use_jax=False, out=io.StringIO())


# -- the command line, in process ---------------------------------------------------------
def test_cli_demo_in_process(own_tmp, capsys):
    assert main(["demo", *SMALL, "--no-jax", "--seed", "-5"]) == 0
    text = capsys.readouterr().out
    rows = table(text)
    check_row(rows["random"], 40)
    check_row(rows["grid"], 6**3)
    png = Path.cwd() / DEFAULT_PNG
    assert f"picture of the patch locations: {png}" in text
    assert png.read_bytes().startswith(PNG_SIGNATURE)
    assert not demo_folder(text).exists() and list(own_tmp.iterdir()) == []


def test_cli_picks_a_new_name_instead_of_replacing_a_png(own_tmp, capsys):
    mine = Path.cwd() / DEFAULT_PNG
    mine.write_bytes(b"my own picture")
    assert main(["demo", *SMALL, "--no-jax"]) == 0
    text = capsys.readouterr().out
    assert mine.read_bytes() == b"my own picture"
    assert f"{DEFAULT_PNG} exists and is left alone: the picture goes to mixle-demo-2.png" in text
    assert (Path.cwd() / "mixle-demo-2.png").read_bytes().startswith(PNG_SIGNATURE)
    # named explicitly, it is replaced
    assert main(["demo", *SMALL, "--no-jax", "--png", DEFAULT_PNG]) == 0
    assert mine.read_bytes().startswith(PNG_SIGNATURE)
    assert "exists" not in capsys.readouterr().out


def test_cli_no_png_draws_nothing(own_tmp, capsys):
    assert main(["demo", *SMALL, "--no-jax", "--no-png"]) == 0
    assert "picture" not in capsys.readouterr().out
    assert list(Path.cwd().iterdir()) == []


def test_cli_without_matplotlib_or_jax_says_what_to_install(own_tmp, capsys, monkeypatch):
    import mixle.cli._demo_options as options

    monkeypatch.setattr(options, "HAS_MATPLOTLIB", False)
    monkeypatch.setattr(demo_module, "HAS_MATPLOTLIB", False)
    monkeypatch.setattr(demo_module, "HAS_JAX", False)
    assert main(["demo", *SMALL]) == 0
    text = capsys.readouterr().out
    assert 'no picture: pip install -e ".[plot]" for one' in text
    assert 'jax: not installed (pip install -e ".[jax]")' in text
    assert list(Path.cwd().iterdir()) == []
    with pytest.raises(SystemExit) as info:
        main(["demo", *SMALL, "--png", "p.png"])
    assert info.value.code == 2 and "--png=p.png: the picture needs matplotlib" in (
        capsys.readouterr().err
    )
    with pytest.raises(ImportError, match=r'pip install -e "\.\[plot\]"'):
        run_demo(size=32, png="p.png", out=io.StringIO())
    with pytest.raises(ImportError, match=r'pip install -e "\.\[jax\]"'):
        run_demo(size=32, use_jax=True, out=io.StringIO())


def test_cli_keep_prints_the_kept_folder(own_tmp, capsys):
    assert main(["demo", *SMALL, "--no-jax", "--no-png", "--keep"]) == 0
    text = capsys.readouterr().out
    folder = demo_folder(text)
    assert f"kept {folder}" in text and (folder / "volume.zarr").is_dir()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--size", "16", "--patch", "32"], "--patch=32 must be at most --size=16"),
        (["--size", "4"], "--size=4 must be >= 8"),
        (["--size", "big"], "argument --size: invalid int value: 'big'"),
        (["--patch", "0"], "--patch=0 must be >= 1"),
        (["--batch-size", "0"], "--batch-size=0 must be >= 1"),
        (["--num-patches", "-3"], "--num-patches=-3 must be >= 1"),
        (["--cache-mib", "-1"], "--cache-mib=-1 must be >= 0"),
        (["--seed", "x"], "argument --seed: invalid int value: 'x'"),
        (["--backend", "tiff"], "argument --backend: invalid choice: 'tiff'"),
        (["--png", "picture.jpg"], "--png=picture.jpg must end in .png"),
        (["--png", "no/such/dir/p.png"], "--png=no/such/dir/p.png: the directory no/such/dir"),
        (["--png", "a.png", "--no-png"], "argument --no-png: not allowed with argument --png"),
        (["--size", str(2**20)], "--size=1048576 writes up to"),
    ],
)
def test_cli_rejects_bad_options(own_tmp, capsys, argv, message):
    with pytest.raises(SystemExit) as info:
        main(["demo", *argv])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "usage: mixle demo" in err and "mixle demo: error:" in err
    assert list(own_tmp.iterdir()) == [] and list(Path.cwd().iterdir()) == []


def test_cli_refuses_a_directory_as_png(own_tmp, capsys):
    Path("folder.png").mkdir()
    with pytest.raises(SystemExit) as info:
        main(["demo", "--png", "folder.png"])
    assert info.value.code == 2 and "--png=folder.png is a directory" in capsys.readouterr().err


# -- the command line, in child processes ---------------------------------------------------
def child_env(temp: Path) -> dict[str, str]:
    env = dict(os.environ, TMPDIR=str(temp), MIXLE_PROGRESS="0")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def test_console_script_is_declared():
    (script,) = importlib.metadata.entry_points(group="console_scripts", name="mixle")
    assert script.load() is main


def test_console_script_runs_the_jax_row(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "mixle.cli", "demo", *SMALL, "--no-png"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        cwd=tmp_path,
        env=child_env(tmp_path),
    )
    assert out.returncode == 0, out.stderr
    rows = table(out.stdout)
    assert list(rows) == ["random", "grid", "jax"]
    check_row(rows["jax"], 40)
    assert "device batches/s on cpu" in out.stdout and "mean patch intensity" in out.stdout
    assert "with the JAX runtime loaded" in out.stdout
    assert list(tmp_path.iterdir()) == []


def test_closed_stdout_pipe_ends_quietly(tmp_path):
    with subprocess.Popen(
        [sys.executable, "-m", "mixle.cli", "demo", *SMALL, "--no-jax", "--no-png"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=tmp_path,
        env=child_env(tmp_path),
    ) as child:
        assert child.stdout is not None and child.stderr is not None
        first = child.stdout.readline()
        child.stdout.close()  # like `mixle demo | head -1`
        err = child.stderr.read().decode()
        assert child.wait(timeout=TIMEOUT_S) == 0, err
    assert first.startswith(b"writing a 48^3")
    assert "Traceback" not in err and "BrokenPipe" not in err
    assert list(tmp_path.iterdir()) == []  # the temporary folder is gone


#: A child running ``mixle`` with Python's SIGINT handler set explicitly: started from a
#: background pytest (``nohup python3 -m pytest ... &``) it would inherit SIGINT ignored.
WITH_CTRL_C = (
    "import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "from mixle.cli import main; raise SystemExit(main(sys.argv[1:]))"
)


def test_ctrl_c_cleans_up(tmp_path):
    with subprocess.Popen(
        [sys.executable, "-c", WITH_CTRL_C, "demo", "--size", "256", "--no-jax", "--no-png"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=tmp_path,
        env=child_env(tmp_path),
    ) as child:
        assert child.stdout is not None
        child.stdout.readline()  # the volume is being written now
        child.send_signal(signal.SIGINT)
        _, err = child.communicate(timeout=TIMEOUT_S)
    assert child.returncode == 130 and "mixle demo: interrupted" in err.decode()
    assert "Traceback" not in err.decode()
    assert list(tmp_path.iterdir()) == []


def test_sigterm_cleans_up(tmp_path):
    # many patches: the run is still going when the signal arrives, whatever the machine
    argv = ["demo", "--size", "128", "--num-patches", "200000", "--no-jax", "--no-png"]
    with subprocess.Popen(
        [sys.executable, "-m", "mixle.cli", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=tmp_path,
        env=child_env(tmp_path),
    ) as child:
        assert child.stdout is not None
        for line in child.stdout:
            if line.startswith(b"reading with"):  # written; reading patches now
                break
        child.send_signal(signal.SIGTERM)
        _, err = child.communicate(timeout=TIMEOUT_S)
    assert child.returncode == 128 + signal.SIGTERM, err.decode()
    assert "mixle demo: terminated" in err.decode() and "Traceback" not in err.decode()
    assert list(tmp_path.iterdir()) == []
