"""The JAX backend in one process on the default CPU device: dtypes, prefetch, JaxLoader.

Run by ``tests/test_jax.py`` in a fresh interpreter (``python3 -m pytest
tests/_jax_cases.py``): once JAX has started its backend threads it warns on every
``os.fork()``, which the fork-based tests of the main run must not see.
"""

from __future__ import annotations

import gc
import importlib
import itertools
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

jax = pytest.importorskip("jax")

import mixle  # noqa: E402
from mixle import Loader, LoaderStateError, PatchSampler  # noqa: E402
from mixle.jax import (  # noqa: E402
    THREAD_NAME,
    DtypeOverflowError,
    DtypePolicyError,
    JaxLoader,
    batch_axis_blocks,
    device_dtype,
    prefetch_to_device,
    process_shard,
    to_jax,
)
from mixle.loading.prefetch import THREAD_NAME_PREFIX  # noqa: E402


class Records:
    """Dict records that hold their index: ``i`` int64, ``x`` float32; with ``get_batch``."""

    def __init__(self, n: int, fail_at: int | None = None) -> None:
        self.n = n
        self.fail_at = fail_at

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self.get_batch(np.array([i]))  # unused by the Loader: get_batch exists

    def get_batch(self, indices: Any) -> dict[str, Any]:
        idx = np.asarray(indices, dtype=np.int64)
        if self.fail_at is not None and self.fail_at in idx:
            raise OSError(f"record {self.fail_at} is unreadable")
        return {"i": idx.copy(), "x": np.stack([idx, -idx], axis=1).astype(np.float32)}


def live_threads() -> list[str]:
    return [
        t.name
        for t in threading.enumerate()
        if t.name.startswith((THREAD_NAME, THREAD_NAME_PREFIX))
    ]


def host(batch: Any) -> Any:
    return jax.tree_util.tree_map(np.asarray, batch)


def assert_same(device_batch: Any, numpy_batch: Any) -> None:
    got, want = jax.tree_util.tree_flatten(host(device_batch))
    expected, structure = jax.tree_util.tree_flatten(numpy_batch)
    assert want == structure
    for a, b in zip(got, expected):
        np.testing.assert_array_equal(a, b)


@pytest.fixture(autouse=True)
def _jax_config_unchanged() -> Iterator[None]:
    """Every test here leaves JAX's global configuration as it found it, and no threads."""
    before = dict(jax.config.values)
    yield
    gc.collect()
    assert dict(jax.config.values) == before
    assert not live_threads()


# -- to_jax and the dtype policy -----------------------------------------------------------
def test_to_jax_values_and_safe_dtypes() -> None:
    patches = np.random.default_rng(0).standard_normal((4, 3, 3), dtype=np.float32)
    coords = np.array([[0, 5], [7, 2], [2**31 - 1, 0], [-(2**31), 1]], dtype=np.int64)
    batch = {
        "patch": patches,
        "coords": coords,
        "u": np.array([0, 2**32 - 1], dtype=np.uint64),
        "flag": np.array([True, False]),
        "half": np.ones(2, dtype=np.float16),
        "scalar": 3,
        "nested": [np.arange(3, dtype=np.int8), (np.zeros(2, np.uint16),)],
    }
    out = to_jax(batch)
    assert all(isinstance(leaf, jax.Array) for leaf in jax.tree_util.tree_leaves(out))
    assert out["coords"].dtype == np.int32 and out["u"].dtype == np.uint32
    assert out["patch"].dtype == np.float32 and out["half"].dtype == np.float16
    assert out["nested"][0].dtype == np.int8 and out["nested"][1][0].dtype == np.uint16
    assert out["flag"].dtype == np.bool_ and out["scalar"].dtype == np.int32
    expected = {**batch, "patch": patches.copy(), "scalar": np.int32(3)}
    assert_same(out, expected)
    patches[0] = 99.0  # the device copy does not follow later changes of the NumPy input
    assert_same(out, expected)
    # jax may build a CPU array on a (64-byte aligned) NumPy buffer; to_jax copies first
    inputs = [np.zeros((64, 64), np.float32) for _ in range(20)]
    placed = [to_jax(a) for a in inputs] + [to_jax({"a": a})["a"] for a in inputs]
    for a in inputs:
        a += 1
    assert all(float(np.asarray(p).max()) == 0.0 for p in placed)
    # a batch that is already on the device passes through
    assert_same(to_jax(out), expected)
    assert to_jax(out)["coords"].dtype == np.int32


