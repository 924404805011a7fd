"""The Loader over streams (iterables with no length): kinds, order, shards, padding, shuffle
buffer, epochs, transforms' randomness, spec checks, threads, resume and bad input.

The position math is checked against the map-style Loader reading the same records with
``shuffle=False`` (its batches are the documented meaning of batch size, shards and
``drop_last``), and the shuffle buffer against a plain reference implementation.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import pytest
from _stream_sources import WIDTH, BadSpec, Counting, counting_factory, noisy, record
from hypothesis import given, settings
from hypothesis import strategies as st

import mixle
from mixle.data.index_math.hashing import below_int, hash_int
from mixle.data.index_math.permutation import permute
from mixle.data.spec import ArraySpec
from mixle.errors import LoaderStateError, SchemaMismatchError
from mixle.loading.plan import batch_rng, record_rng
from mixle.loading.streams import StreamLoader, is_stream, shuffle_buffer
from mixle.loading.streams.plan import StreamLayout, shard_rows
from mixle.loading.streams.shuffle_buffer import SHUFFLE_BUFFER_STREAM
from mixle.utils.optional_deps import HAS_JAX


def ids(batch: dict[str, Any]) -> list[int]:
    return [int(i) for i in batch["i"]]


def run_ids(loader: Any) -> list[list[int]]:
    return [ids(batch) for batch in loader]


def same_batches(a: Any, b: Any) -> None:
    assert type(a) is type(b)
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            same_batches(a[key], b[key])
    elif isinstance(a, (tuple, list)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            same_batches(x, y)
    else:
        np.testing.assert_array_equal(a, b)
        assert np.asarray(a).dtype == np.asarray(b).dtype


# -- what is a stream ---------------------------------------------------------------------
def test_is_stream_kinds() -> None:
    assert is_stream(Counting(3))
    assert is_stream(counting_factory)
    assert is_stream(iter([1, 2]))
    assert is_stream(x for x in range(3))
    assert is_stream(datasets.Dataset.from_dict({"a": [1]}).to_iterable_dataset())
    for mapped in ([1, 2], np.arange(3), {"a": 1}, "abc", range(4)):
        assert not is_stream(mapped)
    assert not is_stream(lambda n: iter(range(n)))  # needs an argument
    assert not is_stream(Counting)  # a class, not a factory
    assert not is_stream(3)


@pytest.mark.parametrize(
    "make",
    [
        lambda: Counting(23),
        lambda: counting_factory,
        lambda: (record(i) for i in range(23)),
        lambda: datasets.IterableDataset.from_generator(counting_factory),
        lambda: (
            datasets.Dataset.from_list([record(i) for i in range(23)])
            .to_iterable_dataset()
            .with_format("numpy")
        ),
    ],
    ids=["re-iterable", "factory", "one-shot", "hf-from-generator", "hf-to-iterable"],
)
def test_every_kind_of_stream_yields_its_records_in_order(make: Any) -> None:
    loader = mixle.Loader(make(), batch_size=5)
    assert isinstance(loader, StreamLoader)
    batches = list(loader)
    assert [len(ids(b)) for b in batches] == [5, 5, 5, 5, 3]
    assert [i for b in batches for i in ids(b)] == list(range(23))
    assert batches[1]["x"].shape == (5, WIDTH)
    np.testing.assert_array_equal(batches[1]["x"][:, 0], np.arange(5, 10))
    assert loader.epoch == 1 and loader.last_epoch == 0
    assert loader.last_indices.tolist() == [20, 21, 22]


def test_tuple_and_array_records_stack_like_map_style() -> None:
    def pairs() -> Iterator[tuple[np.ndarray, int]]:
        return ((np.arange(3) + i, i) for i in range(7))

    for got, want in zip(
        mixle.Loader(pairs, 3, num_threads=0), mixle.Loader(list(pairs()), 3, num_threads=0)
    ):
        same_batches(got, want)
    arrays = mixle.Loader(lambda: iter(np.eye(4)), 2, drop_last="pad")
    first = next(iter(arrays))
    assert isinstance(first, tuple) and first[0].shape == (2, 4) and first[1].all()


# -- the position math ----------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(0, 40),
    batch_size=st.integers(1, 5),
    num_shards=st.integers(1, 3),
    drop_last=st.sampled_from([False, True, "pad"]),
    layout=st.sampled_from(["interleaved", "blocked"]),
)
def test_shards_equal_the_map_style_loader_over_the_same_records(
    n: int, batch_size: int, num_shards: int, drop_last: Any, layout: str
) -> None:
    records = [record(i) for i in range(n)]
    seen: list[int] = []
    counts = set()
    for s in range(num_shards):
        args = dict(
            batch_size=batch_size,
            shard_index=s,
            num_shards=num_shards,
            drop_last=drop_last,
            shard_layout=layout,
            num_threads=0,
        )
        stream = mixle.Loader(Counting(n), **args)
        mapped = mixle.Loader(records, **args)
        got_indices, want_indices = [], []
        got, want = [], []
        for batch in stream:
            got.append(batch)
            got_indices.append(stream.last_indices.tolist())
        for batch in mapped:
            want.append(batch)
            want_indices.append(mapped.last_indices.tolist())
        assert got_indices == want_indices
        for a, b in zip(got, want):
            same_batches(a, b)
        assert len(got) == len(want)
        counts.add(len(got))
        for batch, rows in zip(got, got_indices):
            real = batch["mask"] if drop_last == "pad" else np.ones(len(rows), bool)
            seen += [r for r, keep in zip(rows, real) if keep]
    g = batch_size * num_shards
    if drop_last is True:
        assert sorted(seen) == list(range(n // g * g))
    else:
        assert sorted(seen) == list(range(n))  # every record once (padding is masked)
    if drop_last is not False:
        assert len(counts) == 1  # every shard runs the same number of batches


@given(
    batch=st.integers(0, 5),
    real=st.integers(0, 12),
    batch_size=st.integers(1, 4),
    num_shards=st.integers(1, 3),
    blocked=st.booleans(),
)
def test_shard_rows_split_a_global_batch(
    batch: int, real: int, batch_size: int, num_shards: int, blocked: bool
) -> None:
    g = batch_size * num_shards
    real = min(real, g)
    start = batch * g
    taken: list[int] = []
    for s in range(num_shards):
        lay = StreamLayout(batch_size, s, num_shards, False, blocked)
        rows = shard_rows(lay, batch, real)
        if rows is not None:
            assert rows[1] is None
            taken += rows[0].tolist()
        dropped = shard_rows(StreamLayout(batch_size, s, num_shards, True, blocked), batch, real)
        if real < g:
            assert dropped is None  # a short global batch is dropped on every shard
        else:
            assert dropped is not None and rows is not None
            assert dropped[0].tolist() == rows[0].tolist()
        padded = shard_rows(StreamLayout(batch_size, s, num_shards, "pad", blocked), batch, real)
        if real:
            assert padded is not None and padded[0].size == batch_size
            assert (padded[0] < start + real).all()
        else:
            assert padded is None
    assert sorted(taken) == list(range(start, start + real))


# -- shuffle buffer -------------------------------------------------------------------------
def reference_buffer(items: list[int], size: int, seed: int, epoch: int) -> list[int]:
    """The documented algorithm, written plainly."""
    out, buf = [], []
    for t, item in enumerate(items):
        if len(buf) < size:
            buf.append(item)
        else:
            j = below_int(size, hash_int(seed, SHUFFLE_BUFFER_STREAM, epoch, t))
            out.append(buf[j])
            buf[j] = item
    if buf:
        drain = permute(np.arange(len(buf)), len(buf), seed=hash_int(seed, 0x44524149), epoch=epoch)
        out += [buf[j] for j in drain.tolist()]
    return out


@given(
    n=st.integers(0, 70),
    size=st.integers(1, 20),
    seed=st.integers(-(2**63), 2**64),
    epoch=st.integers(0, 5),
)
def test_shuffle_buffer_is_a_seeded_permutation(n: int, size: int, seed: int, epoch: int) -> None:
    items = list(range(n))
    got = list(shuffle_buffer(iter(items), size, seed=seed, epoch=epoch))
    assert sorted(got) == items
    assert got == list(shuffle_buffer(items, size, seed=seed, epoch=epoch))
    assert got == reference_buffer(items, size, seed, epoch)


def test_shuffle_buffer_differs_across_epochs_and_seeds() -> None:
    items = list(range(200))
    orders = {tuple(shuffle_buffer(items, 16, seed=s, epoch=e)) for s in (0, 1) for e in (0, 1, 2)}
    assert len(orders) == 6
    assert tuple(items) not in orders
    assert list(shuffle_buffer(items, 1, seed=3, epoch=0)) == items  # one slot keeps the order


def test_loader_shuffle_buffer_before_sharding() -> None:
    n, size = 50, 8
    for epoch in range(2):
        order = reference_buffer(list(range(n)), size, seed=5, epoch=epoch)
        whole = mixle.Loader(Counting(n), 50, shuffle_buffer=size, seed=5, num_epochs=2)
        assert run_ids(whole)[epoch] == order
        shards = [
            mixle.Loader(
                Counting(n),
                5,
                shuffle_buffer=size,
                seed=5,
                num_shards=2,
                shard_index=s,
                num_epochs=2,
            )
            for s in range(2)
        ]
        per_shard = [[r for b in run_ids(sh) for r in b] for sh in shards]
        halves = [per_shard[s][epoch * 25 : (epoch + 1) * 25] for s in range(2)]
        assert halves[0] == order[0::2] and halves[1] == order[1::2]
    loader = mixle.Loader(Counting(n), 10, shuffle_buffer=size, seed=5)
    batch = next(iter(loader))
    assert loader.last_indices.tolist() == ids(batch)  # positions of the unshuffled stream


# -- epochs -----------------------------------------------------------------------------
def test_each_epoch_is_a_new_pass() -> None:
    stream = Counting(7)
    loader = mixle.Loader(stream, 3, num_epochs=3, num_threads=0)
    assert run_ids(loader) == [[0, 1, 2], [3, 4, 5], [6]] * 3
    assert stream.passes == 3 and loader.epoch == 3
    assert list(loader) == []  # the run is over


def test_endless_run_and_an_empty_stream() -> None:
    loader = mixle.Loader(Counting(4), 4, num_epochs=None)
    assert run_ids(itertools.islice(loader, 5)) == [[0, 1, 2, 3]] * 5
    assert list(mixle.Loader(Counting(0), 4, num_epochs=None)) == []  # stops, never spins
    assert list(mixle.Loader(Counting(0), 4, num_epochs=3)) == []
    # a shard that gets nothing in an epoch ends its endless run
    assert list(mixle.Loader(Counting(1), 4, num_shards=2, shard_index=1, num_epochs=None)) == []


def test_set_epoch_is_called_before_each_pass() -> None:
    ds = datasets.Dataset.from_dict({"i": list(range(30))}).to_iterable_dataset(num_shards=3)
    shuffled = ds.shuffle(seed=1, buffer_size=10)
    loader = mixle.Loader(shuffled, 30, num_epochs=2, num_threads=0)
    first, second = (ids(b) for b in loader)
    assert sorted(first) == sorted(second) == list(range(30))
    assert first != second  # the dataset's own shuffle moved on with the epoch
    again = [ids(b) for b in mixle.Loader(shuffled, 30, num_epochs=2, num_threads=0)]
    assert again == [first, second]


# -- transforms' randomness -----------------------------------------------------------------
def test_record_transform_rng_is_keyed_by_stream_position() -> None:
    loader = mixle.Loader(Counting(9), 4, seed=3, num_epochs=2, record_transform=noisy)
    for epoch, batch in zip([0, 0, 0, 1, 1, 1], loader):
        for row, i in enumerate(ids(batch)):
            noise = record_rng(3, epoch, i).random(WIDTH).astype(np.float32)
            np.testing.assert_array_equal(batch["x"][row], np.float32(i) + noise)


def test_two_argument_transform_gets_the_batch_rng() -> None:
    def stamp(batch: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
        return {**batch, "u": rng.random()}

    loader = mixle.Loader(Counting(10), 4, seed=2, shard_index=1, num_shards=2, transform=stamp)
    got = [b["u"] for b in loader]
    assert got == [batch_rng(2, 0, k, 1).random() for k in range(2)]


# -- element spec and check_spec --------------------------------------------------------
def test_element_spec_from_the_stream_and_from_a_batch() -> None:
    spec = mixle.Loader(Counting(5), 4, drop_last="pad").element_spec()
    assert spec == {
        "x": ArraySpec((4, WIDTH), np.dtype(np.float32)),
        "i": ArraySpec((4,), np.dtype(np.int64)),
        "mask": ArraySpec((4,), np.dtype(np.bool_)),
    }
    stream = Counting(3)
    read = mixle.Loader(stream, 4, transform=lambda b: b["x"] * 2).element_spec()
    assert read == ArraySpec((4, WIDTH), np.dtype(np.float32))  # widened from 3 rows
    assert stream.passes == 1
    with pytest.raises(ValueError, match="no batches"):
        mixle.Loader(Counting(0), 2, transform=lambda b: b).element_spec()


def cast(rec: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    return {**rec, "x": rec["x"].astype(np.float32)}


def test_check_spec_catches_a_stream_that_breaks_its_element_spec() -> None:
    with pytest.raises(SchemaMismatchError, match=r"BadSpec.*batch 0 of epoch 0: batch\['x'\]"):
        list(mixle.Loader(BadSpec(10, 0), 4))
    assert len(list(mixle.Loader(BadSpec(10, 0), 4, check_spec=False))) == 3
    # "first" checks batch 0 of each epoch and of each run; the bad records come later
    assert len(list(mixle.Loader(BadSpec(12, 8), 4, record_transform=cast))) == 3
    with pytest.raises(SchemaMismatchError, match=r"batch 2 of epoch 0: batch\['x'\].*float64"):
        list(mixle.Loader(BadSpec(12, 8), 4, check_spec=True, record_transform=cast))
    loader = mixle.Loader(BadSpec(12, 8), 4, num_threads=0)
    run = iter(loader)
    next(run)
    next(run)
    run.close()
    with pytest.raises(SchemaMismatchError, match="batch 2 of epoch 0"):
        list(loader)  # a new run checks its first batch
    with pytest.raises(ValueError, match="check_spec"):
        mixle.Loader(Counting(3), 2, check_spec="always")


# -- threads, runs and resume -------------------------------------------------------------
def test_threads_equal_one_thread() -> None:
    args = dict(batch_size=3, drop_last="pad", num_shards=2, shard_index=1, shuffle_buffer=5)
    want = list(mixle.Loader(Counting(40), num_epochs=2, num_threads=0, **args))
    for threads, prefetch in ((1, 1), (4, 8), (3, 2)):
        got = list(
            mixle.Loader(Counting(40), num_epochs=2, num_threads=threads, prefetch=prefetch, **args)
        )
        assert len(got) == len(want)
        for a, b in zip(got, want):
            same_batches(a, b)


@pytest.mark.parametrize(
    "options",
    [
        dict(batch_size=3, num_epochs=2),
        dict(batch_size=2, drop_last="pad", num_shards=3, shard_index=2, num_epochs=2),
        dict(batch_size=4, drop_last=True, shuffle_buffer=6, seed=9, num_epochs=3),
        dict(batch_size=2, num_shards=2, shard_index=1, shard_layout="blocked", num_epochs=2),
    ],
)
def test_resume_after_every_k_batches_equals_one_run(options: dict[str, Any]) -> None:
    whole = list(mixle.Loader(counting_factory, num_threads=0, **options))
    for k in (1, 2, 3):
        got: list[Any] = []
        state = None
        while True:
            loader = mixle.Loader(counting_factory, num_threads=2, **options)
            if state is not None:
                loader.load_state_dict(json.loads(state))
            for taken, batch in enumerate(loader, 1):
                got.append(batch)
                if taken == k:
                    state = json.dumps(loader.state_dict())
                    break
            else:
                break
        assert len(got) == len(whole)
        for a, b in zip(got, whole):
            same_batches(a, b)


@settings(max_examples=30, deadline=None)
@given(
    n=st.integers(0, 30),
    batch_size=st.integers(1, 4),
    num_shards=st.integers(1, 3),
    drop_last=st.sampled_from([False, True, "pad"]),
    buffer=st.sampled_from([None, 1, 5]),
    stop=st.integers(0, 20),
)
def test_resume_anywhere_equals_one_run(
    n: int, batch_size: int, num_shards: int, drop_last: Any, buffer: int | None, stop: int
) -> None:
    options: dict[str, Any] = dict(
        batch_size=batch_size,
        num_shards=num_shards,
        shard_index=num_shards - 1,
        drop_last=drop_last,
        shuffle_buffer=buffer,
        num_epochs=2,
        num_threads=0,
        seed=n,
    )
    whole = run_ids(mixle.Loader(Counting(n), **options))
    first = mixle.Loader(Counting(n), **options)
    got = run_ids(itertools.islice(first, stop))
    again = mixle.Loader(Counting(n), **options)
    again.load_state_dict(json.loads(json.dumps(first.state_dict())))
    assert got + run_ids(again) == whole


def test_break_then_iterate_again_continues_at_the_cursor() -> None:
    stream = Counting(20)
    loader = mixle.Loader(stream, 3, num_threads=2, prefetch=4, num_epochs=2)
    got = []
    for batch in loader:
        got.append(ids(batch))
        if len(got) in (2, 9):
            break
    got += run_ids(loader)
    assert got == [list(range(i, min(i + 3, 20))) for i in range(0, 20, 3)] * 2
    one = mixle.Loader(Counting(20), 3, num_threads=0)
    run = iter(one)
    next(run)
    run.close()
    assert one.source.passes == 1 and len(list(one)) == 6
    assert one.source.passes == 1  # the iterator stood at the cursor: no new pass


def test_state_dict_keys_and_values() -> None:
    loader = mixle.Loader(Counting(10), 2, num_shards=2, shuffle_buffer=3, num_epochs=2)
    before = loader.state_dict()
    run = iter(loader)
    next(run)
    after = loader.state_dict()
    run.close()
    assert list(before) == list(after)
    assert after["stream"] is True and after["batch"] == 1 and after["position"] == 4
    assert json.loads(json.dumps(after)) == after
    loader.close()
    with mixle.Loader(Counting(10), 2, num_shards=2, shuffle_buffer=3, num_epochs=2) as again:
        again.load_state_dict(after)
        assert ids(next(iter(again))) == ids(
            list(mixle.Loader(Counting(10), 2, num_shards=2, shuffle_buffer=3))[1]
        )


@pytest.mark.skipif(not HAS_JAX, reason='needs jax: pip install -e ".[jax]"')
def test_to_jax_in_a_fresh_interpreter() -> None:
    cases = Path(__file__).with_name("_stream_jax_cases.py")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(cases)]
    env = {
        **os.environ,
        "MIXLE_TEST_JAX_CHILD": "1",
        "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
    }
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=300, env=env)
    report = done.stdout[-8000:] + done.stderr[-2000:]
    assert done.returncode == 0, report
    assert "3 passed" in done.stdout, report


def test_repr_len_and_properties() -> None:
    loader = mixle.Loader(Counting(5), 2, shuffle_buffer=4, seed=1)
    text = repr(loader)
    assert "iterable stream Counting" in text and "shuffle_buffer=4" in text
    with pytest.raises(TypeError, match="a stream has no length"):
        len(loader)
    assert loader.batch_size == 2 and loader.shuffle_buffer == 4 and loader.num_workers == 0
    assert loader.last_indices is None and loader.last_epoch is None and loader.epoch == 0
    assert loader.last_record_keys is None
    next(iter(loader))
    assert loader.last_record_keys.dtype == np.uint64
    assert loader.last_record_keys.tolist() == loader.last_indices.tolist()
    assert loader.worker_pids == ()


# -- one-shot iterators ---------------------------------------------------------------------
def test_one_shot_iterator_reads_once() -> None:
    gen = (record(i) for i in range(5))
    loader = mixle.Loader(gen, 2, num_threads=0)
    run = iter(loader)
    assert ids(next(run)) == [0, 1]
    run.close()
    assert run_ids(loader) == [[2, 3], [4]]  # it stood at the cursor
    loader.load_state_dict(loader.state_dict())  # its own cursor: nothing to rewind
    threaded = mixle.Loader((record(i) for i in range(50)), 2, num_threads=2, prefetch=4)
    run = iter(threaded)
    next(run)
    run.close()  # the readers pulled ahead of the cursor
    with pytest.raises(ValueError, match=r"one-shot iterator .* cannot start again"):
        list(threaded)


def test_one_shot_iterator_errors() -> None:
    def gen() -> Iterator[dict[str, Any]]:
        return (record(i) for i in range(5))

    with pytest.raises(ValueError, match=r"num_epochs=2.*one-shot.*factory"):
        mixle.Loader(gen(), 2, num_epochs=2)
    with pytest.raises(ValueError, match=r"num_epochs=None.*one-shot"):
        mixle.Loader(gen(), 2, num_epochs=None)
    with pytest.raises(ValueError, match=r"num_workers=1.*one-shot"):
        mixle.Loader(gen(), 2, num_workers=1)
    saved = mixle.Loader(gen, 2)
    next(iter(saved))
    state = saved.state_dict()
    with pytest.raises(ValueError, match=r"load_state_dict.*one-shot.*factory"):
        mixle.Loader(gen(), 2).load_state_dict(
            {**state, "source": mixle.Loader(gen(), 2).state_dict()["source"]}
        )
    with pytest.raises(ValueError, match=r"element_spec.*one-shot"):
        mixle.Loader(gen(), 2, transform=lambda b: b).element_spec()


# -- bad input ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"shuffle": True}, ValueError, "shuffle=True.*stream.*shuffle_buffer=N"),
        ({"shuffle": 1}, TypeError, "shuffle=1 must be True or False"),
        ({"shuffle_block": 2}, ValueError, "shuffle_block=2.*shuffle_buffer"),
        ({"shuffle_buffer": 0}, ValueError, "shuffle_buffer=0 must be an int >= 1"),
        ({"shuffle_buffer": True}, TypeError, "shuffle_buffer=True.*not a bool"),
        ({"shuffle_buffer": 2.5}, TypeError, "shuffle_buffer"),
        ({"num_epochs": 0}, ValueError, "num_epochs=0"),
        ({"drop_last": "yes"}, ValueError, "drop_last='yes'"),
        ({"num_shards": 2, "shard_index": 2}, IndexError, "shard_index=2"),
        ({"shard_layout": "rows"}, ValueError, "shard_layout='rows'"),
        ({"transform": 3}, TypeError, "transform=3"),
        ({"record_transform": "f"}, TypeError, "record_transform='f'"),
        ({"num_threads": -1}, ValueError, "num_threads=-1"),
        ({"prefetch": 0}, ValueError, "prefetch=0"),
        ({"timeout": 1.0}, ValueError, "timeout=1.0"),
        ({"num_workers": 1, "transform": lambda b: b}, TypeError, "transform=.*pickled"),
    ],
)
def test_bad_arguments(kwargs: dict[str, Any], error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        mixle.Loader(Counting(4), 2, **kwargs)


def test_bad_batch_size_and_sources() -> None:
    with pytest.raises(ValueError, match="batch_size=0"):
        mixle.Loader(Counting(4), 0)
    with pytest.raises(
        ValueError, match=r"shuffle_buffer=4 is for streams.*has a length; use shuffle=True"
    ):
        mixle.Loader([1, 2, 3], 2, shuffle_buffer=4)
    with pytest.raises(TypeError, match="not a stream"):
        StreamLoader([1, 2], 2)
    with pytest.raises(TypeError, match="must be map-style"):
        mixle.Loader(object(), 2)
    with pytest.raises(TypeError, match=r"factory .* returned int, which is not iterable"):
        list(mixle.Loader(lambda: 3, 2))


def test_fingerprints_tell_streams_apart() -> None:
    def fp(source: Any) -> str:
        return mixle.Loader(source, 2).state_dict()["source"]

    one = datasets.Dataset.from_dict({"a": [1, 2]}).to_iterable_dataset()
    other = datasets.Dataset.from_dict({"b": [1.0, 2.0]}).to_iterable_dataset()
    assert fp(one) != fp(other)
    assert fp(Counting(3)) == fp(Counting(5)) != fp(Words())
    assert fp(counting_factory) != fp(lambda: iter(Words()))


def test_bad_states() -> None:
    loader = mixle.Loader(Counting(6), 2, seed=1, num_epochs=2)
    good = loader.state_dict()
    mapped = mixle.Loader([record(i) for i in range(6)], 2)
    with pytest.raises(LoaderStateError, match="map-style source"):
        loader.load_state_dict(mapped.state_dict())
    with pytest.raises(LoaderStateError, match="saved by a Loader over a stream"):
        mapped.load_state_dict(good)
    cases = [
        ({**good, "seed": 2}, "seed=2 but this loader has seed=1"),
        ({**good, "batch_size": 3}, "batch_size=3"),
        ({**good, "shuffle_buffer": 4}, "shuffle_buffer=4"),
        ({**good, "epoch": True}, "epoch=True"),
        ({**good, "batch": 1}, "position=0 does not match batch=1"),
        ({**good, "epoch": 3}, "epoch=3 is past num_epochs=2"),
        ({**good, "epoch": 2, "batch": 1, "position": 2}, "ends at batch 0"),
        ({**good, "source": "0" * 16}, "another stream"),
        ({k: v for k, v in good.items() if k != "seed"}, "missing keys \\['seed'\\]"),
        ({**good, "extra": 1}, "unknown keys \\['extra'\\]"),
        ({**good, "stream": 1}, "stream=1"),
        ([1, 2], "must be a dict"),
    ]
    for state, match in cases:
        with pytest.raises(LoaderStateError, match=match):
            loader.load_state_dict(state)  # type: ignore[arg-type]


class Words:
    """A stream of ``{"w": str, "t": list, "n": int}`` records; ``w`` and ``t`` are declared
    ``object`` (as mixle's record sources declare string and list columns)."""

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter([{"w": "a" * (n + 1), "t": [n] * n, "n": n} for n in range(3)])

    def element_spec(self) -> dict[str, ArraySpec]:
        obj = ArraySpec((), np.dtype(object))
        return {"w": obj, "t": obj, "n": ArraySpec((), np.dtype(np.int64))}


def untag(rec: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    return {"w": rec["w"], "n": rec["n"]}


def test_strings_and_lists_a_stream_declares_object_stack_as_object() -> None:
    (batch,) = mixle.Loader(Words(), 3, check_spec=True)
    assert batch["w"].dtype == object and batch["w"].tolist() == ["a", "aa", "aaa"]
    assert batch["t"].dtype == object and batch["t"].tolist() == [[], [1], [2, 2]]
    plain = next(iter(mixle.Loader(lambda: iter(Words()), 3, record_transform=untag)))
    assert plain["w"].dtype.kind == "U"  # no spec: NumPy's stacking


class Flaky(Counting):
    """A :class:`Counting` stream whose first pass fails at record ``at``."""

    def __init__(self, n: int, at: int) -> None:
        super().__init__(n)
        self.at = at

    def __iter__(self) -> Iterator[dict[str, Any]]:
        self.passes += 1
        for i in range(self.n):
            if i == self.at and self.passes == 1:
                raise OSError(f"record {i} could not be fetched")
            yield record(i)


@pytest.mark.parametrize("threads", [0, 2])
def test_a_stream_that_fails_is_read_again_from_a_new_pass(threads: int) -> None:
    stream = Flaky(12, at=5)  # the first record of batch 1: the cursor stands right there
    loader = mixle.Loader(stream, 5, num_threads=threads)
    got = []
    run = iter(loader)
    got.append(ids(next(run)))
    with pytest.raises(OSError, match="record 5"):
        next(run)
    assert loader.state_dict()["batch"] == 1
    got += run_ids(loader)
    assert got == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9], [10, 11]]  # not cut short at record 5
    assert stream.passes == 2


