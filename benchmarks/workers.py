"""Process workers: a Python-heavy record transform and the cost of handing big batches back,
mixle's ``Loader(num_workers=...)`` against its threads, torch's ``DataLoader`` and grain's
``mp_prefetch``, side by side in one run.

Run: python benchmarks/workers.py [--quick] [--json] [--repeats 3] [--data-dir DIR]
     [--only transform,handoff]

(a) **Python-heavy record transform.** A ``mixle.PatchSampler`` of 16^3 float32 patches
over a 64^3 ``.npy`` volume (written to ``--data-dir`` or a temporary folder), batches of 32
in order (no shuffle). Every record goes through ``BusyRecord``: a pure-Python loop that
holds the GIL for about 1 ms (its length is calibrated once at the start, in the driver,
and passed to every contender) and adds ``rng.random()`` to the patch, ``rng`` being
``mixle.loading.record_rng(0, 0, index)`` for every contender (the Loader passes it; the
torch Dataset and the grain ``map_with_index`` build the same one), so every contender
does the same work and yields the same batches (the ``digest`` column, the sum of every
patch it received, says so). Contenders:

- ``mixle workers``: ``Loader(sampler, 32, record_transform=..., num_workers=2,
  num_threads=1)`` (spawn);
- ``mixle threads``: ``Loader(..., num_threads=2)``;
- ``mixle 1 thread``: ``Loader(..., num_threads=0)`` (reads in the caller's thread);
- ``torch``: ``DataLoader(BusyDataset(sampler), batch_size=32, num_workers=2,
  multiprocessing_context="spawn")``: one record per ``__getitem__``, collated by torch;
- ``grain``: ``MapDataset.source(sampler).map_with_index(...).batch(32)
  .to_iter_dataset(ReadOptions(num_threads=1, prefetch_buffer_size=2))
  .mp_prefetch(MultiprocessingOptions(num_workers=2))`` (grain always spawns). The read
  options mirror mixle's ``num_threads=1`` per worker and torch's two batches in flight
  per worker. (grain's defaults, 16 threads reading up to 500 elements ahead in every
  worker, fill a deep buffer before the first batch comes out: a rate timed after the first
  batches then measures that buffer, not the pipeline. The ``with start-up`` column is safe
  from that.)

(b) **Hand-off.** Batches of 16 records of 4 MiB float32 (64 MiB) from a ``.npy`` file
of 64 records (``RepeatedRows`` cycles through them, so the file stays in the page cache
and no contender ever starts a second epoch), identity transform. Contenders: ``mixle
parent reads`` (``num_workers=0, num_threads=2``: the parent copies every byte itself),
``mixle workers`` (``num_workers=2, num_threads=1``), ``torch`` (``DataLoader(...,
num_workers=2)``, spawn; torch collates each batch into shared memory in the worker) and
``grain`` (``mp_prefetch`` with 2 workers; grain copies each batch into shared memory in
the worker). Each runs twice: the consumer either drops every batch untouched (``none``) or
sums every element of it (``sum``, ``np.sum`` over ``np.asarray(leaf)``), so a zero-copy
hand-off cannot look free by never reading its pages.

Timing, the same for every contender, each in its own fresh process after its imports:
``start-up s`` is from building the loader (and its iterator) to the first batch in hand,
worker start-up included; the rate columns time from the end of batch ``warm`` (4; 2 with
``--quick``) to the end of the last batch, so worker start-up and the first batches are
left out; ``with start-up`` is the rate over the whole run, from building the loader to the
end of the last batch (ending the iterator, which joins the workers, is never timed).
``parent CPU`` is this process's own ``getrusage(RUSAGE_SELF)`` user + system time over the
rate columns' span (all its threads, its children excluded), per MiB handed off in (b).
``x threads`` divides by the ``mixle threads`` row, ``x parent rate`` and ``x parent CPU``
by the ``mixle parent reads`` row with the same consumer. Best of ``--repeats`` interleaved
runs (most records/s or batches/s; start-up: the shortest of the runs, with start-up: the
highest).

``--quick`` runs a smoke version (tiny sizes, one run each) in well under a minute;
``--json`` also prints the rows as JSON lines.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from _proc import run_measurement

MIB = 2**20
SEED = 0
GOAL_THREADS = 1.7  # mixle workers / mixle threads, Python-heavy transform
GOAL_PARENT = 1.2  # mixle workers / parent reads, parent CPU per MiB (lower is better)
FULL: dict[str, Any] = {
    "volume": 64,
    "patch": 16,
    "batch": 32,
    "batches": 80,
    "warm": 4,
    "busy_ms": 1.0,
    "row_shape": (1024, 1024),  # 4 MiB float32 records
    "rows": 64,
    "handoff_batch": 16,
    "handoff_batches": 40,
    "repeats": 3,
}
QUICK: dict[str, Any] = {
    "volume": 32,
    "patch": 16,
    "batch": 8,
    "batches": 10,
    "warm": 2,
    "busy_ms": 1.0,
    "row_shape": (256, 512),  # 512 KiB records, 8 MiB batches
    "rows": 32,
    "handoff_batch": 16,
    "handoff_batches": 8,
    "repeats": 1,
}


# -- the work, module-level so that spawned workers can unpickle it -----------------------
def spin(k: int) -> int:
    """A pure-Python loop of ``k`` steps: holds the GIL all along."""
    total = 0
    for j in range(k):
        total += j & 7
    return total


def calibrate(ms: float) -> int:
    """Steps of :func:`spin` that take about ``ms`` milliseconds here (best of a few)."""
    k = 10_000
    best = min(_timed(spin, k) for _ in range(7))
    return max(1, int(k * ms / 1000 / best))


def _timed(fn: Any, *args: Any) -> float:
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


class BusyRecord:
    """``record_transform(record, rng)``: ~1 ms of pure Python, then ``patch + rng.random()``."""

    def __init__(self, steps: int) -> None:
        self.steps = steps

    def __call__(self, record: Any, rng: np.random.Generator) -> tuple[np.ndarray, Any]:
        patch, coords = record
        spin(self.steps)
        return patch + np.float32(rng.random()), coords


class BusyIndexed:
    """grain's ``map_with_index`` of :class:`BusyRecord`, with the Loader's record rng."""

    def __init__(self, steps: int) -> None:
        self.busy = BusyRecord(steps)

    def __call__(self, index: int, record: Any) -> tuple[np.ndarray, Any]:
        from mixle.loading import record_rng

        return self.busy(record, record_rng(SEED, 0, index))


class BusyDataset:
    """A torch map-style Dataset: record ``i`` of ``source`` through :class:`BusyRecord`."""

    def __init__(self, source: Any, steps: int) -> None:
        self.source, self.busy = source, BusyRecord(steps)

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, i: int) -> tuple[np.ndarray, Any]:
        from mixle.loading import record_rng

        return self.busy(self.source[i], record_rng(SEED, 0, i))


class RepeatedRows:
    """Record ``i`` is row ``i % rows`` of a ``.npy`` file: a long run over a small file."""

    def __init__(self, path: str, length: int) -> None:
        import mixle

        self.path, self.length = path, length
        self.rows = mixle.read_npy(path)
        self.count = len(self.rows)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> np.ndarray:
        return np.asarray(self.rows[int(i) % self.count])

    def get_batch(self, indices: Any) -> np.ndarray:
        return self.rows.get_batch(np.asarray(indices, dtype=np.int64) % self.count)


# -- data ---------------------------------------------------------------------------------
def write_data(folder: Path, plan: dict[str, Any]) -> tuple[str, str]:
    """The volume of (a) and the rows of (b) under ``folder`` (reused when already there)."""
    folder.mkdir(parents=True, exist_ok=True)
    volume = folder / f"volume{plan['volume']}.npy"
    if not volume.exists():
        rng = np.random.default_rng(SEED)
        np.save(volume, rng.standard_normal((plan["volume"],) * 3, dtype=np.float32))
    rows = folder / f"rows{plan['rows']}x{plan['row_shape'][0]}x{plan['row_shape'][1]}.npy"
    if not rows.exists():
        out = np.lib.format.open_memmap(
            rows, mode="w+", dtype=np.float32, shape=(plan["rows"], *plan["row_shape"])
        )
        for r in range(plan["rows"]):
            out[r] = r
        out.flush()
        del out
    return str(volume), str(rows)


# -- contenders (each runs in its own process) ---------------------------------------------
def transform_loader(spec: dict[str, Any]) -> Any:
    """The iterable of batches of table (a) for ``spec``."""
    import mixle

    sampler = mixle.PatchSampler(
        mixle.read_npy(spec["volume"]), spec["patch"], spec["batch"] * spec["batches"], seed=SEED
    )
    kind, steps, batch = spec["kind"], spec["steps"], spec["batch"]
    if kind == "mixle":
        options: dict[str, Any] = {"num_threads": spec["threads"]}
        if spec["workers"]:
            options["num_workers"] = spec["workers"]
            options["worker_start_method"] = "spawn"
        return mixle.Loader(sampler, batch, record_transform=BusyRecord(steps), **options)
    if kind == "torch":
        from torch.utils.data import DataLoader

        return DataLoader(
            BusyDataset(sampler, steps),  # type: ignore[arg-type]
            batch_size=batch,
            num_workers=spec["workers"],
            multiprocessing_context="spawn",
        )
    import grain.python as grain

    return (
        grain.MapDataset.source(sampler)
        .map_with_index(BusyIndexed(steps))
        .batch(batch)
        .to_iter_dataset(grain.ReadOptions(num_threads=1, prefetch_buffer_size=2))
        .mp_prefetch(grain.MultiprocessingOptions(num_workers=spec["workers"]))
    )


def handoff_loader(spec: dict[str, Any]) -> Any:
    """The iterable of batches of table (b) for ``spec``."""
    import mixle

    rows = RepeatedRows(spec["rows"], spec["batch"] * spec["batches"])
    kind, batch = spec["kind"], spec["batch"]
    if kind == "mixle":
        options: dict[str, Any] = {"num_threads": spec["threads"]}
        if spec["workers"]:
            options["num_workers"] = spec["workers"]
            options["worker_start_method"] = "spawn"
        return mixle.Loader(rows, batch, **options)
    if kind == "torch":
        from torch.utils.data import DataLoader

        return DataLoader(
            rows,  # type: ignore[arg-type]
            batch_size=batch,
            num_workers=spec["workers"],
            multiprocessing_context="spawn",
        )
    import grain.python as grain

    return (
        grain.MapDataset.source(rows)
        .batch(batch)
        .to_iter_dataset(grain.ReadOptions(num_threads=1, prefetch_buffer_size=2))
        .mp_prefetch(grain.MultiprocessingOptions(num_workers=spec["workers"]))
    )


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def measure(spec: dict[str, Any]) -> dict[str, Any]:
    """Start-up, rate and parent CPU of one contender, in this process."""
    import mixle  # noqa: F401

    if spec["kind"] == "torch":
        import torch  # noqa: F401
    elif spec["kind"] == "grain":
        import grain.python  # noqa: F401
        from absl import flags

        flags.FLAGS.mark_as_parsed()  # grain reads absl flags; a script without absl.app
    table, warm, touch = spec["table"], spec["warm"], spec["touch"]
    start = time.perf_counter()
    loader = (transform_loader if table == "transform" else handoff_loader)(spec)
    iterator = iter(loader)
    n = 0
    digest = 0.0
    nbytes = 0
    t_warm = cpu_warm = t_last = cpu_last = startup = 0.0
    for batch in iterator:  # the loop a user writes: the last batch is alive during next()
        leaves = batch if isinstance(batch, (tuple, list)) else (batch,)
        first = np.asarray(leaves[0])
        if touch == "sum":
            digest += float(np.sum(first, dtype=np.float64))
        if n == 0:
            startup = time.perf_counter() - start
            shape = list(first.shape)
        elif n > warm:
            nbytes += first.nbytes
        del leaves, first
        n += 1
        # each batch's end, not the loop's: ending a run (joining workers) is not timed
        t_last, cpu_last = time.perf_counter(), _cpu()
        if n == warm + 1:
            t_warm, cpu_warm = t_last, cpu_last
    seconds, cpu = t_last - t_warm, cpu_last - cpu_warm
    del batch
    close = getattr(iterator, "close", None)
    if close is not None:
        close()
    timed = n - warm - 1
    row = {
        "table": table,
        "contender": spec["name"],
        "kind": spec["kind"],
        "workers": spec["workers"],
        "threads": spec.get("threads"),
        "touch": touch,
        "batches": n,
        "timed_batches": timed,
        "batch_shape": shape,
        "startup_s": startup,
        "seconds": seconds,
        "batches_per_s": timed / seconds,
        "records_per_s": timed * spec["batch"] / seconds,
        "records_per_s_with_startup": n * spec["batch"] / (t_last - start),
        "batches_per_s_with_startup": n / (t_last - start),
        "parent_cpu_s": cpu,
        "parent_cpu_ms_per_mib": 1000 * cpu / (nbytes / MIB),
        "mib_per_s": nbytes / MIB / seconds,
        "digest": digest if touch == "sum" else None,
    }
    return row


# -- driver -------------------------------------------------------------------------------
TRANSFORM = (  # (name, kind, workers, threads)
    ("mixle workers", "mixle", 2, 1),
    ("mixle threads", "mixle", 0, 2),
    ("mixle 1 thread", "mixle", 0, 0),
    ("torch", "torch", 2, None),
    ("grain", "grain", 2, None),
)
HANDOFF = (
    ("mixle parent reads", "mixle", 0, 2),
    ("mixle workers", "mixle", 2, 1),
    ("torch", "torch", 2, None),
    ("grain", "grain", 2, None),
)


def run_child(spec: dict[str, Any]) -> dict[str, Any]:
    """Run one measurement in a fresh interpreter and return its row."""
    what = f"{spec['table']} {spec['name']}"
    return run_measurement(__file__, ["--child", json.dumps(spec)], what)


def specs(plan: dict[str, Any], volume: str, rows: str, steps: int, only: set[str]) -> list:
    """Every contender's spec, in the order of the tables."""
    out: list[dict[str, Any]] = []
    if "transform" in only:
        common = {
            "table": "transform",
            "volume": volume,
            "patch": plan["patch"],
            "batch": plan["batch"],
            "batches": plan["batches"],
            "warm": plan["warm"],
            "steps": steps,
            "touch": "sum",  # small batches: the digest proves equal work, for a few us
        }
        for name, kind, workers, threads in TRANSFORM:
            out.append({**common, "name": name, "kind": kind, "workers": workers,
                        "threads": threads})  # fmt: skip
    if "handoff" in only:
        common = {
            "table": "handoff",
            "rows": rows,
            "batch": plan["handoff_batch"],
            "batches": plan["handoff_batches"],
            "warm": plan["warm"],
        }
        for touch in ("none", "sum"):
            for name, kind, workers, threads in HANDOFF:
                out.append({**common, "name": name, "kind": kind, "workers": workers,
                            "threads": threads, "touch": touch})  # fmt: skip
    return out


