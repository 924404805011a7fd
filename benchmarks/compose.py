"""Composed sources against reading their parts by hand, and mixle's Hugging Face and
ArrayRecord readers against those libraries' own batched reads, side by side in one run.

Run: python benchmarks/compose.py [--quick] [--json] [--rounds 25] [--data-dir DIR]
     [--only overhead,loader,hf,arrayrecord]

(1) **Overhead of composing** (``overhead``). Three children of float32 records (zarr
arrays, zstd, several records per chunk; and the same records as ``.npy`` files through
``mixle.read_npy``), random batches of 256 records. ``direct`` reads the same records from
the children by hand, as a user would: group the batch's indices by child, one
``get_batch`` per child, then the rows put in request order into one new batch.
``composed`` is ``src.get_batch(indices)`` of:

- ``concat(children)``: direct finds each index's child from the offsets (in the timed
  loop, as a user would);
- ``mix(children, [2, 1, 1])``: direct reads the child records that ``mix.origins(indices)``
  names, computed before the timed loop (by hand there is no other way to know them);
- ``select(child, chosen)`` over the largest child, ``chosen`` a random half of its
  records in random order: direct is ``child.get_batch(chosen[indices])``.

``x direct`` is composed time / direct time (goal: <= 1.05, i.e. at most 5 % overhead).
Below the table, ``origins(indices)`` of each combinator (its index math, no data read;
process CPU time, best of 5) is set against one child's ``get_batch`` of 256 records.

(1b) **Through the Loader** (``loader``). An epoch of ``Loader(concat(children),
batch_size=256, shuffle=True)`` against an epoch of ``Loader(single, ...)``, ``single`` one
source of the same records (the children's arrays written end to end as one zarr array or
``.npy`` file), with the same seed, so both read the same records in the same order;
Loader defaults otherwise (reader threads). A whole epoch, so that both do the same reads.
``x direct`` is concat's time / single's time.

(2) **Hugging Face datasets** (``hf``). A dataset built with ``Dataset.from_dict`` (int64,
float64, a fixed-size float32 list of 32 and a string column), ``save_to_disk`` then
``load_from_disk``; random batches of 256. ``mixle.read_hf(path).get_batch(indices)`` (a
dict of NumPy columns) against ``ds.__getitems__(indices)`` (what torch's DataLoader calls:
a list of dicts of Python values) and ``ds.with_format("numpy")[indices]`` (a dict of NumPy
columns). ``x mixle`` is their time / mixle's time (goal: >= 1).

(3) **ArrayRecord** (``arrayrecord``). 4 files of records of 1 KiB (``group_size:1``, the
layout array_record recommends for random access), random batches of 256:
``mixle.read_array_record(paths).get_batch(indices)`` against array_record's
``ArrayRecordDataSource(paths).__getitems__(indices)``; once as bytes, once decoded with
``np.frombuffer`` into one stacked array (mixle's ``decode=``, against ``np.stack`` of the
data source's records). ``x mixle`` as in (2) (goal: >= 1).

Timing: every contender of a row reads the same batches in a round (fresh indices each
round: 1 batch of zarr or 8 of ``.npy`` in (1), 10 in (2) and (3)); the rounds run the
contenders interleaved, in a rotating order, after one untimed warm-up round, with mixle's
decoded-chunk cache emptied before each contender's turn, so a busy moment of a noisy
machine hits both reads of a pair. Each row reports the median per-batch time of each
contender and the median over rounds of the per-round ratio of wall time (with its range),
and of process CPU time (all threads), which moves less with other processes' load. The
batches of every pair are checked equal once before timing (the ``same`` column; values
compared at the rival's dtype: datasets' numpy format gives float64 columns as float32).

``--quick`` runs a smoke version (tiny sizes, 2 rounds) in a few seconds; ``--json`` also
prints the rows as JSON lines; ``--data-dir`` keeps the data files and reuses them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import mixle

SEED = 0
BATCH = 256
GOAL_OVERHEAD = 1.05  # composed / direct time, at most
GOAL_RIVAL = 1.0  # rival / mixle time, at least
MIX_WEIGHTS = (2, 1, 1)
FULL: dict[str, Any] = {
    "children": (6000, 7000, 8000),  # records of each child
    "record": (64, 64),  # float32: 16 KiB a record, 328 MiB for the three children
    "chunk_records": 8,  # records per zarr chunk (128 KiB)
    "batches": {"zarr": 1, "npy": 8},  # per round and contender: reads close in time
    "rounds": 25,
    "loader_rounds": {"zarr": 5, "npy": 15},  # rounds of one epoch
    "hf_rows": 200_000,
    "hf_width": 32,
    "ar_files": 4,
    "ar_records": 50_000,  # per file
    "ar_bytes": 1024,
    "small_batches": 10,  # per round, for the HF and ArrayRecord rows
    "small_rounds": 25,
}
QUICK: dict[str, Any] = {
    "children": (300, 350, 400),
    "record": (8, 8),
    "chunk_records": 8,
    "batches": {"zarr": 1, "npy": 1},
    "rounds": 2,
    "loader_rounds": {"zarr": 2, "npy": 2},
    "hf_rows": 2_000,
    "hf_width": 4,
    "ar_files": 2,
    "ar_records": 1_000,
    "ar_bytes": 64,
    "small_batches": 2,
    "small_rounds": 2,
}

Batches = list[np.ndarray]
Reader = Callable[[np.ndarray], Any]


# -- timing -------------------------------------------------------------------------------
def _clear_cache() -> None:
    mixle.chunk_cache().clear()


@dataclass
class Times:
    """Per contender, the wall and process CPU seconds of every timed round."""

    wall: dict[str, list[float]]
    cpu: dict[str, list[float]]


def rounds(contenders: dict[str, Callable[[int], Callable[[], Any]]], count: int) -> Times:
    """Seconds of each contender per round, interleaved in a rotating order.

    ``contenders[name](r)`` prepares round ``r`` (untimed: indices, origins) and returns
    the work to time. Round ``-1`` warms up (imports, page cache, thread pools), untimed.
    CPU time is this process's, all its threads: on a shared machine it moves less than
    wall time with the load of other processes.
    """
    names = list(contenders)
    out = Times({name: [] for name in names}, {name: [] for name in names})
    for r in range(-1, count):
        jobs = {name: contenders[name](r) for name in names}
        for k in range(len(names)):
            name = names[(r + k) % len(names)]
            _clear_cache()
            start, cpu = time.perf_counter(), time.process_time()
            jobs[name]()
            if r >= 0:
                out.wall[name].append(time.perf_counter() - start)
                out.cpu[name].append(time.process_time() - cpu)
    return out


def ratio_stats(num: list[float], den: list[float]) -> tuple[float, float, float]:
    """Median, lowest and highest of the per-round ratios ``num / den``."""
    ratios = [a / max(b, 1e-9) for a, b in zip(num, den)]
    return statistics.median(ratios), min(ratios), max(ratios)


def random_batches(n: int, count: int, seed: int) -> Batches:
    """``count`` batches of :data:`BATCH` random indices in ``[0, n)`` (repeats allowed)."""
    rng = np.random.default_rng(seed)
    return [rng.integers(0, n, BATCH, dtype=np.int64) for _ in range(count)]


def read_all(read: Callable[[Any], Any], batches: Sequence[Any]) -> Callable[[], None]:
    """The timed work: every batch read, the last one alive while the next is read."""

    def go() -> None:
        batch = None
        for idx in batches:
            batch = read(idx)
        del batch

    return go


def same(a: Any, b: Any) -> bool:
    """Whether batch ``a`` (mixle's) holds the values of batch ``b`` (arrays, dicts or lists
    of them), compared at ``b``'s dtype: datasets' numpy format gives float64 columns as
    float32."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and not isinstance(b, np.ndarray):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    x, y = np.asarray(a), np.asarray(b)
    if x.dtype == object or y.dtype == object:
        return x.shape == y.shape and all(u == v for u, v in zip(x.ravel(), y.ravel()))
    return bool(np.array_equal(x.astype(y.dtype), y))  # at the rival's dtype