def test_safe_policy_refuses_float64_and_values_that_do_not_fit() -> None:
    with pytest.raises(DtypePolicyError, match=r"batch\['x'\]\[1\] is float64") as info:
        to_jax({"x": [np.zeros(2, np.float32), np.zeros(2)]})
    assert isinstance(info.value, TypeError)
    assert "dtype_policy='cast'" in str(info.value) and "jax_enable_x64" in str(info.value)
    with pytest.raises(DtypePolicyError, match=r"batch\[0\] is complex128"):
        to_jax((np.zeros(2, np.complex128),))
    big = np.array([1, 2**31], dtype=np.int64)
    with pytest.raises(
        DtypeOverflowError, match=r"batch\['i'\] is int64 with values in \[1, 2147483648\]"
    ) as err:
        to_jax({"i": big})
    assert isinstance(err.value, OverflowError) and isinstance(err.value, TypeError)
    assert "dtype_policy='cast'" in str(err.value)
    with pytest.raises(DtypeOverflowError, match="outside uint32"):
        to_jax(np.array([2**32], dtype=np.uint64))
    assert to_jax(np.zeros(0, np.int64)).dtype == np.int32  # nothing to check in an empty leaf


def test_cast_and_error_policies() -> None:
    batch = (np.array([0.5, 2.0]), np.array([1, 2**32 + 5], dtype=np.int64))
    f, i = to_jax(batch, dtype_policy="cast")
    assert f.dtype == np.float32 and i.dtype == np.int32
    np.testing.assert_array_equal(np.asarray(f), [0.5, 2.0])
    np.testing.assert_array_equal(np.asarray(i), [1, 5])  # wraps, as documented
    with pytest.raises(DtypePolicyError, match=r"batch\[1\] is int64.*dtype_policy='error'"):
        to_jax((np.zeros(2, np.float32), np.zeros(2, np.int64)), dtype_policy="error")
    ok = to_jax({"a": np.zeros(2, np.float32), "b": np.zeros(2, np.int32)}, dtype_policy="error")
    assert ok["b"].dtype == np.int32
    assert device_dtype(np.int64, "cast") == np.int32


def test_x64_context_keeps_64_bit_types_under_every_policy() -> None:
    enable = getattr(jax, "enable_x64", None)
    context = enable(True) if enable is not None else jax.experimental.enable_x64()
    with context:
        for policy in ("safe", "cast", "error"):
            out = to_jax({"f": np.ones(2), "i": np.array([2**40])}, dtype_policy=policy)
            assert out["f"].dtype == np.float64 and out["i"].dtype == np.int64
            assert int(out["i"][0]) == 2**40
    assert to_jax(np.array([3])).dtype == np.int32


def test_to_jax_argument_errors() -> None:
    dev = jax.devices()[0]
    sharding = jax.sharding.SingleDeviceSharding(dev)
    out = to_jax(np.arange(3.0, dtype=np.float32), device=dev)
    assert out.devices() == {dev}
    assert to_jax(np.arange(2, dtype=np.int8), sharding=sharding).sharding == sharding
    with pytest.raises(ValueError, match="were both given; pass one"):
        to_jax(np.zeros(2, np.float32), device=dev, sharding=sharding)
    with pytest.raises(TypeError, match=r"sharding='data' must be a jax.sharding.Sharding"):
        to_jax(np.zeros(2, np.float32), sharding="data")
    with pytest.raises(ValueError, match=r"dtype_policy='narrow' must be one of 'safe'"):
        to_jax(np.zeros(2, np.float32), dtype_policy="narrow")  # type: ignore[arg-type]
    with pytest.raises(DtypePolicyError, match=r"batch\['s'\] has dtype <U1.*cannot hold"):
        to_jax({"s": np.array(["a", "b"])})


# -- prefetch_to_device ---------------------------------------------------------------------
def test_prefetch_yields_device_batches_in_order() -> None:
    batches = [
        {"a": np.full(3, k, np.int64), "b": np.ones((2, 2), np.float32) * k} for k in range(7)
    ]
    for size in (0, 1, 3):
        out = list(prefetch_to_device(iter(batches), size))
        assert len(out) == 7
        for got, want in zip(out, batches):
            assert_same(got, want)
            assert got["a"].dtype == np.int32


