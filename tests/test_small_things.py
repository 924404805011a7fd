"""Small things users reach for: ``--version``, ``python -m mixle``, the demo picture in
``.gitignore``, label-sampler errors that name the fix, and what a sampler's pickle holds."""

from __future__ import annotations

import importlib.metadata
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import mixle
from mixle import PatchSampler
from mixle.cli import main
from mixle.cli.demo import DEFAULT_PNG

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 120
#: "A few KB": what a sampler over file-backed sources may pickle to (path, options, totals).
BY_REFERENCE_BYTES = 8 * 1024


def _child(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, MIXLE_PROGRESS="0")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=TIMEOUT_S, cwd=cwd, env=env
    )


# -- the version and the command line ---------------------------------------------------------
def test_the_package_version_is_the_distribution_version() -> None:
    assert mixle.__version__ == importlib.metadata.version("mixle")


def test_version_prints_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"mixle {mixle.__version__}"


def test_python_dash_m_mixle_runs_the_command_line(tmp_path: Path) -> None:
    version = _child(["-m", "mixle", "--version"], tmp_path)
    assert version.returncode == 0, version.stderr
    assert version.stdout.strip() == f"mixle {importlib.metadata.version('mixle')}"
    helped = _child(["-m", "mixle", "--help"], tmp_path)
    assert helped.returncode == 0, helped.stderr
    assert helped.stdout.startswith("usage: mixle ")
    for command in ("demo", "inspect", "--version"):
        assert command in helped.stdout
    assert _child(["-m", "mixle.cli", "--version"], tmp_path).stdout == version.stdout


def test_python_dash_m_mixle_without_a_command_fails_like_the_script(tmp_path: Path) -> None:
    out = _child(["-m", "mixle"], tmp_path)
    assert out.returncode == 2 and "usage: mixle " in out.stderr
    assert not list(tmp_path.iterdir())  # wrote nothing into the current folder


def test_gitignore_ignores_the_demo_picture() -> None:
    lines = (ROOT / ".gitignore").read_text().splitlines()
    assert DEFAULT_PNG == "mixle-demo.png" and DEFAULT_PNG in lines


# -- label and weight samplers: errors that say what to change -------------------------------
def _border_labels() -> np.ndarray:
    lab = np.zeros((12, 12), dtype=np.int8)
    lab[0, 5] = lab[11, :] = 1  # class 1 only on the border
    return lab


def test_a_class_only_on_the_border_suggests_padding() -> None:
    # Regression: the error said no voxel had the label and told users to pick classes that
    # are present, though class 1 is present; only padding='none' keeps it from the centre.
    vol = np.zeros((12, 12))
    with pytest.raises(
        ValueError, match=r"class 1: the labels have it \(e\.g\. at \(0, 5\)\)"
    ) as info:
        PatchSampler(vol, 4, 8, labels=_border_labels(), label_probabilities={0: 0.5, 1: 0.5})
    message = str(info.value)
    assert "padding='constant'" in message and "smaller patch_size" in message
    assert "choose classes present" not in message
    padded = PatchSampler(
        vol, 4, 200, seed=1, labels=_border_labels(), label_probabilities={0: 0.5, 1: 0.5},
        padding="constant",
    )  # fmt: skip
    centres = padded.coords_array() + 2
    assert 1 in _border_labels()[tuple(centres.T)]


def test_a_class_that_is_absent_still_says_so() -> None:
    vol, lab = np.zeros((12, 12)), np.zeros((12, 12), dtype=np.int8)
    with pytest.raises(ValueError, match="choose classes present in the labels") as info:
        PatchSampler(vol, 4, 8, labels=lab, label_probabilities={0: 0.5, 1: 0.5})
    assert "padding=" not in str(info.value)


def test_weights_only_on_the_border_suggest_padding() -> None:
    w = np.zeros((12, 12))
    w[:, 11] = 1.0
    with pytest.raises(ValueError, match=r"positive weights \(e\.g\. at \(0, 11\)\)") as info:
        PatchSampler(np.zeros((12, 12)), 4, 8, weights=w)
    assert "padding='constant'" in str(info.value)
    with pytest.raises(ValueError, match="give some voxel a positive weight") as info:
        PatchSampler(np.zeros((12, 12)), 4, 8, weights=np.zeros((12, 12)))
    assert "padding=" not in str(info.value)


def test_label_probabilities_are_normalised_not_rejected() -> None:
    lab = np.zeros((12, 12), dtype=np.int8)
    lab[4:8, 4:8] = 1
    vol = np.zeros((12, 12))
    relative = PatchSampler(vol, 4, 50, seed=2, labels=lab, label_probabilities={0: 1, 1: 3})
    exact = PatchSampler(vol, 4, 50, seed=2, labels=lab, label_probabilities={0: 0.25, 1: 0.75})
    assert relative.weighted is not None
    assert relative.weighted.label_probabilities == {0: 0.25, 1: 0.75}
    np.testing.assert_array_equal(relative.coords_array(), exact.coords_array())
    for bad in ({0: -1.0, 1: 2.0}, {0: 0.0, 1: 0.0}, {0: float("nan"), 1: 1.0}):
        with pytest.raises(ValueError, match="label_probabilities"):
            PatchSampler(vol, 4, 8, labels=lab, label_probabilities=bad)


# -- what a sampler's pickle holds ------------------------------------------------------------
def test_a_file_backed_map_pickles_by_reference_an_ndarray_map_by_value(tmp_path: Path) -> None:
    lab = np.zeros((64, 64, 64), dtype=np.uint8)
    lab[20:40, 20:40, 20:40] = 1
    np.save(tmp_path / "labels.npy", lab)
    np.save(tmp_path / "volume.npy", lab.astype(np.float32))
    probs = {0: 0.5, 1: 0.5}
    with mixle.read_npy(tmp_path / "volume.npy") as vol:
        on_disk = PatchSampler(
            vol, 8, 100, seed=4, labels=mixle.read_npy(tmp_path / "labels.npy"),
            label_probabilities=probs,
        )  # fmt: skip
        in_memory = PatchSampler(vol, 8, 100, seed=4, labels=lab, label_probabilities=probs)
        small, big = pickle.dumps(on_disk), pickle.dumps(in_memory)
    assert len(small) < BY_REFERENCE_BYTES < lab.nbytes < len(big)
    for blob in (small, big):
        np.testing.assert_array_equal(pickle.loads(blob).coords_array(), on_disk.coords_array())
