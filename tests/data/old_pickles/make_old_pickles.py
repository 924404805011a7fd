"""Write the pickles of tests/test_old_pickles.py with the code of the last landed release.

Run from a checkout of that commit (``git worktree add /tmp/old 14cc1f7``), with that
checkout first on ``sys.path``: ``cd /tmp/old && python3 <this file> <output folder>``. The
samplers are built over in-memory arrays, so each pickle holds its data and no path.
"""

import pickle
import sys
from pathlib import Path

import numpy as np

import mixle

CASES = {
    "plain": lambda a, w, lab: mixle.PatchSampler(a, (2, 3, 4), 7, seed=1),
    "padded": lambda a, w, lab: mixle.PatchSampler(
        a, (3, 3, 3), 6, seed=2, padding="constant", pad_value=-1
    ),
    "reflect": lambda a, w, lab: mixle.PatchSampler(a, (4, 4, 4), 5, seed=3, padding="reflect"),
    "no_replacement": lambda a, w, lab: mixle.PatchSampler(
        a, (4, 4, 4), 8, seed=4, replacement=False
    ),
    "per_chunk": lambda a, w, lab: mixle.PatchSampler(a, (2, 2, 2), 9, seed=5, patches_per_chunk=3),
    "weighted": lambda a, w, lab: mixle.PatchSampler(a, (2, 2, 2), 6, seed=6, weights=w),
    "labels": lambda a, w, lab: mixle.PatchSampler(
        {"image": a, "label": lab},
        (2, 2, 2),
        6,
        seed=7,
        labels="label",
        label_probabilities={0: 0.5, 1: 0.5},
    ),
    "grid": lambda a, w, lab: mixle.GridSampler(a, (4, 4, 4), overlap=1),
}


def arrays() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    volume = np.arange(8 * 8 * 8, dtype=np.float32).reshape(8, 8, 8)
    weights = (volume % 5 == 0).astype(np.float32)
    labels = (volume % 3 == 0).astype(np.uint8)
    return volume, weights, labels


if __name__ == "__main__":
    out = Path(sys.argv[1])
    for name, build in CASES.items():
        (out / f"{name}.pkl").write_bytes(pickle.dumps(build(*arrays())))
