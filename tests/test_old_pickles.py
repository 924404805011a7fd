"""Samplers pickled by the last landed release load and read the same patches now.

The pickles in tests/data/old_pickles were written by ``make_old_pickles.py`` there, run
with the code of commit 14cc1f7, before the samplers' modules moved and ``PatchSampler``
kept its layout in an object of its own.
"""

from __future__ import annotations

import importlib.util
import pickle
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent / "data" / "old_pickles"
_spec = importlib.util.spec_from_file_location("make_old_pickles", HERE / "make_old_pickles.py")
assert _spec is not None and _spec.loader is not None
MAKE = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(MAKE)


@pytest.mark.parametrize("name", sorted(MAKE.CASES))
def test_an_old_pickle_reads_the_patches_a_new_sampler_reads(name: str) -> None:
    old = pickle.loads((HERE / f"{name}.pkl").read_bytes())
    new = MAKE.CASES[name](*MAKE.arrays())
    assert type(old) is type(new) and len(old) == len(new)
    assert old.fingerprint() == new.fingerprint()
    every = np.arange(len(new))
    for epoch in (0, 3) if hasattr(new, "set_epoch") else (0,):  # a grid has no epochs
        if epoch:
            old.set_epoch(epoch)
            new.set_epoch(epoch)
        got, want = old.get_batch(every), new.get_batch(every)
        if isinstance(want, dict):
            assert got.keys() == want.keys()
            for key in want:
                np.testing.assert_array_equal(got[key], want[key], err_msg=f"{name} {key}")
        else:
            for part, expected in zip(got, want, strict=True):
                np.testing.assert_array_equal(part, expected, err_msg=name)
    assert repr(old) == repr(new)
