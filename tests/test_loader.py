"""The Loader through its public API: epochs, shards, resume, threads, masks, specs, errors."""

from __future__ import annotations

import gc
import itertools
import json
import subprocess
import sys
import threading
import traceback
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mixle
from mixle import Loader, LoaderStateError, PatchSampler, validate_batch
from mixle.data.spec import ArraySpec
from mixle.errors import SchemaMismatchError
from mixle.loading import record_rng
from mixle.loading.prefetch import THREAD_NAME_PREFIX

policies = st.sampled_from([False, True, "pad"])


class Indexed:
    """Dict records that hold their own index; read one at a time."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        if not 0 <= i < self.n:
            raise IndexError(i)
        return {"i": np.int64(i), "x": np.full(2, i, dtype=np.float32)}


class BatchedIndexed(Indexed):
    """The same records, with a multi-index read."""

    def __init__(self, n: int) -> None:
        super().__init__(n)
        self.batch_calls = 0

    def get_batch(self, indices: Any) -> dict[str, Any]:
        self.batch_calls += 1
        idx = np.asarray(indices, dtype=np.int64)
        return {"i": idx.copy(), "x": np.repeat(idx[:, None], 2, axis=1).astype(np.float32)}


def loader_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(THREAD_NAME_PREFIX)]


def run(loader: Loader, limit: int | None = None) -> list[tuple[list[int], list[bool] | None]]:
    """``(record indices, mask)`` of each batch, from the batch contents."""
    out = []
    for batch in itertools.islice(loader, limit):
        mask = batch.get("mask")
        out.append((batch["i"].tolist(), None if mask is None else mask.tolist()))
    return out


# -- epochs and shards ------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 60),
    batch=st.integers(1, 8),
    shards=st.integers(1, 4),
    drop_last=policies,
    shuffle=st.booleans(),
)
def test_each_epoch_reads_each_record_once_over_the_shards(
    n: int, batch: int, shards: int, drop_last: Any, shuffle: bool
) -> None:
    src = BatchedIndexed(n)
    per_epoch: list[list[int]] = [[], []]
    for s in range(shards):
        loader = Loader(src, batch, shuffle=shuffle, seed=3, num_epochs=2, drop_last=drop_last,
                        shard_index=s, num_shards=shards, num_threads=0)  # fmt: skip
        got = run(loader)
        assert len(got) == 2 * len(loader)
        for e in range(2):
            rows = got[e * len(loader) : (e + 1) * len(loader)]
            real = [i for ids, mask in rows for i, m in zip(ids, mask or [True] * len(ids)) if m]
            assert real == loader.record_indices(e).tolist()
            per_epoch[e] += real
            for ids, mask in rows:
                assert (len(ids) == batch) if drop_last else (1 <= len(ids) <= batch)
                assert (mask is not None) == (drop_last == "pad")
    g = batch * shards
    for e in range(2):
        records = sorted(per_epoch[e])
        assert len(set(records)) == len(records)  # disjoint shards, no duplicates
        if drop_last is True:
            assert len(records) == n // g * g
        else:
            assert records == list(range(n))
    if shuffle and len(per_epoch[0]) > 20:
        assert per_epoch[0] != per_epoch[1]


def test_shuffled_epochs_differ_and_seeds_repeat() -> None:
    def order(seed: int, epochs: int) -> list[list[int]]:
        loader = Loader(BatchedIndexed(50), 50, shuffle=True, seed=seed, num_epochs=epochs)
        return [ids for ids, _ in run(loader)]

    first = order(0, 3)
    assert len({tuple(e) for e in first}) == 3
    assert order(0, 3) == first
    assert order(1, 1)[0] != first[0]
    assert sorted(first[0]) == list(range(50))


def test_same_order_in_another_process() -> None:
    code = (
        "import numpy as np, mixle; "
        "l = mixle.Loader(np.arange(40), 8, shuffle=True, seed=11, num_epochs=2, num_threads=0); "
        "print([b.tolist() for b in l])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    here = Loader(np.arange(40), 8, shuffle=True, seed=11, num_epochs=2, num_threads=2)
    assert out.stdout.strip() == str([b.tolist() for b in here])


@pytest.mark.parametrize(("num_threads", "prefetch"), [(0, 1), (1, 1), (2, 2), (3, 7)])
def test_order_does_not_depend_on_threads(num_threads: int, prefetch: int) -> None:
    def batches(threads: int, ahead: int) -> list[Any]:
        loader = Loader(BatchedIndexed(37), 4, shuffle=True, seed=2, num_epochs=2,
                        drop_last="pad", num_threads=threads, prefetch=ahead)  # fmt: skip
        return run(loader)

    assert batches(num_threads, prefetch) == batches(0, 1)


@pytest.mark.parametrize("drop_last", [False, True, "pad"])
def test_multi_index_read_equals_one_at_a_time(drop_last: Any) -> None:
    kwargs = {"shuffle": True, "seed": 4, "num_epochs": 2, "drop_last": drop_last}
    batched, single = BatchedIndexed(23), Indexed(23)
    fast = list(Loader(batched, 5, **kwargs))
    slow = list(Loader(single, 5, **kwargs))
    assert batched.batch_calls == len(fast)
    assert len(fast) == len(slow)
    for a, b in zip(fast, slow):
        assert a.keys() == b.keys()
        for key in a:
            np.testing.assert_array_equal(a[key], b[key])
            assert a[key].dtype == b[key].dtype


def test_endless_runs_past_the_first_epoch() -> None:
    loader = Loader(BatchedIndexed(10), 4, shuffle=True, num_epochs=None, num_threads=1)
    got = run(loader, limit=7)  # 3 batches per epoch
    assert len(got) == 7 and loader.epoch == 2
    assert sorted(i for ids, _ in got[3:6] for i in ids) == list(range(10))
    loader.close()
    assert not loader_threads()


# -- resume -----------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 40),
    batch=st.integers(1, 7),
    drop_last=policies,
    shuffle=st.booleans(),
    num_epochs=st.integers(1, 3),
    shards=st.integers(1, 3),
    data=st.data(),
)
def test_resume_after_any_batch_reproduces_the_rest(
    n: int, batch: int, drop_last: Any, shuffle: bool, num_epochs: int, shards: int,
    data: st.DataObject,
) -> None:  # fmt: skip
    kwargs = {"shuffle": shuffle, "seed": 8, "num_epochs": num_epochs, "drop_last": drop_last,
              "num_shards": shards, "shard_index": shards - 1, "num_threads": 0}  # fmt: skip
    full = run(Loader(BatchedIndexed(n), batch, **kwargs))
    stop = data.draw(st.integers(0, len(full)), label="batches before the crash")
    first = Loader(BatchedIndexed(n), batch, **kwargs)
    state = first.state_dict()
    for taken, _ in enumerate(first, start=1):
        if taken > stop:
            break
        state = json.loads(json.dumps(first.state_dict()))
    first.close()
    resumed = Loader(BatchedIndexed(n), batch, **kwargs)
    resumed.load_state_dict(state)
    assert run(resumed) == full[stop:]
    assert resumed.state_dict()["epoch"] == num_epochs


def test_resume_with_threads_after_break_mid_epoch() -> None:
    src = PatchSampler(np.arange(20 * 24.0).reshape(20, 24), 4, 29, seed=1)
    kwargs: dict[str, Any] = {"shuffle": True, "seed": 5, "num_epochs": 3, "drop_last": "pad"}
    full = list(Loader(src, 4, num_threads=3, **kwargs))
    loader = Loader(src, 4, num_threads=2, prefetch=5, **kwargs)
    for k, _ in enumerate(loader):
        if k == 9:  # the 10th batch: 8 batches per epoch, so epoch 1, batch 1
            break
    state = loader.state_dict()
    assert (state["epoch"], state["batch"], state["position"]) == (1, 2, 8)
    assert set(state) >= {"seed", "epoch", "position", "shard_index", "batch_size", "source"}
    json.dumps(state)
    again = Loader(PatchSampler(np.arange(20 * 24.0).reshape(20, 24), 4, 29, seed=1), 4, **kwargs)
    again.load_state_dict(state)
    rest = list(again)
    assert len(rest) == len(full) - 10
    for got, want in zip(rest, full[10:]):
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b)
    assert not loader_threads()


def test_state_from_another_source_or_layout_is_refused() -> None:
    loader = Loader(BatchedIndexed(30), 4, shuffle=True, seed=1, num_shards=2)
    state = loader.state_dict()
    cases = [
        (Loader(BatchedIndexed(31), 4, shuffle=True, seed=1, num_shards=2), "another source"),
        (Loader(Indexed(30), 4, shuffle=True, seed=1, num_shards=2), "another source"),
        (Loader(BatchedIndexed(30), 5, shuffle=True, seed=1, num_shards=2), "batch_size=4"),
        (Loader(BatchedIndexed(30), 4, shuffle=True, seed=1, num_shards=3), "num_shards=2"),
        (Loader(BatchedIndexed(30), 4, shuffle=True, seed=1, num_shards=2, shard_index=1),
         "shard_index=0"),
        (Loader(BatchedIndexed(30), 4, shuffle=True, seed=2, num_shards=2), "seed=1"),
    ]  # fmt: skip
    for other, message in cases:
        with pytest.raises(LoaderStateError, match=message):
            other.load_state_dict(state)
    with pytest.raises(ValueError, match=r"missing keys \['batch'"):
        loader.load_state_dict({k: v for k, v in state.items() if k != "batch"})
    with pytest.raises(LoaderStateError, match="not a cursor of this loader"):
        loader.load_state_dict({**state, "batch": 99})
    with pytest.raises(LoaderStateError, match="must be a dict"):
        loader.load_state_dict([1, 2])  # type: ignore[arg-type]
    patches = [PatchSampler(np.zeros((9, 9)), 3, 10, seed=s) for s in (0, 1)]
    with pytest.raises(LoaderStateError, match="another source"):
        Loader(patches[1], 2).load_state_dict(Loader(patches[0], 2).state_dict())


# -- threads and errors -----------------------------------------------------------------
class Faulty(BatchedIndexed):
    def get_batch(self, indices: Any) -> dict[str, Any]:
        if 7 in np.asarray(indices):
            raise_on_record_seven()
        return super().get_batch(indices)


def raise_on_record_seven() -> None:
    raise OSError("disk on fire at record 7")


@pytest.mark.parametrize("num_threads", [0, 2])
def test_reader_exceptions_reach_the_caller_with_their_traceback(num_threads: int) -> None:
    loader = Loader(Faulty(20), 3, num_threads=num_threads, prefetch=4)
    seen: list[list[int]] = []

    def consume() -> None:
        for batch in loader:
            seen.append(batch["i"].tolist())

    with pytest.raises(OSError, match="disk on fire") as info:
        consume()
    assert seen == [[0, 1, 2], [3, 4, 5]]
    frames = [f.name for f in traceback.extract_tb(info.value.__traceback__)]
    assert "raise_on_record_seven" in frames and "get_batch" in frames
    assert not loader_threads()
    assert loader.state_dict()["batch"] == 2  # the failed batch is read again on resume


def test_no_threads_left_after_close_break_gc_or_a_new_iterator() -> None:
    loader = Loader(BatchedIndexed(100), 2, num_epochs=None, num_threads=3, prefetch=6)
    it = iter(loader)
    next(it)
    assert loader_threads()
    loader.close()
    assert not loader_threads()

    for _ in loader:
        break
    assert not loader_threads()

    it = iter(loader)
    next(it)
    del it
    gc.collect()
    assert not loader_threads()

    first = iter(loader)
    next(first)
    second = iter(loader)  # stops the first; continues from the cursor
    assert next(second)["i"].size == 2
    assert not list(first)
    with loader:
        next(second)
    assert not loader_threads()


# -- transforms -------------------------------------------------------------------------
def test_record_randomness_is_keyed_by_record_not_position() -> None:
    def noisy(record: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
        return {**record, "x": record["x"] + rng.random(2).astype(np.float32)}

    def values(shuffle: bool, threads: int) -> dict[tuple[int, int], list[float]]:
        loader = Loader(BatchedIndexed(12), 5, shuffle=shuffle, seed=4, num_epochs=2,
                        record_transform=noisy, num_threads=threads)  # fmt: skip
        out = {}
        for k, batch in enumerate(loader):
            epoch = k // len(loader)
            for i, x in zip(batch["i"].tolist(), batch["x"].tolist()):
                out[epoch, i] = x
        return out

    plain, shuffled = values(False, 0), values(True, 2)
    assert plain == shuffled
    assert plain[0, 3] != plain[1, 3]  # a new draw each epoch
    want = 3 + record_rng(4, 1, 3).random(2).astype(np.float32)
    np.testing.assert_array_equal(np.float32(plain[1, 3]), want)


def test_batch_transform_runs_before_the_mask_is_attached() -> None:
    seen = []

    def scale(batch: dict[str, Any]) -> dict[str, Any]:
        seen.append(set(batch))
        return {"x": batch["x"] * 2, "i": batch["i"]}

    loader = Loader(BatchedIndexed(5), 2, drop_last="pad", transform=scale, num_threads=2)
    batches = list(loader)
    assert all(keys == {"i", "x"} for keys in seen)
    assert batches[-1]["mask"].tolist() == [True, False]
    assert batches[-1]["x"][0].tolist() == [8.0, 8.0]


# -- padding mask, element spec, validate_batch -----------------------------------------
def test_mask_travels_inside_the_batch(tmp_path: Any) -> None:
    volume = np.arange(12 * 10, dtype=np.float32).reshape(12, 10)
    np.save(tmp_path / "v.npy", volume)
    sampler = PatchSampler(mixle.read_npy(str(tmp_path / "v.npy")), (3, 4), 5, seed=2)
    patches, coords, mask = list(Loader(sampler, 3, drop_last="pad"))[-1]  # tuple: mask last
    assert patches.shape == (3, 3, 4) and coords.shape == (3, 2) and mask.tolist() == [1, 1, 0]
    np.testing.assert_array_equal(patches[0], sampler[3][0])

    array_batches = list(Loader(np.arange(5.0), 2, drop_last="pad"))  # array -> (batch, mask)
    assert [m.tolist() for _, m in array_batches] == [[1, 1], [1, 1], [1, 0]]
    assert array_batches[-1][0].tolist() == [4.0, 0.0]  # the pad row repeats a real record

    clash = [{"x": np.zeros(1), "mask": np.ones(1)}] * 3
    with pytest.raises(ValueError, match="already have a 'mask' key"):
        list(Loader(clash, 2, drop_last="pad"))

    unpadded = list(Loader(sampler, 3))
    assert len(unpadded[-1]) == 2 and len(unpadded[-1][0]) == 2


def test_element_spec_matches_every_batch() -> None:
    sampler = PatchSampler(np.zeros((10, 12), dtype=np.int16), (2, 3), 7, seed=0)
    loader = Loader(sampler, 3, drop_last="pad")
    spec = loader.element_spec()
    assert spec == (
        ArraySpec((3, 2, 3), np.int16), ArraySpec((3, 2), np.int64), ArraySpec((3,), np.bool_)
    )  # fmt: skip
    for batch in loader:
        validate_batch(batch, spec)

    ragged = Loader(BatchedIndexed(7), 3, transform=lambda b: {"x": b["x"].astype(np.float64)})
    spec = ragged.element_spec()  # from one batch read, since the transform may change it
    assert spec == {"x": ArraySpec((3, 2), np.float64)}
    batches = list(ragged)
    with pytest.raises(SchemaMismatchError, match=r"batch\['x'\] has shape \(1, 2\)"):
        validate_batch(batches[-1], spec)
    for batch in batches:
        validate_batch(batch, spec, allow_short=True)
    assert Loader(Indexed(4), 2).element_spec() == {
        "i": ArraySpec((2,), np.int64), "x": ArraySpec((2, 2), np.float32)
    }  # fmt: skip


class EmptyPipeline:
    """A transform that is falsy (``len() == 0``, like an empty ``nn.Sequential``)."""

    def __len__(self) -> int:
        return 0

    def __call__(self, batch: Any) -> Any:
        return {"x": batch["x"].astype(np.float64)}


class Described(BatchedIndexed):
    """Records that report their spec from metadata."""

    def element_spec(self) -> dict[str, ArraySpec]:
        return {"i": ArraySpec((), np.int64), "x": ArraySpec((2,), np.float32)}


def test_element_spec_sees_a_falsy_transform() -> None:
    loader = Loader(Described(6), 3, transform=EmptyPipeline())
    spec = loader.element_spec()  # the transform changes the batch: not the source's spec
    assert spec == {"x": ArraySpec((3, 2), np.float64)}
    for batch in loader:
        validate_batch(batch, spec)


def test_validate_batch_names_the_field() -> None:
    spec = (ArraySpec((2, 3), np.float32), {"y": ArraySpec((2,), np.int64)})
    validate_batch((np.zeros((2, 3), np.float32), {"y": np.zeros(2, np.int64)}), spec)
    bad = [
        ((np.zeros((2, 3), np.float64), {"y": np.zeros(2, np.int64)}),
         r"batch\[0\] has shape \(2, 3\) and dtype float64; spec expects shape \(2, 3\) "
         r"and dtype float32"),
        ((np.zeros((2, 3), np.float32), {"y": np.zeros(3, np.int64)}),
         r"batch\[1\]\['y'\] has shape \(3,\)"),
        ((np.zeros((2, 3), np.float32), {"z": np.zeros(2, np.int64)}),
         r"batch\[1\] is a dict with keys \['z'\]; spec expects a dict with keys \['y'\]"),
        ([np.zeros((2, 3), np.float32)], r"batch is a list of 1; spec expects a tuple of 2"),
    ]  # fmt: skip
    for batch, message in bad:
        with pytest.raises(SchemaMismatchError, match=message):
            validate_batch(batch, spec)
    with pytest.raises(ValueError, match="spec expects an array"):
        validate_batch({"a": 1}, ArraySpec((), np.int64))


# -- indices and length -----------------------------------------------------------------
def test_indices_say_which_records_made_each_batch() -> None:
    loader = Loader(BatchedIndexed(11), 4, shuffle=True, seed=6, num_epochs=2, drop_last="pad")
    assert len(loader) == 3
    assert loader.last_indices is None
    for k, batch in enumerate(loader):
        epoch, b = divmod(k, len(loader))
        assert batch["i"].tolist() == loader.last_indices.tolist()  # type: ignore[union-attr]
        assert batch["i"].tolist() == loader.batch_indices(b, epoch=epoch).tolist()
    with pytest.raises(IndexError, match="batch=3 is out of range for 3 batches"):
        loader.batch_indices(3)


# -- argument errors --------------------------------------------------------------------
def test_bad_arguments_name_the_argument_and_what_is_accepted() -> None:
    src = BatchedIndexed(10)
    with pytest.raises(ValueError, match="batch_size=0 must be an int >= 1"):
        Loader(src, 0)
    with pytest.raises(TypeError, match=r"batch_size=2\.5 must be an int"):
        Loader(src, 2.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="batch_size=True must be an int, not a bool"):
        Loader(src, True)  # type: ignore[arg-type]
    with pytest.raises(IndexError, match=r"shard_index=2 is out of range for num_shards=2"):
        Loader(src, 2, shard_index=2, num_shards=2)
    with pytest.raises(ValueError, match="num_epochs=0 must be an int >= 1"):
        Loader(src, 2, num_epochs=0)
    with pytest.raises(ValueError, match="drop_last='all' must be False, True or 'pad'"):
        Loader(src, 2, drop_last="all")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="num_threads=-1 must be an int >= 0"):
        Loader(src, 2, num_threads=-1)
    with pytest.raises(ValueError, match="prefetch=0 must be an int >= 1"):
        Loader(src, 2, prefetch=0)
    with pytest.raises(TypeError, match="transform=3 must be a callable"):
        Loader(src, 2, transform=3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="source=int must be map-style"):
        Loader(3, 2)
    with pytest.raises(TypeError, match="shuffle=1 must be True or False"):
        Loader(src, 2, shuffle=1)  # type: ignore[arg-type]
    seq = PatchSampler(np.zeros((8, 8)), 2, 4, structure=mixle.SEQUENTIAL)
    with pytest.raises(ValueError, match="records are SEQUENTIAL and may not be reordered"):
        Loader(seq, 2, shuffle=True)
    assert len(list(Loader(seq, 2))) == 2


def test_blocked_shard_layout_is_part_of_the_resume_state() -> None:
    data = np.arange(40)
    blocked = Loader(data, 4, shard_index=1, num_shards=2, shard_layout="blocked")
    assert next(iter(blocked)).tolist() == [4, 5, 6, 7]  # rows [4, 8) of the 8-row batch
    state = blocked.state_dict()
    assert state["shard_layout"] == "blocked"
    with pytest.raises(LoaderStateError, match="shard_layout='blocked'"):
        Loader(data, 4, shard_index=1, num_shards=2).load_state_dict(state)
    with pytest.raises(
        ValueError, match="shard_layout='rows' must be one of 'interleaved', 'blocked'"
    ):
        Loader(data, 4, shard_layout="rows")
