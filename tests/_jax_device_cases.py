"""Epochs on the device: ``DeviceSource``, ``scan_epoch`` and their seams with the Loader.

Run by ``tests/test_jax_device.py`` in a fresh interpreter with 4 forced CPU devices
(``XLA_FLAGS=--xla_force_host_platform_device_count=4``): a live JAX backend must stay out
of the main pytest process (it warns on every ``os.fork()``), and the device count is read
once, at import.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = jax.numpy

import mixle  # noqa: E402
from mixle import Loader, MemorySource, PatchSampler  # noqa: E402
from mixle.errors import DeviceMemoryError, DtypeOverflowError, DtypePolicyError  # noqa: E402
from mixle.jax import DeviceSource, record_key_data, scan_epoch  # noqa: E402
from mixle.jax import device_source as device_source_module  # noqa: E402

P = jax.sharding.PartitionSpec


def columns(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "x": rng.standard_normal((n, 3), dtype=np.float32),
        "y": rng.standard_normal(n).astype(np.float32),
        "id": np.arange(n, dtype=np.int32),
    }


def host_batches(data: Any, batch_size: int, **options: Any) -> list[tuple[int, int, Any]]:
    """``(epoch, batch number, batch)`` of a host Loader run, in order."""
    loader = Loader(MemorySource(data), batch_size, num_threads=0, **options)
    out: list[tuple[int, int, Any]] = []
    for batch in loader:
        epoch = loader.last_epoch
        t = sum(1 for e, _, _ in out if e == epoch)
        out.append((epoch, t, batch))
    return out


def assert_tree_equal(device: Any, host: Any) -> None:
    assert jax.tree_util.tree_structure(device) == jax.tree_util.tree_structure(host)
    for got, want in zip(jax.tree_util.tree_leaves(device), jax.tree_util.tree_leaves(host)):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


# -- DeviceSource ------------------------------------------------------------------------
def test_arrays_contract() -> None:
    data = columns(10)
    src = DeviceSource(data)
    assert len(src) == 10
    spec = src.element_spec()
    assert spec["x"] == jax.ShapeDtypeStruct((3,), jnp.float32)
    assert spec["id"] == jax.ShapeDtypeStruct((), jnp.int32)
    assert_tree_equal(src[3], {k: v[3] for k, v in data.items()})
    assert_tree_equal(src[-1], {k: v[-1] for k, v in data.items()})
    idx = np.array([[0, 9], [4, -2]])
    assert_tree_equal(src.gather(idx), {k: v[idx] for k, v in data.items()})
    assert "DeviceSource(10 records" in repr(src)
    assert src.num_batches(4) == 3 and src.num_batches(4, drop_last=True) == 2
    with pytest.raises(IndexError, match="10"):
        src.gather(np.array([10]))
    with pytest.raises(IndexError, match="-11"):
        src[-11]
    with pytest.raises(TypeError, match="integers"):
        src.gather(np.array([0.5]))


def test_device_arrays_never_alias_the_input() -> None:
    data = {"x": np.arange(8, dtype=np.float32)}
    src = DeviceSource(data)
    data["x"][:] = -1
    np.testing.assert_array_equal(np.asarray(src.arrays["x"]), np.arange(8))


def test_single_array_and_tuple_records() -> None:
    arr = np.arange(24, dtype=np.float32).reshape(6, 4)
    src = DeviceSource(arr)
    np.testing.assert_array_equal(np.asarray(src.get_batch_at(4, 4)), arr[[4, 5, 0, 1]])
    pair = DeviceSource((arr, arr[:, 0]))
    got = pair.get_batch_at(0, 2)
    assert isinstance(got, tuple) and got[1].shape == (2,)


@pytest.mark.parametrize(
    ("n", "batch_size", "drop_last"),
    [(1, 4, False), (7, 1, True), (16, 4, False), (33, 16, False), (33, 4, True), (33, 16, "pad")],
)
def test_get_batch_at_under_jit_is_the_loader_batch(
    n: int, batch_size: int, drop_last: Any
) -> None:
    data = columns(n, seed=n)
    src = DeviceSource(data)
    seed = -12345678901234567  # negative and past 32 bits: taken modulo 2**64 like the Loader

    @jax.jit
    def batch_at(src: DeviceSource, t: Any, epoch: Any) -> Any:
        return src.get_batch_at(t * batch_size, batch_size, seed=seed, epoch=epoch)

    runs = host_batches(
        data, batch_size, shuffle=True, seed=seed, num_epochs=3, drop_last=drop_last
    )
    assert runs or drop_last is True
    for epoch, t, host in runs:
        rows = host["id"].shape[0]
        got = batch_at(src, t, epoch)
        if drop_last == "pad":
            host = {k: v for k, v in host.items() if k != "mask"}
        assert_tree_equal({k: v[:rows] for k, v in got.items()}, host)


def test_unshuffled_and_blocked_orders_are_the_loaders() -> None:
    data = columns(23)
    for block in (1, 3, 5, 23, 40):
        src = DeviceSource(data, shuffle_block=block)
        runs = host_batches(data, 5, shuffle=True, seed=7, num_epochs=2, shuffle_block=block)
        for epoch, t, host in runs:
            got = src.get_batch_at(t * 5, 5, seed=7, epoch=epoch)
            rows = host["id"].shape[0]
            assert_tree_equal({k: v[:rows] for k, v in got.items()}, host)
    src = DeviceSource(data)
    for _, t, host in host_batches(data, 5, num_epochs=1):
        rows = host["id"].shape[0]
        assert_tree_equal({k: v[:rows] for k, v in src.get_batch_at(t * 5, 5).items()}, host)


def test_traced_seed_epoch_and_start_compile_once() -> None:
    src = DeviceSource(columns(50))
    traces = []

    @jax.jit
    def batch_at(src: DeviceSource, t: Any, seed: Any, epoch: Any) -> Any:
        traces.append(1)
        return src.indices_at(t * 8, 8, seed=seed, epoch=epoch)

    loader = Loader(MemorySource(columns(50)), 8, shuffle=True, seed=3)
    for epoch in range(3):
        for t in range(6):
            got = batch_at(src, t, np.int32(3), epoch)
            np.testing.assert_array_equal(
                np.asarray(got)[: 50 - t * 8], loader.batch_indices(t, epoch)
            )
    assert len(traces) == 1


def test_vmap_over_batches_and_lax_scan() -> None:
    data = columns(40)
    src = DeviceSource(data)
    stacked = jax.vmap(lambda t: src.get_batch_at(t * 8, 8, seed=1, epoch=2))(jnp.arange(5))
    loader = Loader(MemorySource(data), 8, shuffle=True, seed=1)
    for t in range(5):
        np.testing.assert_array_equal(np.asarray(stacked["id"][t]), loader.batch_indices(t, 2))

    def body(total: Any, t: Any) -> tuple[Any, Any]:
        batch = src.get_batch_at(t * 8, 8, seed=1, epoch=2)
        return total + batch["y"].sum(), batch["id"]

    total, ids = jax.lax.scan(body, jnp.float32(0), jnp.arange(5))
    np.testing.assert_array_equal(np.sort(np.asarray(ids).reshape(-1)), np.arange(40))
    np.testing.assert_allclose(float(total), data["y"].sum(), rtol=1e-5)


def test_from_a_patch_sampler(tmp_path: Path) -> None:
    volume = np.random.default_rng(0).standard_normal((12, 20, 20), dtype=np.float32)
    np.save(tmp_path / "v.npy", volume)
    sampler = PatchSampler(mixle.read_npy(str(tmp_path / "v.npy")), (4, 6, 6), 37, seed=5)
    src = DeviceSource(sampler, read_batch_size=8, progress=False)  # 8 does not divide 37
    patches, coords = sampler.get_batch(np.arange(37))
    assert len(src) == 37
    got_patches, got_coords = src.arrays
    np.testing.assert_array_equal(np.asarray(got_patches), patches)
    assert got_coords.dtype == jnp.int32  # int64 coordinates narrowed after a range check
    np.testing.assert_array_equal(np.asarray(got_coords), coords)
    loader = Loader(sampler, 6, shuffle=True, seed=9, num_threads=0)
    for t, (host_patches, host_coords) in enumerate(loader):
        rows = host_patches.shape[0]
        dev_patches, dev_coords = src.get_batch_at(t * 6, 6, seed=9, epoch=0)
        np.testing.assert_array_equal(np.asarray(dev_patches)[:rows], host_patches)
        np.testing.assert_array_equal(np.asarray(dev_coords)[:rows], host_coords)


def test_shuffle_block_comes_from_the_source() -> None:
    class Blocked(MemorySource):
        shuffle_block = 4

    data = columns(18)
    src = DeviceSource(Blocked(data), progress=False)
    assert src.shuffle_block == 4
    loader = Loader(Blocked(data), 6, shuffle=True, seed=2, num_threads=0)
    for t, host in enumerate(loader):
        rows = host["id"].shape[0]
        np.testing.assert_array_equal(
            np.asarray(src.get_batch_at(t * 6, 6, seed=2, epoch=0)["id"])[:rows], host["id"]
        )


def test_sharded_over_four_devices() -> None:
    assert jax.device_count() == 4
    mesh = jax.make_mesh((4,), ("data",))
    sharding = jax.sharding.NamedSharding(mesh, P("data"))
    data = columns(64)
    src = DeviceSource(data, sharding=sharding)
    for leaf in jax.tree_util.tree_leaves(src.arrays):
        assert leaf.sharding == sharding
        assert {s.data.shape[0] for s in leaf.addressable_shards} == {16}
    batch = jax.jit(lambda s, e: s.get_batch_at(8, 16, seed=4, epoch=e))(src, 1)
    assert batch["x"].sharding.spec[0] == "data"
    want = Loader(MemorySource(data), 16, shuffle=True, seed=4).batch_indices(0, 1)
    np.testing.assert_array_equal(
        np.asarray(batch["id"]),
        np.asarray(DeviceSource(data).indices_at(8, 16, seed=4, epoch=1)),
    )
    assert want.shape == (16,)
    state = scan_epoch(lambda c, b: c + b["y"].sum(), jnp.float32(0), src, 16, seed=4, epoch=1)
    np.testing.assert_allclose(float(state), data["y"].sum(), rtol=1e-5)
    with pytest.raises(ValueError, match="splits the record axis 4 ways, but there are 10"):
        DeviceSource(columns(10), sharding=sharding)


@pytest.mark.parametrize("explicit", [True, False])
def test_sharded_arrays_and_sources_on_both_mesh_kinds(explicit: bool) -> None:
    devices = np.array(jax.devices())
    if explicit:
        mesh = jax.make_mesh((4,), ("data",), axis_types=(jax.sharding.AxisType.Explicit,))
    else:
        mesh = jax.sharding.Mesh(devices, ("data",))  # auto axes
    sharding = jax.sharding.NamedSharding(mesh, P("data"))
    data = columns(24)
    for src in (
        DeviceSource(data, sharding=sharding),
        DeviceSource(MemorySource(data), sharding=sharding, read_batch_size=5, progress=False),
    ):
        assert_tree_equal(src.arrays, data)
        assert src.arrays["x"].sharding.is_equivalent_to(sharding, 2)
        got = jax.jit(lambda s: s.get_batch_at(4, 8, seed=1, epoch=0))(src)
        want = Loader(MemorySource(data), 8, shuffle=True, seed=1).batch_indices(0, 0)
        np.testing.assert_array_equal(
            np.asarray(got["id"]), np.asarray(DeviceSource(data).indices_at(4, 8, seed=1))
        )
        assert want.size == 8
        state = scan_epoch(lambda c, b: c + b["y"].sum(), jnp.float32(0), src, 8, seed=2)
        np.testing.assert_allclose(float(state), data["y"].sum(), rtol=1e-5)


def test_traced_starts_wrap_and_int64_indices_are_checked() -> None:
    src = DeviceSource(columns(24))
    got = jax.jit(lambda st: src.indices_at(st, 3))(-1)
    np.testing.assert_array_equal(np.asarray(got), [23, 0, 1])
    with pytest.raises(IndexError, match="4294967297"):
        src.gather(np.array([2**32 + 1]))


def test_a_source_that_returns_extra_rows_is_refused() -> None:
    class Long(MemorySource):
        def get_batch(self, indices: Any) -> Any:
            batch = super().get_batch(indices)
            if len(indices) > 1:  # one row too many from a full read
                return {k: np.concatenate([v, v[:1]]) for k, v in batch.items()}
            return batch

    with pytest.raises(ValueError, match="breaks its own element_spec"):
        DeviceSource(Long(columns(8)), read_batch_size=4, progress=False)


# -- errors ------------------------------------------------------------------------------
def test_bad_input_errors() -> None:
    with pytest.raises(TypeError, match="data=3"):
        DeviceSource(3)
    with pytest.raises(TypeError, match=r"data='path\.zarr'"):
        DeviceSource("path.zarr")
    with pytest.raises(ValueError, match="no records"):
        DeviceSource({"x": np.zeros((0, 2), np.float32)})
    with pytest.raises(ValueError, match="different record counts"):
        DeviceSource({"x": np.zeros(3, np.float32), "y": np.zeros(4, np.float32)})
    with pytest.raises(ValueError, match=r"data\['x'\] is 0-d"):
        DeviceSource({"x": np.ones((), np.float32)})
    with pytest.raises(DtypePolicyError, match=r"data\['x'\] is float64"):
        DeviceSource({"x": np.zeros(3)})
    with pytest.raises(DtypeOverflowError, match="outside int32"):
        DeviceSource({"x": np.array([0, 2**40])})
    assert DeviceSource({"x": np.zeros(3)}, dtype_policy="cast").arrays["x"].dtype == jnp.float32
    with pytest.raises(ValueError, match="dtype_policy"):
        DeviceSource({"x": np.zeros(3, np.float32)}, dtype_policy="fast")
    with pytest.raises(ValueError, match="both given"):
        DeviceSource(
            np.zeros(4, np.float32),
            device=jax.devices()[0],
            sharding=jax.sharding.SingleDeviceSharding(jax.devices()[0]),
        )
    with pytest.raises(TypeError, match="device='gpu'"):
        DeviceSource(np.zeros(4, np.float32), device="gpu")
    with pytest.raises(ValueError, match="read_batch_size=0"):
        DeviceSource(MemorySource(columns(4)), read_batch_size=0)
    with pytest.raises(ValueError, match="shuffle_block"):
        DeviceSource(np.zeros(4, np.float32), shuffle_block=0)
    src = DeviceSource(np.zeros(4, np.float32))
    with pytest.raises(IndexError, match="start=4"):
        src.get_batch_at(4, 2)
    with pytest.raises(ValueError, match="size=0"):
        src.get_batch_at(0, 0)


def test_too_big_for_the_device_fails_before_copying(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(device_source_module, "free_device_bytes", lambda device: 1000)
    before = len(jax.live_arrays())
    with pytest.raises(DeviceMemoryError, match=r"needs 0\.00 GiB .* 0\.00 GiB free") as info:
        DeviceSource({"x": np.zeros((100, 4), np.float32)})
    assert isinstance(info.value, MemoryError)
    assert len(jax.live_arrays()) == before  # nothing was copied

    reads = []

    class Counted(MemorySource):
        def get_batch(self, indices: Any) -> Any:
            reads.append(len(indices))
            return super().get_batch(indices)

    with pytest.raises(DeviceMemoryError):
        DeviceSource(Counted(columns(100)), progress=False)
    assert reads == [1]  # one record read to learn its size, then refused


def test_free_device_bytes_on_cpu() -> None:
    free = device_source_module.free_device_bytes(jax.devices()[0])
    assert free is None or free > 0


# -- scan_epoch --------------------------------------------------------------------------
def linear_data(n: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(n)
    x = rng.standard_normal((n, 4), dtype=np.float32)
    y = (x @ np.array([1.0, -2.0, 0.5, 3.0], np.float32) + 0.1).astype(np.float32)
    return {"x": x, "y": y}


def sgd(params: Any, batch: Any) -> Any:
    w, b = params
    mask = batch.get("mask", jnp.ones(batch["y"].shape, bool)).astype(jnp.float32)

    def loss(p: Any) -> Any:
        err = batch["x"] @ p[0] + p[1] - batch["y"]
        return (mask * err**2).sum() / mask.sum()

    grads = jax.grad(loss)((w, b))
    return (w - 0.05 * grads[0], b - 0.05 * grads[1])


@pytest.mark.parametrize(
    ("n", "batch_size", "drop_last"),
    [(37, 8, False), (37, 8, True), (37, 8, "pad"), (32, 8, False), (5, 8, "pad"), (5, 8, True)],
)
def test_scan_epoch_trains_like_the_host_loop(n: int, batch_size: int, drop_last: Any) -> None:
    data = linear_data(n)
    src = DeviceSource(data)
    params0 = (jnp.zeros(4), jnp.zeros(()))
    host_step = jax.jit(sgd)
    params = params0
    for epoch in range(3):
        params = scan_epoch(sgd, params, src, batch_size, seed=11, epoch=epoch, drop_last=drop_last)
    expected = params0
    for _, _, batch in host_batches(
        data, batch_size, shuffle=True, seed=11, num_epochs=3, drop_last=drop_last
    ):
        expected = host_step(expected, batch)
    for got, want in zip(params, expected):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2e-5, atol=1e-6)


def test_scan_epoch_compiles_once_per_batch_shape() -> None:
    src = DeviceSource(linear_data(37))
    traces = []

    def step(params: Any, batch: Any) -> Any:
        traces.append(batch["y"].shape)
        return sgd(params, batch)

    compiles = []

    def listener(name: str, duration: float, **kwargs: Any) -> None:
        if name == "/jax/core/compile/backend_compile_duration":
            compiles.append(name)

    # committed to the device, as the scan's outputs are: an uncommitted input is a
    # different jit cache entry (JAX's rule, not the scan's)
    params = jax.device_put((jnp.zeros(4), jnp.zeros(())), jax.devices()[0])
    params = scan_epoch(step, params, src, 8, seed=2**63 + 1, epoch=0)
    jax.block_until_ready(params)
    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        for epoch in range(1, 4):
            params = scan_epoch(step, params, src, 8, seed=2**63 + 1, epoch=epoch)
        jax.block_until_ready(params)
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    assert sorted(traces) == [(5,), (8,)]  # the full batches' scan and the short tail
    assert compiles == []


def test_scan_epoch_aux_and_info() -> None:
    data = linear_data(30)
    src = DeviceSource(data)
    seed, epoch = 5, 2

    def step(total: Any, batch: Any, info: Any) -> tuple[Any, Any]:
        key_bits = jax.random.key_data(info.keys)
        return total + 1, (info.indices, info.mask, key_bits, info.batch, batch["y"])

    for batch_size, drop_last in [(8, "pad"), (6, False), (4, True)]:
        total, (indices, mask, bits, numbers, ys) = scan_epoch(
            step,
            jnp.int32(0),
            src,
            batch_size,
            seed=seed,
            epoch=epoch,
            drop_last=drop_last,
            with_info=True,
            has_aux=True,
        )
        loader = Loader(
            MemorySource(data), batch_size, shuffle=True, seed=seed, drop_last=drop_last
        )
        nb = len(loader)
        assert int(total) == nb
        np.testing.assert_array_equal(np.asarray(numbers), np.arange(nb))
        flat = np.asarray(indices).reshape(-1)
        real = np.asarray(mask).reshape(-1)
        want = np.concatenate([loader.batch_indices(t, epoch) for t in range(nb)])
        np.testing.assert_array_equal(flat, want)  # padding rows repeat records, as here
        assert real.sum() == (30 if drop_last is not True else 28)
        assert real[: real.sum()].all()
        np.testing.assert_array_equal(np.asarray(ys).reshape(-1), data["y"][flat])
        keys = np.asarray(bits).reshape(-1, 2)
        np.testing.assert_array_equal(keys, record_key_data(seed, epoch, flat))


def test_scan_epoch_aux_with_a_short_last_batch() -> None:
    src = DeviceSource(linear_data(30))

    def loss_and_rows(total: Any, batch: Any) -> tuple[Any, Any]:
        return total, (batch["y"].sum(), batch["y"])

    with pytest.raises(ValueError, match="drop_last='pad'"):
        scan_epoch(loss_and_rows, 0.0, src, 7, has_aux=True)
    _, sums = scan_epoch(lambda c, b: (c, b["y"].sum()), 0.0, src, 7, has_aux=True)
    assert sums.shape == (5,)


def test_scan_epoch_keys_do_not_depend_on_the_batch_size() -> None:
    src = DeviceSource(linear_data(24))

    def step(total: Any, batch: Any, info: Any) -> tuple[Any, Any]:
        return total, (info.indices, jax.random.key_data(info.keys))

    seen = []
    for batch_size in (3, 8, 24):
        _, (indices, bits) = scan_epoch(
            step, jnp.int32(0), src, batch_size, seed=9, epoch=1, with_info=True, has_aux=True
        )
        order = np.argsort(np.asarray(indices).reshape(-1))
        seen.append(np.asarray(bits).reshape(-1, 2)[order])
    np.testing.assert_array_equal(seen[0], seen[1])
    np.testing.assert_array_equal(seen[0], seen[2])


def test_scan_epoch_without_shuffle_and_with_no_batch() -> None:
    data = linear_data(6)
    src = DeviceSource(data)

    def collect(total: Any, batch: Any) -> tuple[Any, Any]:
        return total, batch["y"]

    _, ys = scan_epoch(collect, 0.0, src, 2, shuffle=False, has_aux=True)
    np.testing.assert_array_equal(np.asarray(ys).reshape(-1), data["y"])
    state, aux = scan_epoch(collect, 0.0, src, 8, drop_last=True, has_aux=True)
    assert state == 0.0 and aux is None


def test_scan_epoch_errors() -> None:
    src = DeviceSource(linear_data(6))
    with pytest.raises(TypeError, match="DeviceSource"):
        scan_epoch(sgd, None, linear_data(6), 2)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="batch_size=0"):
        scan_epoch(sgd, None, src, 0)
    with pytest.raises(ValueError, match="drop_last='no'"):
        scan_epoch(sgd, None, src, 2, drop_last="no")
    with pytest.raises(ValueError, match="epoch=-1"):
        scan_epoch(sgd, None, src, 2, epoch=-1)
    with pytest.raises(TypeError, match="seed"):
        scan_epoch(sgd, None, src, 2, seed=1.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="has_aux=True"):
        scan_epoch(lambda c, b: c, jnp.float32(0), src, 2, has_aux=True)


def test_no_global_config_changed() -> None:
    assert not jax.config.jax_enable_x64