def test_prefetch_reads_ahead_but_stays_bounded() -> None:
    drawn: list[int] = []
    third = threading.Event()

    def endless() -> Iterator[np.ndarray]:
        for k in itertools.count():
            drawn.append(k)
            if k == 2:
                third.set()
            yield np.array([k], dtype=np.int32)

    stream = prefetch_to_device(endless(), size=3)
    first = next(stream)
    assert int(first[0]) == 0
    assert third.wait(timeout=60)  # items 1 and 2 are drawn before the loop asks for them
    taken = 1 + sum(1 for _ in itertools.islice(stream, 4))
    assert len(drawn) <= taken + 3  # never more than `size` waiting for the caller
    stream.close()  # type: ignore[attr-defined]
    assert not live_threads()  # closed: the thread is joined, nothing more is drawn


def test_prefetch_stops_on_break_and_garbage_collection() -> None:
    closed = threading.Event()

    def source() -> Iterator[np.ndarray]:
        try:
            for k in itertools.count():
                yield np.array([k], dtype=np.float32)
        finally:
            closed.set()

    for batch in prefetch_to_device(source(), size=2):
        if float(batch[0]) == 3:
            break
    gc.collect()
    assert closed.is_set() and not live_threads()
    with prefetch_to_device(source(), size=2) as stream:  # type: ignore[attr-defined]
        next(stream)
    assert not live_threads()


def test_prefetch_reraises_errors_in_the_caller() -> None:
    def failing() -> Iterator[np.ndarray]:
        yield np.zeros(2, np.float32)
        raise OSError("disk went away")

    stream = prefetch_to_device(failing(), size=2)
    assert next(stream).shape == (2,)
    with pytest.raises(OSError, match="disk went away") as info:
        next(stream)
    assert "failing" in "".join(str(entry.name) for entry in info.traceback)
    with pytest.raises(StopIteration):
        next(stream)
    # a placement error (policy) is re-raised the same way
    bad = prefetch_to_device(iter([np.zeros(2)]), size=1)
    with pytest.raises(DtypePolicyError, match="float64"):
        next(bad)
    with pytest.raises(ValueError, match=r"size=-1 must be >= 0"):
        prefetch_to_device(iter([]), -1)


def test_close_from_another_thread_ends_a_waiting_loop() -> None:
    gate = threading.Event()

    def slow() -> Iterator[np.ndarray]:
        yield np.zeros(1, np.float32)
        gate.wait(timeout=60)  # the loop waits here for the next batch
        yield np.ones(1, np.float32)

    stream = prefetch_to_device(slow(), size=1)
    next(stream)
    rest: list[Any] = []
    loop = threading.Thread(target=lambda: rest.extend(stream), daemon=True)
    loop.start()
    closer = threading.Thread(target=stream.close, daemon=True)  # type: ignore[attr-defined]
    closer.start()
    gate.set()
    closer.join(timeout=60)
    loop.join(timeout=60)
    assert not closer.is_alive() and not loop.is_alive()  # the waiting loop ended
    assert len(rest) <= 1


# -- JaxLoader ------------------------------------------------------------------------------
@pytest.mark.parametrize("prefetch", [0, 2])
def test_jax_loader_batches_equal_the_loaders(prefetch: int) -> None:
    src = Records(23)
    options = {"shuffle": True, "seed": 5, "num_epochs": 2, "drop_last": "pad"}
    expected = list(Loader(src, 4, **options))
    jl = JaxLoader(src, 4, prefetch=prefetch, **options)
    got = list(jl)
    assert len(got) == len(expected) == 2 * 6
    for g, e in zip(got, expected):
        assert_same(g, {**e, "i": e["i"].astype(np.int32)})
        assert g["mask"].dtype == np.bool_ and isinstance(g["mask"], jax.Array)
    assert int(np.asarray(got[5]["mask"]).sum()) == 23 - 5 * 4
    assert jl.state_dict() == Loader(src, 4, **options).state_dict() | {"epoch": 2}
    assert list(jl) == []  # the run is over, as for the Loader


