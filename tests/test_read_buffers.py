"""mixle.utils.files: the per-thread read buffer starts on a page and is reused."""

from __future__ import annotations

import ctypes
import os
import re
import subprocess
import sys
import threading

import numpy as np
import pytest
from _benchmark_runs import ROOT

from mixle.data.sources.arrays.zarr.local_files import read_local_object
from mixle.utils.files import (
    READ_BUFFER_ALIGN,
    READ_BUFFER_KEPT_BYTES,
    page_aligned_buffer,
    thread_read_buffer,
)


def _address(view: memoryview) -> int:
    return ctypes.addressof(ctypes.c_char.from_buffer(view))


@pytest.mark.parametrize("size", [1, 16, 4095, 4096, 4097, 1 << 20, 3 << 20])
def test_a_page_aligned_buffer_starts_on_a_page_and_is_writable(size):
    view = page_aligned_buffer(size)
    assert len(view) == size and not view.readonly
    assert _address(view) % READ_BUFFER_ALIGN == 0
    assert bytes(view[:16]) == bytes(min(size, 16))
    view[-1] = 7
    assert view[-1] == 7


def test_the_thread_buffer_is_reused_grown_and_on_a_page():
    def buffers(out: list[memoryview]) -> None:  # the views keep their memory alive
        for size in (1000, 900_000, 10, 2 << 20, 5):
            view = thread_read_buffer(size)
            assert len(view) == size
            out.append(view)

    here: list[memoryview] = []
    there: list[memoryview] = []
    worker = threading.Thread(target=buffers, args=(there,))
    worker.start()
    worker.join()
    buffers(here)
    for got in (here, there):
        addresses = [_address(view) for view in got]
        assert all(address % READ_BUFFER_ALIGN == 0 for address in addresses)
        _, grown, smaller, grown_again, last = addresses
        assert smaller == grown and last == grown_again  # kept, not made again
    # each thread has its own buffer
    assert {_address(v) for v in here}.isdisjoint(_address(v) for v in there)


def test_a_read_larger_than_the_kept_size_gets_a_buffer_of_its_own():
    kept = thread_read_buffer(100)
    big = thread_read_buffer(READ_BUFFER_KEPT_BYTES + 1)
    assert _address(big) % READ_BUFFER_ALIGN == 0
    assert _address(thread_read_buffer(100)) == _address(kept)


def test_a_stored_file_reads_into_the_page_aligned_buffer(tmp_path):
    data = np.random.default_rng(0).bytes(300_000)
    path = tmp_path / "chunk"
    path.write_bytes(data)
    got = read_local_object(str(path), "chunk", len(data), reuse=True)
    assert isinstance(got, memoryview) and bytes(got) == data
    assert _address(got) % READ_BUFFER_ALIGN == 0
    assert read_local_object(str(path), "chunk", len(data)) == data  # a fresh bytes read


def test_the_read_alignment_benchmark_prints_its_rows():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    script = str(ROOT / "benchmarks" / "read_alignment.py")
    args = ["--rounds", "2", "--files", "8", "--file-kib", "64"]
    run = subprocess.run(
        [sys.executable, script, *args], capture_output=True, text=True, timeout=300, env=env
    )
    assert run.returncode == 0, run.stderr[-4000:]
    assert "the buffer starts 0 bytes into a page" in run.stdout
    for label, count in (("read a stored file (reuse=True)", 8),
                         ("read_boxes, chunk-aligned, no cache", 6)):  # fmt: skip
        (line,) = [row for row in run.stdout.splitlines() if row.startswith(label)]
        numbers = [float(v) for v in re.findall(r"\d+(?:\.\d+)?", line[len(label) :])]
        assert len(numbers) == count and all(v > 0 for v in numbers), line
