"""Peak RSS growth of every decompression bomb the tests refuse, as their own children see it.

Run: python benchmarks/decode_bombs.py

Runs the bomb cases of ``tests/test_decode_bombs.py`` and ``tests/test_zarr_decode_bounds.py``
(zarr chunks of 128-640 MiB in 512 KiB chunks, vlen chunks past the vlen cap) and of
``tests/test_hdf5_plugin_sizes.py`` / ``test_hdf5_plugin_frames.py`` (64 MiB HDF5 plugin
bombs), each read in a fresh child process whose peak RSS (VmHWM, reset before each read)
is measured, and prints one row per bomb: the error raised and the growth. The tests assert
the same cases stay under their limits; this prints the numbers.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


class _Temp:
    """Enough of pytest's ``tmp_path_factory`` for the tests' module fixtures."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def mktemp(self, name: str) -> Path:
        path = Path(tempfile.mkdtemp(prefix=name, dir=self.root))
        return path


def _fixture(function: Any) -> Any:
    """The plain function behind a pytest fixture."""
    return getattr(function, "_get_wrapped_function", lambda: function.__wrapped__)()


def main() -> None:
    import test_decode_bombs
    import test_hdf5_plugin_frames
    import test_hdf5_plugin_sizes
    import test_zarr_decode_bounds
    from _hdf5_plugin_child import run_plugin_child

    rows: list[tuple[str, str, str, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        temp = _Temp(Path(tmp))
        for name, got in _fixture(test_decode_bombs.bomb_reads)(temp).items():
            got = got[0] if isinstance(got, tuple) else got
            rows.append(("zarr", name, str(got["error"]), got["growth"] / 2**20))
        for name, (got, *_) in _fixture(test_zarr_decode_bounds.vlen_bomb_reads)(temp).items():
            rows.append(("zarr vlen", name, str(got["error"]), got["growth"] / 2**20))
        for module, file in ((test_hdf5_plugin_sizes, "s.h5"), (test_hdf5_plugin_frames, "f.h5")):
            bombs = run_plugin_child(module.CHILD, Path(tmp) / file)["bombs"]
            for name, (error, _message, kib) in bombs.items():
                rows.append(("hdf5 plugin", name, str(error), kib / 1024))
    print("| format | bomb | raised | peak RSS growth |")
    print("| --- | --- | --- | ---: |")
    for kind, name, error, mib in sorted(rows):
        print(f"| {kind} | {name} | {error} | {mib:.1f} MiB |")


if __name__ == "__main__":
    main()
