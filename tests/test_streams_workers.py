"""The stream Loader with worker processes: every worker pulls the stream itself and keeps
its own batches; the batches equal those read in this process."""

from __future__ import annotations

import json
import os
from typing import Any

import datasets
import numpy as np
import pytest
from _stream_sources import Counting, counting_factory, noisy

import mixle

pytestmark = pytest.mark.skipif(os.name != "posix", reason="worker processes need POSIX")


def same(a: Any, b: Any) -> None:
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            same(a[key], b[key])
    else:
        np.testing.assert_array_equal(a, b)
        assert np.asarray(a).dtype == np.asarray(b).dtype


def test_spawned_workers_equal_one_process() -> None:
    options: dict[str, Any] = dict(
        batch_size=3,
        shuffle_buffer=7,
        seed=4,
        drop_last="pad",
        num_shards=2,
        shard_index=1,
        num_epochs=2,
        record_transform=noisy,
    )
    want = list(mixle.Loader(Counting(40), num_threads=0, **options))
    loader = mixle.Loader(Counting(40), num_workers=2, num_threads=2, **options)
    got, pids = [], set()
    for batch in loader:
        got.append(batch)
        pids.update(loader.worker_pids)
    assert len(pids) == 2 and loader.worker_pids == ()
    assert len(got) == len(want) == 14
    for a, b in zip(got, want):
        same(a, b)


def test_fork_workers_resume_an_hf_stream() -> None:
    stream = datasets.IterableDataset.from_generator(counting_factory).with_format("numpy")
    options: dict[str, Any] = dict(batch_size=4, num_epochs=2, worker_start_method="fork")
    whole = [
        b["i"].tolist() for b in mixle.Loader(stream, num_threads=0, batch_size=4, num_epochs=2)
    ]
    first = mixle.Loader(stream, num_workers=3, num_threads=0, **options)
    got = []
    for batch in first:
        got.append(batch["i"].tolist())
        if len(got) == 4:
            state = json.dumps(first.state_dict())
            break
    again = mixle.Loader(stream, num_workers=2, num_threads=1, **options)
    again.load_state_dict(json.loads(state))
    got += [b["i"].tolist() for b in again]
    assert got == whole and len(whole) == 12


def test_fork_workers_read_each_epoch_of_an_hf_shuffle_in_datasets_order() -> None:
    """With torch installed, datasets keeps an IterableDataset's epoch in shared memory, so
    fork workers that each called set_epoch on it for different epochs changed each other's
    epoch mid-pass (CI saw a negative epoch fail in numpy). Each pass now reads a copy at its
    epoch, and the caller's dataset keeps its own epoch."""

    def shuffled() -> Any:
        ids = datasets.Dataset.from_dict({"i": list(range(40))}).to_iterable_dataset(8)
        return ids.shuffle(seed=3, buffer_size=6)

    want = []
    for epoch in range(3):
        reference = shuffled()  # datasets' own read of each epoch
        reference.set_epoch(epoch)
        order = [int(r["i"]) for r in reference]
        want += [order[k : k + 5] for k in range(0, 40, 5)]
    stream = shuffled().with_format("numpy")
    stream.set_epoch(5)
    loader = mixle.Loader(
        stream, 5, num_epochs=3, num_workers=3, num_threads=0, worker_start_method="fork"
    )
    got = [b["i"].tolist() for b in loader]
    assert got == want and want[:8] != want[8:16]
    assert stream.epoch == 5  # the Loader read copies; the caller's dataset is not changed
    in_process = [b["i"].tolist() for b in mixle.Loader(stream, 5, num_epochs=3)]
    assert in_process == want and stream.epoch == 5


def test_a_stream_error_in_a_worker_reaches_the_loop() -> None:
    loader = mixle.Loader(
        Counting(10), 2, num_workers=2, worker_start_method="fork", transform=_fails_on_six
    )
    with pytest.raises(ValueError, match="record 6") as info:
        list(loader)
    assert "Loader worker 1" in "".join(getattr(info.value, "__notes__", []))


def _fails_on_six(batch: dict[str, Any]) -> dict[str, Any]:
    if 6 in batch["i"]:
        raise ValueError("record 6 is bad")
    return batch