def test_read_hf_stream_batches_equal_the_datasets_own_iteration() -> None:
    table = {
        "a": list(range(10)),
        "c": [str(i) for i in range(10)],
        "v": [[i, -i] for i in range(10)],
    }
    ds = datasets.Dataset.from_dict(table).to_iterable_dataset(num_shards=2)
    truth = list(ds)  # the writing library's own read
    loader = mixle.Loader(mixle.read_hf(ds), 4, drop_last="pad", num_epochs=2)
    assert isinstance(loader, StreamLoader)
    spec = loader.element_spec()
    batches = list(loader)
    assert len(batches) == 6
    for batch in batches:
        mixle.validate_batch(batch, spec)
    for k, batch in enumerate(batches[:3]):
        rows = [truth[(4 * k + j) % 10] for j in range(4)]
        assert batch["a"].tolist() == [r["a"] for r in rows]
        assert batch["c"].tolist() == [r["c"] for r in rows]
        assert batch["v"].tolist() == [r["v"] for r in rows]
    assert batches[2]["mask"].tolist() == [True, True, False, False]


class _SharedIterator:
    """A re-iterable whose __iter__ hands back one shared iterator every time."""

    def __init__(self) -> None:
        self._it = iter(range(6))

    def __iter__(self) -> Any:
        return self._it