def best_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the highest rate, with the shortest start-up (and the highest rate with
    start-up) of all runs."""
    best = dict(max(runs, key=lambda r: r["batches_per_s"]))
    best["startup_s"] = min(r["startup_s"] for r in runs)
    for key in ("records_per_s_with_startup", "batches_per_s_with_startup"):
        best[key] = max(r[key] for r in runs)
    best["runs"] = len(runs)
    return best


def add_ratios(rows: list[dict[str, Any]]) -> None:
    """``x_threads`` (table a) and ``x_parent`` (table b) on every row."""
    threads = next(
        (r for r in rows if r["table"] == "transform" and r["contender"] == "mixle threads"),
        None,
    )
    parent = {
        r["touch"]: r
        for r in rows
        if r["table"] == "handoff" and r["contender"] == "mixle parent reads"
    }
    for r in rows:
        if r["table"] == "transform" and threads:
            r["x_threads"] = r["records_per_s"] / threads["records_per_s"]
        if r["table"] == "handoff" and r["touch"] in parent:
            ref = parent[r["touch"]]
            r["x_parent_rate"] = r["batches_per_s"] / ref["batches_per_s"]
            r["x_parent_cpu"] = r["parent_cpu_ms_per_mib"] / ref["parent_cpu_ms_per_mib"]


def print_tables(rows: list[dict[str, Any]], plan: dict[str, Any], steps: int) -> None:
    cpus = os.cpu_count()
    a = [r for r in rows if r["table"] == "transform"]
    if a:
        print(
            f"\n(a) Python-heavy record transform on {cpus} CPUs: {plan['patch']}^3 float32 "
            f"patches of a {plan['volume']}^3 .npy volume, batch {plan['batch']}, "
            f"{plan['batches']} batches, ~{plan['busy_ms']:g} ms of pure Python per record "
            f"({steps} steps); rate from batch {plan['warm']} to the last; best of "
            f"{plan['repeats']}"
        )
        print(
            "| contender | workers | threads | records/s | x threads | start-up s "
            "| records/s with start-up | parent CPU s | digest |"
        )
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for r in a:
            print(
                f"| {r['contender']} | {r['workers']} | {_fmt(r['threads'])} "
                f"| {r['records_per_s']:.0f} | {_fmt(r.get('x_threads'), 2)} "
                f"| {r['startup_s']:.2f} | {r['records_per_s_with_startup']:.0f} "
                f"| {r['parent_cpu_s']:.2f} | {r['digest']:.6g} |"
            )
        by = {r["contender"]: r for r in a}
        if "mixle workers" in by:
            w = by["mixle workers"]["records_per_s"]
            others = {n: by[n]["records_per_s"] for n in ("torch", "grain") if n in by}
            verdict = w >= GOAL_THREADS * by["mixle threads"]["records_per_s"] and all(
                w >= v for v in others.values()
            )
            print(
                f"goal: mixle workers >= {GOAL_THREADS}x threads and >= torch and grain: "
                f"{by['mixle workers'].get('x_threads', 0):.2f}x threads, "
                + ", ".join(f"{w / v:.2f}x {n}" for n, v in others.items())
                + (" -- met" if verdict else " -- NOT met")
            )
    b = [r for r in rows if r["table"] == "handoff"]
    if b:
        shape = plan["row_shape"]
        mib = plan["handoff_batch"] * shape[0] * shape[1] * 4 / MIB
        print(
            f"\n(b) Hand-off on {cpus} CPUs: batches of {plan['handoff_batch']} float32 "
            f"records {shape[0]}x{shape[1]} ({mib:g} MiB), identity transform, "
            f"{plan['handoff_batches']} batches; consumer 'none' drops each batch untouched, "
            f"'sum' sums every element; parent CPU = getrusage(RUSAGE_SELF) user+system "
            f"(children excluded) from batch {plan['warm']} to the last; best of "
            f"{plan['repeats']}"
        )
        print(
            "| consumer | contender | workers | threads | batches/s | MiB/s | x parent rate "
            "| parent CPU ms/MiB | x parent CPU | start-up s | batches/s with start-up |"
        )
        print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for r in b:
            print(
                f"| {r['touch']} | {r['contender']} | {r['workers']} | {_fmt(r['threads'])} "
                f"| {r['batches_per_s']:.2f} | {r['mib_per_s']:.0f} "
                f"| {_fmt(r.get('x_parent_rate'), 2)} | {r['parent_cpu_ms_per_mib']:.3f} "
                f"| {_fmt(r.get('x_parent_cpu'), 3)} | {r['startup_s']:.2f} "
                f"| {r['batches_per_s_with_startup']:.2f} |"
            )
        for touch in ("none", "sum"):
            got = [r for r in b if r["touch"] == touch and r["contender"] == "mixle workers"]
            if got and "x_parent_cpu" in got[0]:
                x = got[0]["x_parent_cpu"]
                print(
                    f"goal ({touch}): mixle workers' parent CPU per MiB <= {GOAL_PARENT}x the "
                    f"parent reading itself: {x:.3f}x" + (" -- met" if x <= GOAL_PARENT else
                                                          " -- NOT met")
                )  # fmt: skip


def _fmt(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _progress(row: dict[str, Any]) -> str:
    keys = ("table", "contender", "touch", "records_per_s", "batches_per_s", "startup_s",
            "parent_cpu_ms_per_mib")  # fmt: skip
    return "  " + " ".join(
        f"{k}={round(row[k], 3) if isinstance(row[k], float) else row[k]}" for k in keys
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run at a tiny size")
    parser.add_argument("--json", action="store_true", help="also print rows as JSON lines")
    parser.add_argument("--repeats", type=int, help="interleaved runs of every contender (3)")
    parser.add_argument("--data-dir", help="keep the data files in this folder and reuse them")
    parser.add_argument("--only", help="comma-separated tables to run (transform,handoff)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(json.loads(args.child))))
        return
    plan = dict(QUICK if args.quick else FULL)
    if args.repeats is not None:
        plan["repeats"] = args.repeats
    only = set(args.only.split(",")) if args.only else {"transform", "handoff"}
    steps = calibrate(plan["busy_ms"])
    print(f"{os.cpu_count()} CPUs; {steps} steps of pure Python take ~{plan['busy_ms']:g} ms")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(args.data_dir) if args.data_dir else Path(tmp)
        volume, rows = write_data(folder, plan)
        todo = specs(plan, volume, rows, steps, only)
        runs: list[list[dict[str, Any]]] = [[] for _ in todo]
        for _ in range(plan["repeats"]):  # interleaved: a busy moment hits one run of each
            for spec, done in zip(todo, runs):
                done.append(run_child(spec))
                print(_progress(done[-1]), flush=True)
    out = [best_of(done) for done in runs]
    add_ratios(out)
    if args.json:
        for row in out:
            print(json.dumps(row))
    print_tables(out, plan, steps)


if __name__ == "__main__":
    main()