# -- data ---------------------------------------------------------------------------------
def _done(path: Path) -> bool:
    return (path / ".complete").exists()


def _mark(path: Path) -> None:
    (path / ".complete").write_text("")


def child_data(plan: dict[str, Any], k: int) -> np.ndarray:
    """Child ``k``'s records: float32 with one decimal, so zstd has something to do."""
    rng = np.random.default_rng(SEED + k)
    shape = (plan["children"][k], *plan["record"])
    return np.round(rng.standard_normal(shape, dtype=np.float32), 1)


def write_arrays(folder: Path, plan: dict[str, Any]) -> dict[str, Any]:
    """The children and the single array of their records, as zarr and as ``.npy``."""
    import zarr

    tag = "x".join(map(str, (*plan["children"], *plan["record"], plan["chunk_records"])))
    root = folder / f"arrays-{tag}"
    paths: dict[str, Any] = {
        "zarr": [str(root / f"child{k}.zarr") for k in range(3)],
        "npy": [str(root / f"child{k}.npy") for k in range(3)],
        "zarr_single": str(root / "single.zarr"),
        "npy_single": str(root / "single.npy"),
    }
    if _done(root):
        return paths
    root.mkdir(parents=True, exist_ok=True)
    total = sum(plan["children"])
    chunks = (plan["chunk_records"], *plan["record"])
    single = zarr.create_array(
        paths["zarr_single"], shape=(total, *plan["record"]), chunks=chunks, dtype="float32",
        overwrite=True,
    )  # fmt: skip
    flat = np.lib.format.open_memmap(
        paths["npy_single"], mode="w+", dtype=np.float32, shape=(total, *plan["record"])
    )
    lo = 0
    for k in range(3):
        data = child_data(plan, k)
        arr = zarr.create_array(
            paths["zarr"][k], shape=data.shape, chunks=chunks, dtype="float32", overwrite=True
        )
        arr[...] = data
        np.save(paths["npy"][k], data)
        single[lo : lo + len(data)] = data
        flat[lo : lo + len(data)] = data
        lo += len(data)
    flat.flush()
    del flat
    _mark(root)
    return paths