def test_a_stream_handing_back_a_used_iterator_is_refused_not_silently_short() -> None:
    """Every later pass of such a stream (the next epoch, the pass element_spec() reads)
    would get the rest of one iterator: epochs 1 and 2 empty, or the first batch lost."""
    loader = mixle.Loader(_SharedIterator(), 2, num_epochs=3)
    batches = iter(loader)
    assert [next(batches).tolist() for _ in range(3)] == [[0, 1], [2, 3], [4, 5]]  # epoch 0
    with pytest.raises(ValueError, match="iter\\(source\\) returned the same iterator"):
        next(batches)  # epoch 1: an error, not an empty epoch
    loader = mixle.Loader(_SharedIterator(), 2)
    loader.element_spec()
    with pytest.raises(ValueError, match="same iterator object as for the last pass"):
        list(loader)
    shared = iter(range(6))
    with pytest.raises(ValueError, match="the factory returned the same iterator"):
        list(mixle.Loader(lambda: shared, 2, num_epochs=3))


def test_what_loader_returns_is_a_loader_base() -> None:
    from mixle.loading.base import LoaderBase

    def gen() -> Any:
        yield from range(3)

    stream, mapped = mixle.Loader(gen, 2), mixle.Loader(np.arange(4), 2)
    assert isinstance(stream, LoaderBase) and isinstance(mapped, LoaderBase)
    assert isinstance(stream, StreamLoader) and not isinstance(stream, mixle.Loader)


def test_state_dict_asks_the_stream_for_its_fingerprint_once() -> None:
    """A JaxLoader takes the state every batch; the fingerprint read the stream's
    element_spec() each time."""
    calls = []

    class Declared:
        def __iter__(self) -> Any:
            return iter(np.arange(6, dtype=np.int64))

        def element_spec(self) -> mixle.ArraySpec:
            calls.append(1)
            return mixle.ArraySpec((), np.int64)

    loader = mixle.Loader(Declared(), 2, check_spec=False)
    before = len(calls)
    states = []
    for _ in loader:
        states.append(loader.state_dict())
    assert len(calls) - before == 1
    assert len({s["source"] for s in states}) == 1
    loader.load_state_dict(states[0])
