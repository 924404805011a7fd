"""mix: the records are the children's, each at most once (length=None), wrapped in fresh
orders past that, the per-window shares within max_deviation, deterministic whatever the
batching; the Loader seam (per-batch shares, resume, spawn workers equal threads)."""

from __future__ import annotations

import importlib
import pickle
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.typing import ArrayLike

import mixle
from mixle.data.index_math.mixing import visit_records
from mixle.data.index_math.permutation import permute
from mixle.data.sources.compose.mix import MixSource, mix
from mixle.errors import SchemaMismatchError, SourceClosedError

#: Hang guard (seconds per batch) of the worker runs; never reached when it works.
T = 60


class Counting(mixle.Source):
    """Rows of an array, counting get_batch calls."""

    def __init__(self, data: np.ndarray) -> None:
        self.data = data
        self.calls: list[list[int]] = []

    def __len__(self) -> int:
        return len(self.data)

    def get_batch(self, indices: ArrayLike) -> np.ndarray:
        idx = self._indices(indices)
        self.calls.append(idx.tolist())
        return self.data[idx]

    def element_spec(self) -> Any:
        return mixle.ArraySpec(self.data.shape[1:], self.data.dtype)


def rows(n: int, base: int) -> np.ndarray:
    """Row i is [base + i, ...]: every record says where it came from."""
    return (base + np.repeat(np.arange(n), 2).reshape(n, 2)).astype(np.int64)


def three() -> dict[str, Counting]:
    return {"a": Counting(rows(30, 0)), "b": Counting(rows(12, 1000)), "c": Counting(rows(7, 2000))}


def window_ok(counts: dict[str, int], size: int, m: MixSource) -> bool:
    exact = m.plan.shares
    return all(
        abs(counts.get(name, 0) - size * exact[k]) < m.plan.bounds[k] or m.plan.bounds[k] == 0
        for k, name in enumerate(m.names)
    )


