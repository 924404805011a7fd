"""Progress bars: the facade, its settings, and every long operation that shows one."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
import tqdm
from _encoded_helpers import shard_sum

import mixle
from mixle.data.sampling import stitch as stitch_module
from mixle.data.sampling import weight_index as weighted
from mixle.data.sources.records.text import row_scan
from mixle.utils import progress
from mixle.utils.parallel.multiprocessing import MPEncodedData
from mixle.utils.progress import PROGRESS_DELAY_S, progress_bar, progress_setting

#: Hang guard for encoded-data builds; no test relies on it for timing.
T = 60


@pytest.fixture(autouse=True)
def _default_settings(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    """Each test starts automatic (no override, no environment) with its own index cache."""
    monkeypatch.delenv("MIXLE_PROGRESS", raising=False)
    monkeypatch.setenv("MIXLE_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
    mixle.set_progress(None)
    yield
    mixle.set_progress(None)


def _final(err: str, desc: str) -> tuple[str, str]:
    """The last ``n/total`` the bar called ``desc`` printed to ``err``."""
    lines = [line for line in re.split(r"[\r\n]", err) if line.startswith(f"{desc}:")]
    assert lines, f"no bar {desc!r} in {err!r}"
    found = re.search(r"(\S+)/(\S+) \[", lines[-1])
    assert found, lines[-1]
    return found.group(1), found.group(2)


def _csv(path: Path, rows: int = 40, bom: bool = False) -> Path:
    text = "a,b,c\n" + "".join(f'{i},"x{i}\ny",{i / 4}\n' for i in range(rows))
    path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + text.encode())
    return path


# -- the facade ---------------------------------------------------------------------------
def test_forced_bar_writes_total_and_count_to_stderr(capsys: pytest.CaptureFixture) -> None:
    with progress_bar(total=7, desc="copying", unit="slab", enabled=True) as bar:
        assert bar.shown
        for _ in range(3):
            bar.update(2)
        bar.update(1)
    err = capsys.readouterr().err
    assert _final(err, "copying") == ("7", "7") and "slab" in err


def test_unknown_total_and_disabled_bars(capsys: pytest.CaptureFixture) -> None:
    with progress_bar(total=None, desc="scanning", unit="file", enabled=True) as bar:
        bar.update(5)
    assert re.search(r"scanning: 5file", capsys.readouterr().err)
    with progress_bar(total=3, desc="quiet", enabled=False) as bar:
        assert not bar.shown
        bar.update(3)
        bar.close()
    assert capsys.readouterr().err == ""


def test_automatic_bar_prints_nothing_when_stderr_is_not_a_terminal(
    capsys: pytest.CaptureFixture,
) -> None:
    assert not sys.stderr.isatty()
    with progress_bar(total=2, desc="auto") as bar:
        bar.update(2)
    assert capsys.readouterr().err == ""


class _Recorder:
    """Stands in for ``tqdm.tqdm``: keeps the options of each bar and its updates."""

    made: ClassVar[list[dict[str, Any]]] = []

    def __init__(self, **options: Any) -> None:
        self.options = options
        self.n = 0
        _Recorder.made.append(options)

    def update(self, n: int) -> None:
        self.n += n

    def close(self) -> None:
        pass


def test_automatic_mode_means_terminals_only_after_a_delay(monkeypatch) -> None:
    _Recorder.made = []
    monkeypatch.setattr(tqdm, "tqdm", _Recorder)
    with progress_bar(total=1, desc="auto", unit="B"):
        pass
    with progress_bar(total=1, desc="forced", enabled=True):
        pass
    auto, forced = _Recorder.made
    # tqdm's disable=None: shown only when the file is a terminal; delay: only slow calls
    assert auto["disable"] is None and auto["delay"] == PROGRESS_DELAY_S > 0
    assert auto["file"] is sys.stderr and auto["unit_scale"] and auto["unit_divisor"] == 1024
    assert forced["disable"] is False and forced["delay"] == 0


def test_updates_from_many_threads_all_count(capsys: pytest.CaptureFixture) -> None:
    with progress_bar(total=800, desc="threads", enabled=True) as bar:
        workers = [
            threading.Thread(target=lambda: [bar.update(1) for _ in range(100)]) for _ in range(8)
        ]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    assert _final(capsys.readouterr().err, "threads") == ("800", "800")


class _Broken:
    """A bar whose every method fails, as one writing to a closed stream would."""

    def __init__(self, **options: Any) -> None:
        pass

    def update(self, n: int) -> None:
        raise OSError("stderr is closed")

    def close(self) -> None:
        raise OSError("stderr is closed")


class _Unbuildable:
    def __init__(self, **options: Any) -> None:
        raise RuntimeError("no terminal")


@pytest.mark.parametrize("fake", [_Broken, _Unbuildable])
def test_a_failing_bar_never_changes_results(tmp_path: Path, monkeypatch, fake) -> None:
    path = _csv(tmp_path / "rows.csv")
    want = mixle.read_csv(path, progress=False).get_batch(np.arange(40))
    monkeypatch.setenv("MIXLE_CACHE_DIR", str(tmp_path / "other-cache"))
    monkeypatch.setattr(tqdm, "tqdm", fake)
    src = mixle.read_csv(path, progress=True)
    got = src.get_batch(np.arange(40))
    assert src.row_index_origin == "built"
    assert all(np.array_equal(got[k], want[k]) for k in want)


# -- settings and their precedence ---------------------------------------------------------
@pytest.mark.parametrize(
    ("argument", "override", "env", "want"),
    [
        (None, None, None, None),  # automatic
        (None, None, "1", True),
        (None, None, "0", False),
        (None, None, "auto", None),
        (None, None, "", None),
        (None, False, "1", False),  # set_progress beats the environment
        (None, True, "0", True),
        (False, True, "1", False),  # the argument beats both
        (True, False, "0", True),
        (True, None, None, True),
    ],
)
def test_argument_beats_set_progress_beats_environment(
    monkeypatch, argument, override, env, want
) -> None:
    if env is not None:
        monkeypatch.setenv("MIXLE_PROGRESS", env)
    mixle.set_progress(override)
    assert progress_setting(argument) is want


def test_set_progress_and_environment_reach_the_operations(
    tmp_path: Path, monkeypatch, capsys: pytest.CaptureFixture
) -> None:
    path = _csv(tmp_path / "rows.csv")
    monkeypatch.setenv("MIXLE_PROGRESS", "1")
    assert len(mixle.read_csv(path)) == 40
    assert _final(capsys.readouterr().err, "indexing rows.csv")[0] == str(path.stat().st_size)
    monkeypatch.setenv("MIXLE_CACHE_DIR", str(tmp_path / "cache-2"))
    mixle.set_progress(False)
    assert len(mixle.read_csv(path)) == 40
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("MIXLE_CACHE_DIR", str(tmp_path / "cache-3"))
    assert len(mixle.read_csv(path, progress=True)) == 40
    assert "indexing rows.csv" in capsys.readouterr().err


def test_bad_settings_name_the_argument_and_value(tmp_path: Path, monkeypatch) -> None:
    with (
        pytest.raises(TypeError, match=r"enabled='yes' must be True .*False .*None"),
        progress_bar(total=1, enabled="yes"),  # type: ignore[arg-type]
    ):
        pass
    with pytest.raises(TypeError, match=r"enabled='on' must be True"):
        mixle.set_progress("on")  # type: ignore[arg-type]
    path = _csv(tmp_path / "rows.csv")
    with pytest.raises(TypeError, match=r"progress='yes' must be True"):
        mixle.read_csv(path, progress="yes")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"progress=1 must be True"):
        mixle.read_jsonl(tmp_path / "rows.csv", progress=1)  # type: ignore[arg-type]
    vol = np.zeros((8, 8), dtype=np.float32)
    with pytest.raises(TypeError, match=r"progress='yes' must be True"):
        mixle.PatchSampler(vol, 4, 2, weights=vol + 1, progress="yes")
    with pytest.raises(TypeError, match=r"progress='yes' must be True"):
        mixle.GridAggregator(mixle.GridSampler(vol, 4), progress="yes")
    with pytest.raises(TypeError, match=r"progress='yes' must be True"):
        MPEncodedData([1.0, 2.0], num_workers=1, progress="yes", timeout=T)
    monkeypatch.setenv("MIXLE_PROGRESS", "maybe")
    with pytest.raises(ValueError, match=r"MIXLE_PROGRESS='maybe' is not a progress setting"):
        len(mixle.read_csv(path))
    assert mixle.read_csv(path, progress=False).get_batch([0])["a"].tolist() == [0]


# -- the wired operations ------------------------------------------------------------------
@pytest.mark.parametrize("bom", [False, True])
def test_row_index_bar_counts_every_byte_of_the_file(
    tmp_path: Path, monkeypatch, capsys: pytest.CaptureFixture, bom: bool
) -> None:
    path = _csv(tmp_path / "rows.csv", bom=bom)
    size = path.stat().st_size
    assert size < 1000  # shown unscaled, so the text holds the exact count
    monkeypatch.setattr(row_scan, "INDEX_BLOCK_BYTES", 64)  # many coarse steps
    quiet = mixle.read_csv(path, progress=False)
    want = quiet.get_batch(np.arange(len(quiet)))
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("MIXLE_CACHE_DIR", str(tmp_path / "cache-2"))
    src = mixle.read_csv(path, progress=True)
    got = src.get_batch(np.arange(len(src)))
    assert src.row_index_origin == "built"
    assert _final(capsys.readouterr().err, "indexing rows.csv") == (str(size), str(size))
    assert all(np.array_equal(got[k], want[k]) for k in want)
    again = mixle.read_csv(path, progress=True)  # cached: nothing to build, no bar
    assert len(again) == 40 and again.row_index_origin == "cached"
    assert capsys.readouterr().err == ""


def test_jsonl_row_index_bar(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps({"v": i}) + "\n" for i in range(30)))
    src = mixle.read_jsonl(path, progress=True)
    assert src.get_batch([0, 29])["v"].tolist() == [0, 29]
    size = str(path.stat().st_size)
    assert _final(capsys.readouterr().err, "indexing rows.jsonl") == (size, size)


def test_automatic_operations_print_nothing_off_a_terminal(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    assert len(mixle.read_csv(_csv(tmp_path / "rows.csv"))) == 40
    vol = np.arange(64.0).reshape(8, 8)
    mixle.PatchSampler(vol, 2, 4, weights=vol)
    mixle.stitch(mixle.GridSampler(vol, 4), lambda t: t)
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("kind", ["weights", "labels"])
def test_weighted_index_bar_counts_blocks(
    monkeypatch, capsys: pytest.CaptureFixture, kind: str
) -> None:
    monkeypatch.setattr(weighted, "INDEX_BLOCK_VOXELS", 64)
    rng = np.random.default_rng(0)
    vol = rng.random((16, 12, 10)).astype(np.float32)
    if kind == "weights":
        options: dict[str, Any] = {"weights": vol}
    else:
        options = {"labels": (vol > 0.5).astype(np.uint8), "label_probabilities": {0: 1, 1: 1}}
    block = weighted.index_block_shape(vol.shape, None)
    blocks = math.prod(-(-d // b) for d, b in zip(vol.shape, block))
    assert blocks > 1
    quiet = mixle.PatchSampler(vol, 4, 20, seed=3, progress=False, **options)
    assert capsys.readouterr().err == ""
    shown = mixle.PatchSampler(vol, 4, 20, seed=3, progress=True, **options)
    assert _final(capsys.readouterr().err, f"indexing {kind}") == (str(blocks), str(blocks))
    assert np.array_equal(shown.coords_array(), quiet.coords_array())


def test_stitch_bars_count_tiles_and_slabs(monkeypatch, capsys: pytest.CaptureFixture) -> None:
    vol = np.arange(12 * 10 * 8, dtype=np.float32).reshape(12, 10, 8)
    grid = mixle.GridSampler(vol, (4, 4, 4), overlap=1)
    plane = 10 * 8 * 8  # bytes of one float64 plane of the accumulator
    monkeypatch.setattr(stitch_module, "RESULT_BLOCK_BYTES", 5 * plane)  # slabs of 5 planes
    quiet = mixle.stitch(grid, lambda t: t * 2, progress=False)
    assert capsys.readouterr().err == ""
    out = np.zeros(vol.shape, dtype=np.float32)
    got = mixle.stitch(grid, lambda t: t * 2, out=out, progress=True)
    err = capsys.readouterr().err
    assert got is out and np.array_equal(got, quiet) and np.array_equal(quiet, vol * 2)
    assert _final(err, "stitching tiles") == (str(len(grid)), str(len(grid)))
    assert _final(err, "writing volume") == ("3", "3")  # 12 planes in slabs of 5


def test_grid_aggregator_bar_on_result(capsys: pytest.CaptureFixture) -> None:
    vol = np.ones((6, 6), dtype=np.float32)
    grid = mixle.GridSampler(vol, 3)
    agg = mixle.GridAggregator(grid, progress=True)
    agg.add(*grid.get_batch(np.arange(len(grid))))
    assert capsys.readouterr().err == ""  # adding tiles shows nothing; writing does
    assert np.array_equal(agg.result(), vol)
    assert _final(capsys.readouterr().err, "writing volume") == ("1", "1")


@pytest.mark.parametrize("read_in", ["workers", "driver"])
def test_mpencoded_bar_counts_shards(capsys: pytest.CaptureFixture, read_in: str) -> None:
    data = [np.full(3, i, dtype=np.float64) for i in range(9)]
    with MPEncodedData(data, num_workers=3, read_in=read_in, timeout=T, progress=True) as enc:
        sums = enc.map(shard_sum)
    err = capsys.readouterr().err
    assert _final(err, "building shards") == ("3", "3")
    if read_in == "driver":
        assert _final(err, "reading shards") == ("3", "3")
    else:
        assert "reading shards" not in err
    with MPEncodedData(data, num_workers=3, read_in=read_in, timeout=T, progress=False) as enc:
        assert enc.map(shard_sum) == sums
    assert capsys.readouterr().err == ""


def test_dask_encoded_bar_counts_shards(capsys: pytest.CaptureFixture) -> None:
    distributed = pytest.importorskip("distributed", reason="needs mixle[dask]")
    from mixle.utils.parallel.dask_backend import QUIET_SCHEDULER, DaskEncodedData

    cluster = distributed.LocalCluster(
        n_workers=2,
        threads_per_worker=1,
        processes=False,
        dashboard_address=None,
        scheduler_kwargs=QUIET_SCHEDULER,
    )
    client = distributed.Client(cluster, set_as_default=False)
    try:
        data = [np.full(2, i, dtype=np.float64) for i in range(6)]
        capsys.readouterr()
        with DaskEncodedData(
            data, client=client, num_workers=2, read_in="driver", timeout=T, progress=True
        ) as enc:
            sums = enc.map(shard_sum)
        err = capsys.readouterr().err
        assert _final(err, "reading shards") == ("2", "2")
        assert _final(err, "building shards") == ("2", "2")
        with DaskEncodedData(data, client=client, num_workers=2, timeout=T) as enc:
            assert enc.map(shard_sum) == sums
    finally:
        client.close()
        cluster.close()


_WORKERS = textwrap.dedent(
    """
    import multiprocessing, sys
    import mixle
    from mixle.utils.progress import progress_bar

    def work(path):
        with progress_bar(total=1, desc="worker bar", enabled=True) as bar:
            bar.update(1)
        mixle.set_progress(True)
        assert len(mixle.read_csv(path, progress=True)) == 40  # builds its index here

    if __name__ == "__main__":
        with progress_bar(total=1, desc="main bar") as bar:  # MIXLE_PROGRESS=1
            bar.update(1)
        child = multiprocessing.get_context(sys.argv[2]).Process(target=work, args=(sys.argv[1],))
        child.start()
        child.join()
        sys.exit(child.exitcode)
    """
)


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_worker_processes_never_draw_bars(tmp_path: Path, start_method: str) -> None:
    script = tmp_path / "workers.py"
    script.write_text(_WORKERS)
    path = _csv(tmp_path / "rows.csv")
    env = {**os.environ, "MIXLE_PROGRESS": "1", "MIXLE_CACHE_DIR": str(tmp_path / "cache")}
    done = subprocess.run(
        [sys.executable, str(script), str(path), start_method],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=True,
    )
    assert _final(done.stderr, "main bar") == ("1", "1")
    assert "worker bar" not in done.stderr and "indexing" not in done.stderr
    assert (tmp_path / "cache").exists()  # the worker did build the index, silently


# -- without tqdm --------------------------------------------------------------------------
_NO_TQDM = textwrap.dedent(
    """
    import json, sys
    sys.modules["tqdm"] = None  # as if tqdm were not installed
    import numpy as np
    import mixle
    assert "tqdm" not in sys.modules or sys.modules["tqdm"] is None
    from mixle.utils.progress import progress_bar
    with progress_bar(total=3, desc="nothing", enabled=True) as bar:
        bar.update(3)
    src = mixle.read_csv(sys.argv[1], progress=True)
    vol = np.arange(64.0).reshape(8, 8)
    sampler = mixle.PatchSampler(vol, 2, 5, seed=1, weights=vol, progress=True)
    stitched = mixle.stitch(mixle.GridSampler(vol, 3), lambda t: t + 1, progress=True)
    print(json.dumps({
        "shown": bar.shown,
        "c": src.get_batch(np.arange(len(src)))["c"].tolist(),
        "corners": sampler.coords_array().tolist(),
        "stitched": stitched.tolist(),
    }))
    """
)


def test_without_tqdm_bars_are_silent_and_results_identical(tmp_path: Path) -> None:
    path = _csv(tmp_path / "rows.csv")
    env = {**os.environ, "MIXLE_CACHE_DIR": str(tmp_path / "child-cache")}
    done = subprocess.run(
        [sys.executable, "-c", _NO_TQDM, str(path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=True,
    )
    assert done.stderr == ""
    child = json.loads(done.stdout)
    vol = np.arange(64.0).reshape(8, 8)
    assert child["shown"] is False
    assert child["c"] == mixle.read_csv(path).get_batch(np.arange(40))["c"].tolist()
    sampler = mixle.PatchSampler(vol, 2, 5, seed=1, weights=vol)
    assert child["corners"] == sampler.coords_array().tolist()
    stitched = mixle.stitch(mixle.GridSampler(vol, 3), lambda t: t + 1)
    assert child["stitched"] == stitched.tolist()


def test_import_mixle_does_not_import_tqdm() -> None:
    code = "import sys, mixle; mixle.set_progress(True); print('tqdm' in sys.modules)"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip() == "False"
    assert progress.PROGRESS_ENV == "MIXLE_PROGRESS"