def test_patch_batches_and_the_loader_shortcut() -> None:
    volume = np.random.default_rng(1).standard_normal((12, 20, 20), dtype=np.float32)
    sampler = PatchSampler(volume, (4, 6, 6), 30, seed=2)
    loader = Loader(sampler, 8, drop_last="pad", shuffle=True, seed=3)
    jl = loader.to_jax(prefetch=1)
    assert isinstance(jl, JaxLoader) and jl.loader is loader
    spec = jl.element_spec()
    assert [s.shape for s in spec] == [(8, 4, 6, 6), (8, 3), (8,)]
    assert [s.dtype for s in spec] == [np.float32, np.int32, np.bool_]
    reference = Loader(sampler, 8, drop_last="pad", shuffle=True, seed=3)
    for (patches, coords, mask), (p, c, m) in zip(jl, reference, strict=True):
        assert coords.dtype == np.int32  # int64 corners narrowed after the range check
        assert_same((patches, coords, mask), (p, c.astype(np.int32), m))


def test_element_spec_compiles_the_step_once_before_the_first_batch() -> None:
    traces = []

    def step(total: Any, batch: dict[str, Any]) -> Any:
        traces.append(1)
        weights = batch["mask"].astype(np.float32)
        return total + (batch["x"][:, 0] * weights).sum()  # x[:, 0] is the record index

    jl = JaxLoader(Records(10), 4, drop_last="pad", num_epochs=3)
    spec = jl.element_spec()
    assert spec["i"].dtype == np.int32 and spec["mask"].shape == (4,)
    jitted = jax.jit(step)
    compiled = jitted.lower(jax.ShapeDtypeStruct((), np.float32), spec).compile()
    total = np.float32(0)
    for batch in jl:
        mixle.validate_batch(batch, jax.tree_util.tree_map(_as_array_spec, spec))
        total = compiled(total, batch)
        total = jitted(total, batch)
    assert len(traces) == 1  # lowering traced it; 9 batches of one shape add no trace
    assert float(total) == 2 * 3 * sum(range(10))


def _as_array_spec(s: Any) -> mixle.ArraySpec:
    return mixle.ArraySpec(s.shape, s.dtype)


def test_element_spec_raises_the_policy_error_early() -> None:
    jl = JaxLoader(np.zeros((6, 2)), 2)  # float64 records
    with pytest.raises(DtypePolicyError, match=r"batch is float64"):
        jl.element_spec()
    assert JaxLoader(np.zeros((6, 2)), 2, dtype_policy="cast").element_spec().dtype == np.float32
    dev = jax.devices()[0]
    spec = JaxLoader(np.zeros((6, 2), np.float32), 2, device=dev).element_spec()
    assert spec.sharding == jax.sharding.SingleDeviceSharding(dev)


@pytest.mark.parametrize("prefetch", [0, 3])
def test_resume_gives_the_same_remaining_batches(prefetch: int) -> None:
    src = Records(19)
    options = {"shuffle": True, "seed": 9, "num_epochs": 3, "drop_last": "pad"}
    full = [host(b)["i"].tolist() for b in JaxLoader(src, 4, prefetch=prefetch, **options)]
    for stop in (0, 3, 4, 7, 14):
        jl = JaxLoader(src, 4, prefetch=prefetch, **options)
        seen = []
        state = jl.state_dict()
        for step, batch in enumerate(jl):
            if step == stop:
                break
            seen.append(host(batch)["i"].tolist())
            state = jl.state_dict()
        # a new iter() continues after the last batch received: prefetched ones are not lost
        again = [host(b)["i"].tolist() for b in itertools.islice(jl, 2)]
        assert again == full[stop + 1 : stop + 3]  # batch `stop` was received, then break
        restarted = JaxLoader(src, 4, prefetch=prefetch, **options)
        restarted.load_state_dict(state)
        assert seen + [host(b)["i"].tolist() for b in restarted] == full
        assert restarted.state_dict()["epoch"] == 3
    with pytest.raises(LoaderStateError, match="seed"):
        JaxLoader(src, 4, **{**options, "seed": 1}).load_state_dict(state)