def test_records_come_once_each_with_length_none() -> None:
    kids = three()
    m = mix(kids, [3, 1, 1], seed=4)
    n = m.natural_length
    assert len(m) == n
    got = m.get_batch(np.arange(n))
    assert all(len(k.calls) == 1 for k in kids.values())
    values = got[:, 0].tolist()
    assert len(set(values)) == n  # no record twice
    per = {name: sum(1 for v in values if v // 1000 == k) for k, name in enumerate("abc")}
    assert per == m.counts(n)
    # one record more would repeat: some source is used up at n + 1
    assert any(
        c > len(kids[name]) for name, c in mix(kids, [3, 1, 1], seed=4).counts(n + 1).items()
    )
    origins = m.origins(np.arange(n))
    for (name, i), row in zip(origins, got):
        np.testing.assert_array_equal(row, kids[name].data[i])


def test_deterministic_whatever_the_batching() -> None:
    kids = three()
    m = mix(kids, {"a": 0.5, "b": 0.3, "c": 0.2}, seed=11, length=100)
    whole = m.get_batch(np.arange(100))
    pieces = np.concatenate([m.get_batch(np.arange(s, min(100, s + 7))) for s in range(0, 100, 7)])
    np.testing.assert_array_equal(whole, pieces)
    picks = np.array([99, 3, 3, 50, -1, 0])
    np.testing.assert_array_equal(m.get_batch(picks), whole[picks])
    again = mix(three(), {"a": 0.5, "b": 0.3, "c": 0.2}, seed=11, length=100)
    np.testing.assert_array_equal(again.get_batch(np.arange(100)), whole)
    other = mix(three(), {"a": 0.5, "b": 0.3, "c": 0.2}, seed=12, length=100)
    assert not np.array_equal(other.get_batch(np.arange(100)), whole)


def test_the_order_of_the_names_does_not_change_the_mix() -> None:
    kids = three()
    one = mix(kids, {"a": 2, "b": 1, "c": 1}, seed=2)
    two = mix({"c": kids["c"], "a": kids["a"], "b": kids["b"]}, [1, 2, 1], seed=2)
    assert list(one.origins(np.arange(len(one)))) == list(two.origins(np.arange(len(two))))


def test_every_window_holds_the_shares() -> None:
    m = mix(three(), [0.1, 0.25, 0.65], seed=7, length=600)
    names = [name for name, _ in m.origins(np.arange(600))]
    for size in (1, 2, 5, 8, 13, 64, 333):
        for start in range(0, 600 - size + 1, 3):
            part = names[start : start + size]
            assert window_ok({n: part.count(n) for n in set(part)}, size, m), (start, size)
    assert m.max_deviation["c"] >= float(m.plan.bounds[2])
    assert all(float(b) < 2 for b in m.plan.bounds)


def test_wrapping_past_the_natural_length() -> None:
    kids = three()
    m = mix(kids, [1, 1, 1], seed=3, length=120)
    origins = list(m.origins(np.arange(120)))
    visits = {name: [i for n, i in origins if n == name] for name in "abc"}
    for name, got in visits.items():
        size = len(kids[name])
        assert len(got) == m.counts(120)[name]
        for p in range(len(got) // size):  # every whole pass is a permutation...
            assert sorted(got[p * size : (p + 1) * size]) == list(range(size))
        if len(got) > size:  # ... and a fresh one
            assert got[size : 2 * size] != got[:size] or size == 1
    seed_c = m.plan.visit_seed(2)
    assert visits["c"][7:14] == permute(np.arange(7), 7, seed=seed_c, epoch=1).tolist()
    # the first natural_length records are those of the unwrapped mix
    short = mix(kids, [1, 1, 1], seed=3)
    assert origins[: len(short)] == list(short.origins(np.arange(len(short))))


def test_a_wrapped_pass_gives_each_visit_its_own_key() -> None:
    a, b = np.arange(3.0), np.arange(10.0, 15.0)
    cat = mixle.concat({"a": a, "b": b})
    offset = {"a": 0, "b": 3}
    wrapped = mix({"a": a, "b": b}, length=40, seed=3)
    idx = np.arange(40)
    keys = wrapped.record_keys(idx).tolist()
    pairs = list(wrapped.origins(idx))
    assert len(set(keys)) == 40  # every visit its own key
    np.testing.assert_array_equal(wrapped.get_batch(idx), [cat[offset[n] + i] for n, i in pairs])
    seen: set[tuple[str, int]] = set()
    for key, (name, i) in zip(keys, pairs):  # a first visit keeps concat's key
        if (name, i) not in seen:
            assert key == cat.record_keys([offset[name] + i])[0]
            seen.add((name, i))
    natural = mix({"a": a, "b": b}, seed=3)  # within the natural length: concat's keys
    inside = np.arange(len(natural))
    at = [offset[n] + i for n, i in natural.origins(inside)]
    np.testing.assert_array_equal(natural.record_keys(inside), cat.record_keys(at))
    loader = mixle.Loader(
        wrapped, batch_size=8, shuffle=False, record_transform=lambda r, rng: r + rng.random()
    )
    drawn = np.concatenate(list(loader)).tolist()
    assert len(set(drawn)) == 40  # oversampled records draw fresh augmentation


class Ordered(Counting):
    """Counting rows with a declared :class:`mixle.SampleStructure`."""

    def __init__(self, data: np.ndarray, structure: mixle.SampleStructure) -> None:
        super().__init__(data)
        self.structure = structure


def test_a_source_that_may_not_be_reordered_cannot_be_mixed() -> None:
    series = Ordered(rows(6, 0), mixle.SEQUENTIAL)
    with pytest.raises(ValueError, match=r"sources\['series'\] has structure SEQUENTIAL.*weight 0"):
        mix({"series": series, "b": Counting(rows(6, 1000))})
    grouped = Ordered(rows(6, 0), mixle.partially_exchangeable(by="g"))
    with pytest.raises(ValueError, match=r"sources\['0'\] has structure partially_exchangeable"):
        mix([grouped])
    idle = mix({"series": series, "b": Counting(rows(6, 1000))}, [0, 1])  # never read
    assert idle.structure is None
    iid = mix([Ordered(rows(6, 0), mixle.IID), Ordered(rows(4, 9), mixle.IID)])
    assert iid.structure == mixle.IID


def test_weight_zero_is_never_read_and_one_source_is_permuted() -> None:
    kids = three()
    m = mix(kids, [1, 0, 2], seed=5, length=200)
    m.get_batch(np.arange(200))
    assert kids["b"].calls == [] and m.counts(200)["b"] == 0 and m.max_deviation["b"] == 0
    solo = Counting(rows(17, 0))
    one = mix({"only": solo}, seed=8)
    assert len(one) == 17
    got = one.get_batch(np.arange(17))[:, 0].tolist()
    assert got == permute(np.arange(17), 17, seed=one.plan.visit_seed(0)).tolist()
    assert one.max_deviation == {"only": 0.0}


@pytest.mark.parametrize("n", [1, 2, 16, 17])
def test_sizes_of_powers_of_two(n: int) -> None:
    m = mix({"x": Counting(rows(n, 0)), "y": Counting(rows(n, 1000))}, seed=n)
    assert len(m) == m.natural_length <= 2 * n
    values = m.get_batch(np.arange(len(m)))[:, 0].tolist()
    assert len(set(values)) == len(values)
    if n > 1:  # two equal sources: the mix runs until one is used up
        assert len(m) >= 2 * n - 1


def test_bad_arguments() -> None:
    kids = three()
    for weights, error, words in [
        ([1, 1], ValueError, "2 entries for 3"),
        ([1, -1, 1], ValueError, r"weights\[1\]=-1"),
        ([1, float("nan"), 1], ValueError, "finite"),
        ([float("inf"), 1, 1], ValueError, "finite"),
        ([0, 0, 0], ValueError, "sum to 0"),
        ([True, 1, 1], TypeError, "bool"),
        (["1", 1, 1], TypeError, "real number"),
        ({"a": 1, "b": 1}, ValueError, r"missing \['c'\]"),
        (3, TypeError, "weights=3"),
    ]:
        with pytest.raises(error, match=words):
            mix(kids, weights)
    for length, error in [(-1, ValueError), (True, TypeError), (2.0, TypeError), ("3", TypeError)]:
        with pytest.raises(error, match="length"):
            mix(kids, length=length)
    with pytest.raises(TypeError, match="seed"):
        mix(kids, seed=1.5)
    with pytest.raises(ValueError, match=r"sources\['e'\] is empty"):
        mix({"a": kids["a"], "e": Counting(rows(0, 0))})
    assert len(mix({"a": kids["a"], "e": Counting(rows(0, 0))}, [1, 0])) == 30
    with pytest.raises(SchemaMismatchError, match="'a' and 'f'"):
        mix({"a": kids["a"], "f": Counting(rows(3, 0).astype(np.float64))})


def test_exact_rational_weights() -> None:
    m = mix(three(), [Fraction(1, 3), Fraction(1, 3), Fraction(1, 3)], length=90)
    assert m.shares == pytest.approx({"a": 1 / 3, "b": 1 / 3, "c": 1 / 3})
    names = [n for n, _ in m.origins(np.arange(90))]
    assert {n: names.count(n) for n in "abc"} == {"a": 30, "b": 30, "c": 30}


def test_repr_pickle_and_close(tmp_path: Path) -> None:
    np.save(tmp_path / "a.npy", rows(50, 0))
    np.save(tmp_path / "b.npy", rows(40, 1000))
    m = mix(
        {
            "a": mixle.read_npy(str(tmp_path / "a.npy")),
            "b": mixle.read_npy(str(tmp_path / "b.npy")),
        },
        [2, 1],
        seed=9,
        length=70,
    )
    text = repr(m)
    assert text.startswith("MixSource(70 records from 2 sources, seed=9, length=70")
    assert "'a': weight 2 (share 0.667), 50 records, NpyArraySource(" in text
    blob = pickle.dumps(m)
    assert len(blob) < 1500
    copy = pickle.loads(blob)
    np.testing.assert_array_equal(copy.get_batch(np.arange(70)), m.get_batch(np.arange(70)))
    assert (
        copy.fingerprint()
        == m.fingerprint()
        != mix(m.sources, [2, 1], seed=10, length=70).fingerprint()
    )
    m.close()
    assert m.closed and m.sources["a"].closed and "seed=9, length=70, closed" not in repr(m)
    assert "sources, closed, seed=9" in repr(m)
    with pytest.raises(SourceClosedError):
        m.get_batch([0])


# -- the Loader seam ------------------------------------------------------------------------


def npy_mix(tmp_path: Path, **kw: Any) -> MixSource:
    for name, n, base in [("a", 60, 0), ("b", 30, 1000), ("c", 20, 2000)]:
        np.save(tmp_path / f"{name}.npy", rows(n, base))
    kids = {n: mixle.read_npy(str(tmp_path / f"{n}.npy")) for n in "abc"}
    return mix(kids, [0.5, 0.3, 0.2], seed=21, **kw)


def test_loader_batches_keep_the_shares(tmp_path: Path) -> None:
    m = npy_mix(tmp_path)
    loader = mixle.Loader(m, batch_size=8, shuffle=False, num_threads=2)
    seen = 0
    for batch in loader:
        origins = m.origins(loader.last_indices)
        names = [n for n, _ in origins]
        assert window_ok({n: names.count(n) for n in set(names)}, len(names), m)
        for (name, i), row in zip(origins, batch):
            assert row[0] == {"a": 0, "b": 1000, "c": 2000}[name] + i
        seen += len(batch)
    assert seen == len(m)


def shard_names(m: MixSource, layout: str, shards: int = 2) -> list[list[list[str]]]:
    """Per shard, per batch: the source name of each record the shard's Loader gives."""
    out = []
    for s in range(shards):
        loader = mixle.Loader(
            m, batch_size=8, shuffle=False, num_shards=shards, shard_index=s, shard_layout=layout
        )
        batches = []
        for _ in loader:
            batches.append([name for name, _ in m.origins(loader.last_indices)])
        out.append(batches)
    return out


def counts_of(names: list[str]) -> dict[str, int]:
    return {n: names.count(n) for n in set(names)}


@pytest.mark.parametrize("layout", ["interleaved", "blocked"])
def test_with_shards_the_global_batch_keeps_the_shares(layout: str) -> None:
    m = mix({"a": Counting(rows(40, 0)), "b": Counting(rows(40, 1000))}, [1, 1], seed=2)
    per_shard = shard_names(m, layout)
    steps = list(zip(*per_shard))
    assert len(steps) == 5
    for step in steps:  # the shards' batches together: one window of the mix
        together = [name for batch in step for name in batch]
        assert len(together) == 16 and window_ok(counts_of(together), 16, m)
    batches = [batch for shard in per_shard for batch in shard]
    each = [window_ok(counts_of(batch), len(batch), m) for batch in batches]
    if layout == "blocked":  # each shard's batch is a window of its own
        assert all(each)
    else:  # a Sturmian sequence's stride-2 subsequence: one source per shard
        assert not any(each)
        assert all(len(set(batch)) == 1 for batch in batches)


def test_loader_resumes_mid_epoch(tmp_path: Path) -> None:
    m = npy_mix(tmp_path, length=150)
    full = list(mixle.Loader(m, batch_size=8, shuffle=True, seed=3, num_epochs=2))
    first = mixle.Loader(m, batch_size=8, shuffle=True, seed=3, num_epochs=2)
    head = []
    for batch in first:
        head.append(batch)
        if len(head) == 23:  # in epoch 1
            break
    state = first.state_dict()
    rest = mixle.Loader(
        pickle.loads(pickle.dumps(m)), batch_size=8, shuffle=True, seed=3, num_epochs=2
    )
    rest.load_state_dict(state)
    got = head + list(rest)
    assert len(got) == len(full)
    for a, b in zip(got, full):
        np.testing.assert_array_equal(a, b)


def test_spawn_workers_equal_threads(tmp_path: Path) -> None:
    m = npy_mix(tmp_path)
    threads = list(mixle.Loader(m, batch_size=8, shuffle=True, seed=1))
    workers = list(
        mixle.Loader(
            m,
            batch_size=8,
            shuffle=True,
            seed=1,
            num_workers=2,
            worker_start_method="spawn",
            timeout=T,
        )
    )
    assert len(threads) == len(workers)
    for a, b in zip(threads, workers):
        np.testing.assert_array_equal(a, b)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 20), st.integers(0, 4)), min_size=1, max_size=5).filter(
        lambda kids: any(w for _, w in kids)
    ),
    st.integers(0, 2**32),
    st.integers(0, 30),
)
def test_once_each_then_fresh_passes(kids: list[tuple[int, int]], seed: int, extra: int) -> None:
    sources = {f"s{k}": Counting(rows(n, 1000 * k)) for k, (n, _) in enumerate(kids)}
    weights = [w for _, w in kids]
    m = mix(sources, weights, seed=seed)
    pairs = list(m.origins(np.arange(len(m))))
    assert len(set(pairs)) == len(pairs) == len(m)
    assert all(weights[int(name[1:])] > 0 for name, _ in pairs)
    wrapped = mix(sources, weights, seed=seed, length=len(m) + extra)
    longer = list(wrapped.origins(np.arange(len(wrapped))))
    assert longer[: len(m)] == pairs
    for name, source in sources.items():
        got = [i for n, i in longer if n == name]
        size = len(source)
        for p in range(len(got) // size):
            assert sorted(got[p * size : (p + 1) * size]) == list(range(size))
        if got:  # the rows read are those records
            batch = wrapped.get_batch(np.arange(len(wrapped)))
            mine = [row for (n, _), row in zip(longer, batch) if n == name]
            np.testing.assert_array_equal(np.stack(mine), source.data[got])


def test_patch_samplers_and_zarr_children(tmp_path: Path) -> None:
    import zarr

    vol = np.arange(100, dtype=np.float32).reshape(10, 10)
    np.save(tmp_path / "v.npy", vol)
    z = zarr.create_array(str(tmp_path / "v.zarr"), shape=vol.shape, chunks=(4, 4), dtype=vol.dtype)
    z[:] = -vol
    kids = {
        "npy": mixle.PatchSampler(
            mixle.read_npy(str(tmp_path / "v.npy")), patch_size=(3, 3), num_patches=9, seed=1
        ),
        "zarr": mixle.PatchSampler(
            mixle.read_zarr(str(tmp_path / "v.zarr")), patch_size=(3, 3), num_patches=6
        ),
    }
    m = mix(kids, [2, 1], seed=6)
    idx = np.arange(len(m))[::-1]
    patches, coords = m.get_batch(idx)
    for (name, i), patch, corner in zip(m.origins(idx), patches, coords):
        want_patch, want_corner = kids[name].get_batch([i])
        np.testing.assert_array_equal(patch, want_patch[0])
        np.testing.assert_array_equal(corner, want_corner[0])


def test_mix_visits_read_the_records_of_the_index_math_permuting_once_per_pass(
    monkeypatch,
):
    """A mix reads the records visit_records names, and computes each (source, pass) visit
    order once over many batches, not one permute per batch (the fix: visit tables)."""
    mixing = importlib.import_module("mixle.data.index_math.mixing")
    mix_module = importlib.import_module("mixle.data.sources.compose.mix")
    lengths = (50, 70, 300)
    children = [np.stack([np.full(n, k), np.arange(n)], axis=1) for k, n in enumerate(lengths)]
    m = mixle.mix(children, [2, 1, 1], seed=3, length=600)  # the two short sources wrap
    want = []
    for lo in range(0, 600, 20):
        idx = np.arange(lo, lo + 20)
        source, visit = m.plan.assign(idx)
        local = np.array(
            [visit_records([v], lengths[s], m.plan.visit_seed(s))[0] for s, v in zip(source, visit)]
        )
        want.append((idx, source, local, {(s, v // lengths[s]) for s, v in zip(source, visit)}))
    calls = []
    real = mixing.permute
    counting = lambda *a, **k: calls.append(a[1]) or real(*a, **k)  # noqa: E731
    monkeypatch.setattr(mixing, "permute", counting)
    monkeypatch.setattr(mix_module, "permute", counting, raising=False)
    for idx, source, local, _ in want:
        got = m.get_batch(idx)
        assert np.array_equal(got[:, 0], source) and np.array_equal(got[:, 1], local)
    assert len(calls) == len(set().union(*(w[3] for w in want)))  # once per (source, pass)


def test_a_mix_whose_visit_tables_cannot_all_stay_cached_keeps_none(monkeypatch) -> None:
    """A random batch touches every source: with a cache smaller than all their tables,
    each batch rebuilt a whole-source table per source (~300x slower); such a mix permutes
    per batch instead."""
    mixing = importlib.import_module("mixle.data.index_math.mixing")
    mix_module = importlib.import_module("mixle.data.sources.compose.mix")
    monkeypatch.setattr(mix_module, "VISIT_TABLE_BYTES", 3 * 4 * 1000)  # fits 1.5 tables
    children = {f"c{k}": np.arange(1000) + 10_000 * k for k in range(3)}
    m = mixle.mix(children, seed=5)
    sizes: list[int] = []
    real = mixing.permute

    def counting(positions: Any, n: int, **options: Any) -> Any:
        sizes.append(np.asarray(positions).size)
        return real(positions, n, **options)

    monkeypatch.setattr(mixing, "permute", counting)
    monkeypatch.setattr(mix_module, "permute", counting)
    rng = np.random.default_rng(0)
    for _ in range(5):
        idx = rng.integers(0, len(m), 64)
        source, visit = m.plan.assign(idx)
        names = [f"c{k}" for k in range(3)]
        want = [
            visit_records([v], 1000, m.plan.visit_seed(s))[0] + 10_000 * int(names[s][1])
            for s, v in zip(source, visit)
        ]
        assert m.get_batch(idx).tolist() == want
    assert sizes and max(sizes) < 1000  # never a whole-source table