def write_hf(folder: Path, plan: dict[str, Any]) -> str:
    """A ``save_to_disk`` folder: int64, float64, float32 list of ``hf_width``, string."""
    import datasets

    datasets.disable_progress_bars()
    n, width = plan["hf_rows"], plan["hf_width"]
    path = folder / f"hf-{n}x{width}"
    if _done(path):
        return str(path)
    rng = np.random.default_rng(SEED)
    features = datasets.Features(
        {
            "id": datasets.Value("int64"),
            "score": datasets.Value("float64"),
            "vector": datasets.Sequence(datasets.Value("float32"), length=width),
            "text": datasets.Value("string"),
        }
    )
    ids = np.arange(n, dtype=np.int64)
    columns = {
        "id": ids,
        "score": rng.standard_normal(n),
        "vector": rng.standard_normal((n, width), dtype=np.float32),
        "text": [f"record {i} of the benchmark" for i in range(n)],
    }
    datasets.Dataset.from_dict(columns, features=features).save_to_disk(str(path))
    _mark(path)
    return str(path)


def write_array_record(folder: Path, plan: dict[str, Any]) -> list[str]:
    """``ar_files`` ArrayRecord files of ``ar_records`` records of ``ar_bytes`` bytes."""
    from array_record.python.array_record_module import ArrayRecordWriter

    files, count, size = plan["ar_files"], plan["ar_records"], plan["ar_bytes"]
    root = folder / f"array_record-{files}x{count}x{size}"
    paths = [str(root / f"part{k}.array_record") for k in range(files)]
    if _done(root):
        return paths
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(SEED)
    for path in paths:
        writer = ArrayRecordWriter(path, "group_size:1")
        for row in rng.integers(0, 16, (count, size // 4), dtype=np.int32):
            writer.write(row.tobytes())
        writer.close()
    _mark(root)
    return paths


# -- (1) overhead of composing ------------------------------------------------------------
def scatter_by_hand(children: Sequence[Any], child: np.ndarray, local: np.ndarray) -> Any:
    """What a user writes: one ``get_batch`` per child, then the rows put in request order.

    Every child is read before the batch is allocated, as ``concat`` does: allocating it
    first (then reading the children) made this ~1.8x slower for ``.npy`` children here
    (most likely the children's reads then land in fresh pages that fault in).
    """
    parts = []
    for k in np.unique(child).tolist():
        rows = np.flatnonzero(child == k)
        parts.append((rows, children[k].get_batch(local[rows])))
    first = parts[0][1]
    out = np.empty((child.size, *first.shape[1:]), dtype=first.dtype)
    for rows, part in parts:
        out[rows] = part
    return out


def overhead_rows(paths: dict[str, Any], plan: dict[str, Any]) -> list[dict[str, Any]]:
    """Rows of table (1): concat, mix and select over zarr and ``.npy`` children."""
    return [row for kind in ("zarr", "npy") for row in _overhead_of(kind, paths[kind], plan)]


def _overhead_of(kind: str, paths: list[str], plan: dict[str, Any]) -> list[dict[str, Any]]:
    """concat, mix and select of the children at ``paths`` against reading them by hand."""
    opener = mixle.read_zarr if kind == "zarr" else mixle.read_npy
    children = [opener(p) for p in paths]
    lengths = [len(c) for c in children]
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    mixed = mixle.mix(children, list(MIX_WEIGHTS), seed=SEED)
    big = int(np.argmax(lengths))
    chosen = np.random.default_rng(SEED).permutation(lengths[big])[: lengths[big] // 2]

    def concat_direct(idx: np.ndarray) -> Any:
        child = np.searchsorted(offsets, idx, side="right") - 1
        return scatter_by_hand(children, child, idx - offsets[child])

    def mix_plan(idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        found = mixed.origins(idx)  # untimed: which child records the mix reads
        ids = np.array([mixed.names.index(name) for name in found.names], dtype=np.int64)
        return ids[found.source], found.index

    def mix_direct(planned: tuple[np.ndarray, np.ndarray]) -> Any:
        return scatter_by_hand(children, *planned)

    def select_direct(idx: np.ndarray) -> Any:
        return children[big].get_batch(chosen[idx])

    cases: dict[str, tuple[Any, Callable[[np.ndarray], Any], Reader]] = {
        "concat": (mixle.concat(children), _same_indices, concat_direct),
        "mix": (mixed, mix_plan, mix_direct),
        "select": (mixle.select(children[big], chosen), _same_indices, select_direct),
    }
    out = [
        _compare_direct(kind, name, src, prepare, direct, plan)
        for name, (src, prepare, direct) in cases.items()
    ]
    batches = random_batches(len(children[0]), 20, SEED + 2)
    read_us = best_cpu_us(children[0].get_batch, batches)
    for row, (src, _, _) in zip(out, cases.values()):
        row["index_math_us"] = best_cpu_us(src.origins, random_batches(len(src), 20, SEED + 3))
        row["child_read_us"] = read_us
    for c in children:
        c.close()
    return out


def best_cpu_us(fn: Callable[[np.ndarray], Any], batches: Batches, repeats: int = 5) -> float:
    """Process CPU microseconds of ``fn(indices)`` per batch, best of ``repeats`` passes."""
    best = float("inf")
    for _ in range(repeats):
        spent = 0.0
        for idx in batches:
            _clear_cache()  # every batch decodes its chunks, as in the timed rounds
            start = time.process_time()
            fn(idx)
            spent += time.process_time() - start
        best = min(best, spent)
    return 1e6 * best / len(batches)


def _same_indices(idx: np.ndarray) -> np.ndarray:
    return idx


def _compare_direct(
    kind: str,
    name: str,
    src: Any,
    prepare: Callable[[np.ndarray], Any],
    direct: Reader,
    plan: dict[str, Any],
) -> dict[str, Any]:
    """One row of table (1): ``src.get_batch`` against ``direct`` of the prepared indices."""
    n, count = len(src), plan["batches"][kind]
    probe = random_batches(n, 1, SEED + 1)[0]
    agree = same(src.get_batch(probe), direct(prepare(probe)))

    def direct_round(r: int) -> Callable[[], None]:
        prepared = [prepare(idx) for idx in random_batches(n, count, 1000 + r)]
        return read_all(direct, prepared)

    def composed_round(r: int) -> Callable[[], None]:
        return read_all(src.get_batch, random_batches(n, count, 1000 + r))

    t = rounds({"direct": direct_round, "composed": composed_round}, plan["rounds"])
    return _overhead_row("overhead", kind, name, t, count, agree, plan["rounds"])


def _overhead_row(
    table: str, kind: str, name: str, t: Times, count: int, agree: bool, rounds: int
) -> dict[str, Any]:
    median, low, high = ratio_stats(t.wall["composed"], t.wall["direct"])
    return {
        "table": table,
        "children": kind,
        "contender": name,
        "batches": count,
        "rounds": rounds,
        "direct_ms": 1000 * statistics.median(t.wall["direct"]) / count,
        "composed_ms": 1000 * statistics.median(t.wall["composed"]) / count,
        "x_direct": median,
        "x_direct_low": low,
        "x_direct_high": high,
        "x_direct_cpu": ratio_stats(t.cpu["composed"], t.cpu["direct"])[0],
        "same": agree,
        "goal_met": median <= GOAL_OVERHEAD,
    }


# -- (1b) through the Loader --------------------------------------------------------------
def loader_rows(paths: dict[str, Any], plan: dict[str, Any]) -> list[dict[str, Any]]:
    """Rows of table (1b): an epoch of ``Loader(concat(children))`` against one of
    ``Loader(single)``.

    A whole epoch, so that both do the same reads: stopping after a few batches would leave
    a varying number of read-ahead batches in flight (done, or cut short by ``close``).
    """
    out = []
    for kind in ("zarr", "npy"):
        opener = mixle.read_zarr if kind == "zarr" else mixle.read_npy
        children = [opener(p) for p in paths[kind]]
        single = opener(paths[f"{kind}_single"])
        cat = mixle.concat(children)
        assert len(cat) == len(single)
        agree = same(_first_batch(cat), _first_batch(single))
        count = len(mixle.Loader(cat, BATCH))
        rounds_ = plan["loader_rounds"][kind]

        def epoch(src: Any) -> Callable[[int], Callable[[], None]]:
            def prepare(r: int) -> Callable[[], None]:
                def go() -> None:
                    batch = None
                    for batch in mixle.Loader(src, BATCH, shuffle=True, seed=1000 + r):  # noqa: B007
                        pass  # the last batch stays alive while the next is read
                    del batch

                return go

            return prepare

        t = rounds({"direct": epoch(single), "composed": epoch(cat)}, rounds_)
        out.append(_overhead_row("loader", kind, "Loader(concat)", t, count, agree, rounds_))
        for c in [*children, single]:
            c.close()
    return out


def _first_batch(src: Any) -> Any:
    """The first batch of a shuffled epoch of ``src``."""
    loader = mixle.Loader(src, BATCH, shuffle=True, seed=SEED)
    batch = next(iter(loader))
    loader.close()
    return batch


# -- (2) Hugging Face datasets ------------------------------------------------------------
def hf_rows(path: str, plan: dict[str, Any]) -> list[dict[str, Any]]:
    """Rows of table (2): ``read_hf`` against ``__getitems__`` and numpy-formatted reads."""
    import datasets

    datasets.disable_progress_bars()
    ds = datasets.load_from_disk(path)
    src = mixle.read_hf(path)
    as_numpy = ds.with_format("numpy")
    n, count = len(src), plan["small_batches"]
    probe = random_batches(n, 1, SEED + 1)[0]
    ours = src.get_batch(probe)
    items = ds.__getitems__(probe.tolist())
    theirs_items = {c: [row[c] for row in items] for c in ours}
    theirs_numpy = as_numpy[probe]
    agree = {
        "__getitems__": same(ours, theirs_items),
        "numpy format": same(ours, dict(theirs_numpy)),
    }
    rivals: dict[str, Reader] = {
        "__getitems__": lambda idx: ds.__getitems__(idx.tolist()),
        "numpy format": lambda idx: as_numpy[idx],
    }
    contenders = {"mixle": src.get_batch, **rivals}
    t = rounds(
        {
            name: (lambda r, read=read: read_all(read, random_batches(n, count, 1000 + r)))
            for name, read in contenders.items()
        },
        plan["small_rounds"],
    )
    src.close()
    what = f"{n} rows: int64, float64, float32[{plan['hf_width']}], string"
    return [
        _rival_row("hf", what, name, t, count, agree[name], plan["small_rounds"]) for name in rivals
    ]


# -- (3) ArrayRecord ----------------------------------------------------------------------
def frombuffer(data: bytes) -> np.ndarray:
    """``decode=`` of the ArrayRecord rows: a record's int32 values."""
    return np.frombuffer(data, dtype=np.int32)


def array_record_rows(paths: list[str], plan: dict[str, Any]) -> list[dict[str, Any]]:
    """Rows of table (3): ``read_array_record`` against ``ArrayRecordDataSource``."""
    from array_record.python.array_record_data_source import ArrayRecordDataSource

    raw = mixle.read_array_record(paths)
    decoded = mixle.read_array_record(paths, decode=frombuffer)
    theirs = ArrayRecordDataSource(paths)
    n, count = len(raw), plan["small_batches"]
    assert n == len(theirs)

    def theirs_bytes(idx: np.ndarray) -> Any:
        return theirs.__getitems__(idx.tolist())

    def theirs_decoded(idx: np.ndarray) -> np.ndarray:
        return np.stack([frombuffer(b) for b in theirs.__getitems__(idx.tolist())])

    probe = random_batches(n, 1, SEED + 1)[0]
    what = f"{plan['ar_files']} files x {plan['ar_records']} records of {plan['ar_bytes']} B"
    out = []
    for name, ours, rival in (
        ("bytes", raw.get_batch, theirs_bytes),
        ("decoded", decoded.get_batch, theirs_decoded),
    ):
        agree = same(list(ours(probe)), list(rival(probe)))
        t = rounds(
            {
                "mixle": lambda r, f=ours: read_all(f, random_batches(n, count, 1000 + r)),
                name: lambda r, f=rival: read_all(f, random_batches(n, count, 1000 + r)),
            },
            plan["small_rounds"],
        )
        out.append(_rival_row("arrayrecord", what, name, t, count, agree, plan["small_rounds"]))
    raw.close()
    decoded.close()
    theirs.__exit__(None, None, None)
    return out


def _rival_row(
    table: str, what: str, name: str, t: Times, count: int, agree: bool, rounds: int
) -> dict[str, Any]:
    median, low, high = ratio_stats(t.wall[name], t.wall["mixle"])
    return {
        "table": table,
        "data": what,
        "contender": name,
        "batches": count,
        "rounds": rounds,
        "mixle_ms": 1000 * statistics.median(t.wall["mixle"]) / count,
        "rival_ms": 1000 * statistics.median(t.wall[name]) / count,
        "x_mixle": median,
        "x_mixle_low": low,
        "x_mixle_high": high,
        "x_mixle_cpu": ratio_stats(t.cpu[name], t.cpu["mixle"])[0],
        "same": agree,
        "goal_met": median >= GOAL_RIVAL,
    }


# -- driver -------------------------------------------------------------------------------
def print_tables(rows: list[dict[str, Any]], plan: dict[str, Any]) -> None:
    cpus = os.cpu_count()
    mib = sum(plan["children"]) * int(np.prod(plan["record"])) * 4 / 2**20
    common = (
        f"random batches of {BATCH}; time: median over interleaved rounds; x: median of "
        f"the per-round ratios of wall time [lowest-highest], and of process CPU time; "
        f"{cpus} CPUs"
    )
    direct = [r for r in rows if r["table"] in ("overhead", "loader")]
    if direct:
        record = "x".join(map(str, plan["record"]))
        print(
            f"\n(1) Composed vs direct reads: 3 children of {list(plan['children'])} float32 "
            f"records {record} ({mib:.0f} MiB), zarr zstd chunks of {plan['chunk_records']} "
            f"records or .npy; mix weights {list(MIX_WEIGHTS)}; select: a random half of "
            f"the largest child; {plan['rounds']} rounds of {plan['batches']['zarr']} (zarr) "
            f"or {plan['batches']['npy']} (npy) batches; "
            f"Loader: {plan['loader_rounds']['zarr']} (zarr) or {plan['loader_rounds']['npy']} "
            f"(npy) rounds of one epoch, default threads; "
            f"{common}"
        )
        print(
            "| children | composed | direct ms/batch | composed ms/batch | x direct "
            "| x direct (CPU) | same |"
        )
        print("| --- | --- | ---: | ---: | ---: | ---: | --- |")
        for r in direct:
            print(
                f"| {r['children']} | {r['contender']} | {r['direct_ms']:.2f} "
                f"| {r['composed_ms']:.2f} | {r['x_direct']:.3f} "
                f"[{r['x_direct_low']:.2f}-{r['x_direct_high']:.2f}] "
                f"| {r['x_direct_cpu']:.3f} | {r['same']} |"
            )
        for r in direct:
            if "index_math_us" in r:
                print(
                    f"  {r['children']} {r['contender']}: origins(indices), the index math of "
                    f"a read without the data, {r['index_math_us']:.0f} us CPU per batch = "
                    f"{r['index_math_us'] / r['child_read_us']:.1%} of one child's "
                    f"get_batch of {BATCH} ({r['child_read_us']:.0f} us; best of 5)"
                )
        worst = max(direct, key=lambda r: r["x_direct"])
        print(
            f"goal: composed / direct time <= {GOAL_OVERHEAD} on every row: worst "
            f"{worst['x_direct']:.3f} ({worst['children']} {worst['contender']})"
            + (" -- met" if worst["x_direct"] <= GOAL_OVERHEAD else " -- NOT met")
        )
    for table, title in (
        ("hf", "(2) read_hf vs datasets"),
        ("arrayrecord", "(3) read_array_record vs ArrayRecordDataSource"),
    ):
        got = [r for r in rows if r["table"] == table]
        if not got:
            continue
        print(
            f"\n{title}: {got[0]['data']}; {got[0]['rounds']} rounds of "
            f"{got[0]['batches']} batches; {common}"
        )
        print("| rival | mixle ms/batch | rival ms/batch | x mixle | x mixle (CPU) | same |")
        print("| --- | ---: | ---: | ---: | ---: | --- |")
        for r in got:
            print(
                f"| {r['contender']} | {r['mixle_ms']:.3f} | {r['rival_ms']:.3f} "
                f"| {r['x_mixle']:.2f} [{r['x_mixle_low']:.2f}-{r['x_mixle_high']:.2f}] "
                f"| {r['x_mixle_cpu']:.2f} | {r['same']} |"
            )
        worst = min(got, key=lambda r: r["x_mixle"])
        print(
            f"goal ({table}): rival time / mixle time >= {GOAL_RIVAL:g} on every row: worst "
            f"{worst['x_mixle']:.2f} ({worst['contender']})"
            + (" -- met" if worst["x_mixle"] >= GOAL_RIVAL else " -- NOT met")
        )


TABLES = ("overhead", "loader", "hf", "arrayrecord")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run at a tiny size")
    parser.add_argument("--json", action="store_true", help="also print rows as JSON lines")
    parser.add_argument(
        "--rounds", type=int, help="interleaved rounds of every row (default 25; Loader 15)"
    )
    parser.add_argument("--data-dir", help="keep the data files in this folder and reuse them")
    parser.add_argument("--only", help=f"comma-separated tables to run ({','.join(TABLES)})")
    args = parser.parse_args()
    plan = dict(QUICK if args.quick else FULL)
    if args.rounds is not None:
        plan["rounds"] = plan["small_rounds"] = args.rounds
        plan["loader_rounds"] = {"zarr": args.rounds, "npy": args.rounds}
    only = set(args.only.split(",")) if args.only else set(TABLES)
    unknown = only - set(TABLES)
    if unknown:
        parser.error(f"--only={args.only!r} names {sorted(unknown)}; tables: {','.join(TABLES)}")
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(args.data_dir) if args.data_dir else Path(tmp)
        start = time.perf_counter()
        if only & {"overhead", "loader"}:
            arrays = write_arrays(folder, plan)
        hf = write_hf(folder, plan) if "hf" in only else ""
        ar = write_array_record(folder, plan) if "arrayrecord" in only else []
        print(f"data ready in {time.perf_counter() - start:.1f} s", flush=True)
        if "overhead" in only:
            rows += overhead_rows(arrays, plan)
        if "loader" in only:
            rows += loader_rows(arrays, plan)
        if "hf" in only:
            rows += hf_rows(hf, plan)
        if "arrayrecord" in only:
            rows += array_record_rows(ar, plan)
    if args.json:
        for row in rows:
            print(json.dumps(row))
    print_tables(rows, plan)


if __name__ == "__main__":
    main()