def test_reader_errors_reach_the_loop_and_threads_stop() -> None:
    jl = JaxLoader(Records(20, fail_at=13), 4, num_threads=2, prefetch=2)
    got: list[list[int]] = []

    def consume() -> None:
        for batch in jl:
            got.append(host(batch)["i"].tolist())

    with pytest.raises(OSError, match="record 13 is unreadable"):
        consume()
    assert got == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert jl.state_dict()["batch"] == 3
    with JaxLoader(Records(40), 4, num_epochs=None) as endless:
        next(iter(endless))
    assert not live_threads()
    first = JaxLoader(Records(40), 4, num_epochs=None)
    run = iter(first)
    next(run)
    iter(first)  # a new iterator stops the previous one
    del run
    first.close()


def test_default_shard_is_this_process(monkeypatch: pytest.MonkeyPatch) -> None:
    assert process_shard() == (0, 1)
    monkeypatch.setattr(jax, "process_count", lambda: 3)
    monkeypatch.setattr(jax, "process_index", lambda: 2)
    assert process_shard() == (2, 3)
    jl = JaxLoader(Records(30), 4, drop_last="pad")
    lay = jl.loader.layout
    assert (lay.shard_index, lay.num_shards) == (2, 3)
    # blocked shards: process 2 of 3 holds rows [8, 12) of the 12-row global batch
    assert jl.loader.layout.blocked
    assert host(next(iter(jl)))["i"].tolist() == [8, 9, 10, 11]
    jl.close()
    explicit = JaxLoader(Records(30), 4, shard_index=0, num_shards=1)
    assert explicit.loader.layout.num_shards == 1


def test_batch_axis_blocks_per_process() -> None:
    # 2 processes x 2 devices each, mesh ("data",): process p holds rows [p/2, (p+1)/2)
    assert batch_axis_blocks(np.array([0, 0, 1, 1]), ["data"], ["data"], 1) == (1, 2, 2)
    # mesh (data=2, model=2), process = data row: batch split over "data" only
    owners = np.array([[0, 0], [1, 1]])
    assert batch_axis_blocks(owners, ["data", "model"], ["data"], 0) == (0, 2, 1)
    # model axis across processes: both processes hold the same rows, so load the same share
    owners_t = owners.T
    assert batch_axis_blocks(owners_t, ["data", "model"], ["data"], 0) == (0, 1, 2)
    assert batch_axis_blocks(owners_t, ["data", "model"], ["data"], 1) == (0, 1, 2)
    # batch over ("data", "model") on 4 processes: one block each
    four = np.arange(4).reshape(2, 2)
    assert batch_axis_blocks(four, ["data", "model"], ["data", "model"], 2) == (2, 4, 1)
    assert batch_axis_blocks(four, ["data", "model"], ["model", "data"], 2) == (1, 4, 1)
    assert batch_axis_blocks(four, ["data", "model"], [], 3) == (0, 1, 1)  # replicated
    with pytest.raises(ValueError, match=r"holds blocks \[0, 2\].*aligned, contiguous"):
        batch_axis_blocks(np.array([0, 1, 0, 1]), ["data"], ["data"], 0)
    with pytest.raises(ValueError, match="process 5 has no device"):
        batch_axis_blocks(np.array([0, 1]), ["data"], ["data"], 5)
    with pytest.raises(ValueError, match=r"batch axes \['fsdp'\] are not axes"):
        batch_axis_blocks(np.array([0, 1]), ["data"], ["fsdp"], 0)


def test_import_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "jax", None)
    for name in [m for m in sys.modules if m == "mixle.jax" or m.startswith("mixle.jax.")]:
        monkeypatch.delitem(sys.modules, name)
    with pytest.raises(ImportError, match=r'mixle.jax needs jax.*pip install -e "\.\[jax\]"'):
        importlib.import_module("mixle.jax")


def test_tabular_batches_go_to_jax(tmp_path: Path) -> None:
    path = tmp_path / "rows.csv"
    path.write_text("id,value,name\n" + "".join(f"{i},{i / 2},n{i}\n" for i in range(6)))
    src = mixle.read_csv(path, ["id", "value"], dtypes={"value": "float32"})
    batch = to_jax(src.get_batch([3, 1]), dtype_policy="cast")
    assert batch["value"].tolist() == [1.5, 0.5]
    assert batch["id"].tolist() == [3, 1]
