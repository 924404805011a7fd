"""The docs notebook: its two paired files agree, and it runs end to end in a kernel.

The kernel is a separate process (JAX may start there), launched from a kernel spec
written into a temporary folder that points at this interpreter, so the test works in any
virtual environment without ``ipykernel install``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "docs" / "notebook.ipynb"
SCRIPT = ROOT / "docs" / "notebook.py"
CELL_TIMEOUT_S = 240
KERNEL = "mixle-notebook-test"


def cells(notebook: Any) -> list[tuple[str, str]]:
    return [(cell.cell_type, cell.source) for cell in notebook.cells]


def test_ipynb_and_py_hold_the_same_cells():
    import jupytext

    script = jupytext.read(SCRIPT)
    notebook = jupytext.read(NOTEBOOK)
    assert cells(script) == cells(notebook), (
        "docs/notebook.ipynb and docs/notebook.py differ: run "
        "`jupytext --sync docs/notebook.py` after editing either"
    )
    assert len(script.cells) > 10
    assert notebook.metadata["jupytext"]["formats"] == "ipynb,py:percent"


def test_committed_notebook_has_no_outputs():
    raw = json.loads(NOTEBOOK.read_text())
    code = [cell for cell in raw["cells"] if cell["cell_type"] == "code"]
    assert code and all(cell["outputs"] == [] for cell in code)
    assert all(cell["execution_count"] is None for cell in code)


def text_of(cell: Any) -> str:
    parts = []
    for output in cell.outputs:
        if output.output_type == "stream" and output.name == "stdout":
            parts.append(output.text)
        elif output.output_type in ("execute_result", "display_data"):
            parts.append(output.data.get("text/plain", ""))
    return "".join(parts)


@pytest.fixture
def kernel_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A kernel spec for this interpreter (found through ``$JUPYTER_PATH``), and the
    environment the kernel inherits (its temporary folder is ``temp/`` in here)."""
    spec = tmp_path / "kernels" / KERNEL
    spec.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    kernel = {"argv": argv, "display_name": "mixle test", "language": "python"}
    (spec / "kernel.json").write_text(json.dumps(kernel))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path))  # jupyter_client finds kernels/ here
    monkeypatch.setenv("JUPYTER_PLATFORM_DIRS", "1")  # jupyter_core's own default to come
    monkeypatch.setenv("MIXLE_PROGRESS", "0")
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    )
    monkeypatch.delenv("MPLBACKEND", raising=False)  # the kernel picks its inline backend
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))  # the kernel's tempfile.mkdtemp() lands here
    work = tmp_path / "work"
    work.mkdir()
    return tmp_path


def test_notebook_runs_end_to_end(kernel_env: Path):
    import nbformat
    from nbclient import NotebookClient

    notebook = nbformat.read(NOTEBOOK, as_version=4)
    work = kernel_env / "work"
    client = NotebookClient(
        notebook,
        kernel_name=KERNEL,
        timeout=CELL_TIMEOUT_S,
        resources={"metadata": {"path": str(work)}},
    )
    client.execute()  # raises CellExecutionError, with the cell and traceback, on failure

    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert all(cell.execution_count is not None for cell in code)
    errors = [o for cell in code for o in cell.outputs if o.output_type == "error"]
    assert errors == []
    printed = [text_of(cell) for cell in code]
    everything = "\n".join(printed)
    assert "shape (96, 128, 128) dtype int16 chunks (32, 32, 32)" in everything
    assert "a 32³ patch touches" in everything
    assert "patch (32, 32, 32) int16" in everything
    assert "batch (16, 32, 32, 32) int16 corners (16, 3) int64" in everything
    assert "of 200 patches are centred on a lesion" in everything
    assert "batch shape (16, 32, 32, 32) int16 ArrayImpl" in printed[-2]
    assert "mean patch intensity" in printed[-2]
    pictures = [
        cell for cell in code if any("image/png" in getattr(o, "data", {}) for o in cell.outputs)
    ]
    assert len(pictures) == 3  # footprints, sampling density, chunk grid
    assert list(work.iterdir()) == []  # nothing written to the working directory
    # and its temporary folder (the zarr store) is gone
    assert list((kernel_env / "temp").glob("mixle-notebook-*")) == []
