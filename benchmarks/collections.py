"""Many volumes: random patches across a collection of zarr volumes of different shapes,
mixle's collection sampler against a hand-written per-volume wrapper and TorchIO's queue.

Run: python benchmarks/collections.py [--quick] [--json] [--volumes 200] [--batches 30]
     [--seconds 6] [--locality 16] [--repeats 2] [--tiny 100,1000,10000] [--data-dir DIR]
     [--no-torchio] [--only mixle,wrapper,torchio] [--small-max-open 64]

Writes ``--volumes`` float32 volumes (default 200) whose every axis is drawn from
``[--min-size, --max-size]`` (64..160), each zstd-compressed in cubic chunks whose edge is
drawn from 32..64 (zarr v3), seeded, into a temporary folder (``--data-dir`` keeps them
there and reuses them on the next run). Then reads random 32^3 patches in batches of 64,
every contender in its own fresh process so that its peak RSS is its own:

- ``mixle``: ``mixle.read_volumes(paths)`` and ``mixle.PatchSampler(vols, 32, n, seed=0,
  volume_weights=..., patches_per_volume=k)`` through ``mixle.Loader(sampler, 64,
  shuffle=True)`` (the loader keeps each block of ``k`` records together): every batch is
  read by ``get_batch``, grouped by volume, each chunk decoded once;
- ``wrapper``: the per-volume wrapper ``PatchesByRow`` that ``docs/tabular.md`` showed for
  "a table of volume paths" (a sampler per volume, all opened up front, records read one
  by one), over a CSV of the zarr paths, through ``mixle.Loader(wrapper, 64, shuffle=True,
  shuffle_block=k)``;
- ``torchio``: ``tio.Queue(tio.SubjectsDataset(...), max_length, samples_per_volume=k,
  tio.UniformSampler(32), num_workers=w)`` whose subjects read each zarr volume whole with
  a custom reader, iterated by ``torch.utils.data.DataLoader(queue, batch_size=64)``;
  ``max_length`` is ``max(2 * batch, 8 * k)``. Skipped (with a line saying how to install
  it) when TorchIO is not installed.

``k`` is 1 (every patch from its own volume) and ``--locality`` (default 16: TorchIO's
``samples_per_volume``, mixle's ``patches_per_volume``, the wrapper's shuffle block), so
each TorchIO row has mixle and wrapper rows at equal locality. mixle and the wrapper run
with the default chunk cache and with it off (``set_chunk_cache_bytes(0)``). mixle runs with
``read_volumes``' default ``max_open`` (``DEFAULT_MAX_OPEN``, from the descriptor limit: 256
where it is 2,048 or more, so every one of 200 volumes keeps its handle, as the wrapper's
do); two more mixle rows bound it below the number of volumes (``--small-max-open``, 64, the
former default; ``--quick``: 3), so that volumes are given back and reopened. Every
contender runs ``--repeats`` times, the runs interleaved; the table shows each one's run
with the most patches/s.

Columns: patches/s over the batches after the first (at most ``--batches``, stopping after
``--seconds``); ``x wrapper`` and ``x torchio`` divide by the wrapper row with the same
``k`` and chunk cache and by the TorchIO row with the same ``k`` and 0 workers; ``first
batch``: seconds from opening (after the imports) to the first batch in hand, the shortest
of the runs; ``peak RSS``: VmHWM of the process (``/proc/self/status``) at the end,
``+RSS`` that minus VmHWM after the imports, ``+RSS x torchio`` its ratio to TorchIO's at
the same ``k``; ``workers``: the largest sum of the worker processes' private memory
(Private_Clean + Private_Dirty, ``/proc/<pid>/smaps_rollup``), sampled after each batch;
``vols/batch``: distinct volumes in a batch, on average. The JSON rows also hold the
chunk cache's hits and misses over the whole run (mixle and the wrapper).

A second table: time to first batch for ``--tiny`` collections of 16^3 ``.npy`` volumes
(100, 1,000 and 10,000), each in fresh processes (shortest of ``--repeats``): mixle with
``volume_weights="uniform"`` (opens only the volumes it reads), with the Loader's reader
threads and with ``num_threads=0`` (nothing read ahead), and the part of it spent in
``read_volumes``; mixle with ``"voxels"`` (reads every volume's shape first); the wrapper
(opens every volume).

``--quick`` runs a smoke version (a few small volumes, 16^3 patches, tiny collections of
10 and 100, one run each) in well under a minute; ``--json`` prints the rows as JSON lines.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from _proc import children, private_bytes, run_measurement, vm_hwm

MIB = 2**20
SEED = 0
TORCHIO_INSTALL = 'pip install -e ".[bench]" in a clone of mixle'
FULL: dict[str, Any] = {
    "volumes": 200,
    "min_size": 64,
    "max_size": 160,
    "min_chunk": 32,
    "max_chunk": 64,
    "patch": 32,
    "batch": 64,
    "locality": 16,
    "batches": 30,
    "seconds": 6.0,
    "tiny": (100, 1000, 10000),
    "tiny_size": 16,
    "tiny_patch": 8,
    "repeats": 2,
    "small_max_open": 64,
}
QUICK: dict[str, Any] = {
    "volumes": 6,
    "min_size": 24,
    "max_size": 40,
    "min_chunk": 8,
    "max_chunk": 16,
    "patch": 16,
    "batch": 8,
    "locality": 4,
    "batches": 3,
    "seconds": 1.0,
    "tiny": (10, 100),
    "tiny_size": 8,
    "tiny_patch": 4,
    "repeats": 1,
    "small_max_open": 3,
}


# -- data ---------------------------------------------------------------------------------
def volume_layout(plan: dict[str, Any]) -> list[tuple[tuple[int, int, int], int]]:
    """Seeded ``(shape, chunk edge)`` of every volume."""
    rng = np.random.default_rng(SEED)
    out = []
    for _ in range(plan["volumes"]):
        shape = tuple(int(s) for s in rng.integers(plan["min_size"], plan["max_size"] + 1, 3))
        chunk = int(rng.integers(plan["min_chunk"], plan["max_chunk"] + 1))
        out.append((shape, chunk))
    return out  # type: ignore[return-value]


def write_volumes(folder: Path, plan: dict[str, Any]) -> list[str]:
    """The zarr volumes of ``plan`` under ``folder`` (reused when already written)."""
    import zarr
    from zarr.codecs import ZstdCodec

    layout = volume_layout(plan)
    manifest = folder / "manifest.json"
    want = json.dumps([[list(s), c] for s, c in layout])
    paths = [str(folder / f"vol{v:05d}.zarr") for v in range(len(layout))]
    if manifest.exists() and manifest.read_text() == want:
        return paths
    folder.mkdir(parents=True, exist_ok=True)
    for v, ((shape, chunk), path) in enumerate(zip(layout, paths)):
        arr = zarr.create_array(
            path,
            shape=shape,
            chunks=(chunk,) * 3,
            dtype="f4",
            compressors=ZstdCodec(),
            overwrite=True,
        )
        z, y, x = np.ogrid[0 : shape[0], 0 : shape[1], 0 : shape[2]]
        arr[...] = (np.sin(0.05 * z + 0.1 * v) * np.cos(0.03 * y) + 0.01 * x + v).astype("f4")
    with open(folder / "volumes.csv", "w") as fh:
        fh.write("volume_path,label\n")
        fh.writelines(f"{p},{v}\n" for v, p in enumerate(paths))
    manifest.write_text(want)
    return paths


def write_tiny(folder: Path, count: int, size: int) -> list[str]:
    """``count`` float32 ``size``^3 ``.npy`` volumes (reused when already written)."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = [str(folder / f"t{v:05d}.npy") for v in range(count)]
    done = folder / "done"
    if done.exists() and done.read_text() == f"{count} {size}":
        return paths
    block = np.zeros((size,) * 3, dtype="f4")
    for v, path in enumerate(paths):
        block.fill(v)
        np.save(path, block)
    with open(folder / "volumes.csv", "w") as fh:
        fh.write("volume_path,label\n")
        fh.writelines(f"{p},{v}\n" for v, p in enumerate(paths))
    done.write_text(f"{count} {size}")
    return paths


# -- memory -------------------------------------------------------------------------------


# -- contenders, each in its own process --------------------------------------------------
class PatchesByRow:
    """Patches of the volume each table row names, with the row's label.

    The wrapper of ``docs/tabular.md`` ("Joining a table with volumes"), reading zarr
    volumes instead of ``.npy`` ones.
    """

    def __init__(self, table: Any, per_volume: int, patch_size: int, seed: int = 0) -> None:
        import mixle

        self.table, self.per_volume = table, per_volume
        self.samplers = {}
        for row in table.records():
            volume = mixle.read_zarr(row["volume_path"])
            self.samplers[row["volume_path"]] = mixle.PatchSampler(
                volume, patch_size, per_volume, seed=seed
            )

    def __len__(self) -> int:
        return len(self.table) * self.per_volume

    def __getitem__(self, i: int) -> dict[str, Any]:
        row = self.table[i // self.per_volume]
        patch, _corner = self.samplers[row["volume_path"]][i % self.per_volume]
        return {"patch": patch, "label": row["label"]}


class _NpyPatchesByRow(PatchesByRow):
    """The same wrapper over ``.npy`` volumes (as written in ``docs/tabular.md``)."""

    def __init__(self, table: Any, per_volume: int, patch_size: int, seed: int = 0) -> None:
        import mixle

        self.table, self.per_volume = table, per_volume
        self.samplers = {}
        for row in table.records():
            volume = mixle.read_npy(row["volume_path"])
            self.samplers[row["volume_path"]] = mixle.PatchSampler(
                volume, patch_size, per_volume, seed=seed
            )


def read_zarr_whole(path: Any) -> tuple[Any, np.ndarray]:
    """TorchIO reader: the whole zarr volume as a ``(1, *shape)`` tensor, identity affine."""
    import torch
    import zarr

    data = zarr.open_array(str(path), mode="r")[...]
    return torch.from_numpy(data[None]), np.eye(4)


def mixle_batches(spec: dict[str, Any]) -> tuple[Any, Any, float]:
    import mixle

    options = {"max_open": spec["max_open"]} if spec.get("max_open") else {}
    vols = mixle.read_volumes(spec["paths"], **options)
    opened = time.perf_counter()
    sampler = mixle.PatchSampler(
        vols,
        spec["patch"],
        spec["num_patches"],
        seed=SEED,
        volume_weights=spec["weights"],
        patches_per_volume=spec["k"],
    )
    loader = mixle.Loader(
        sampler,
        spec["batch"],
        shuffle=True,
        seed=SEED,
        num_epochs=None,
        num_threads=spec.get("threads"),
    )
    return ((b["volume"], b["patch"].shape) for b in loader), vols, opened


def wrapper_batches(spec: dict[str, Any]) -> tuple[Any, Any, float]:
    import mixle

    k = spec["k"]
    per_volume = -(-spec["num_patches"] // (len(spec["paths"]) * k)) * k
    cls = _NpyPatchesByRow if spec["paths"][0].endswith(".npy") else PatchesByRow
    table = mixle.read_csv(spec["table"])
    opened = time.perf_counter()
    dataset = cls(table, per_volume=per_volume, patch_size=spec["patch"])
    loader = mixle.Loader(
        dataset, spec["batch"], shuffle=True, shuffle_block=k, seed=SEED, num_epochs=None
    )
    return ((b["label"], b["patch"].shape) for b in loader), dataset, opened


def torchio_batches(spec: dict[str, Any]) -> tuple[Any, Any, float]:
    import torchio as tio
    from torch.utils.data import DataLoader

    subjects = [
        tio.Subject(image=tio.ScalarImage(p, reader=read_zarr_whole), volume=v)
        for v, p in enumerate(spec["paths"])
    ]
    opened = time.perf_counter()
    k, batch = spec["k"], spec["batch"]
    queue = tio.Queue(
        tio.SubjectsDataset(subjects),
        max_length=max(2 * batch, 8 * k),
        samples_per_volume=k,
        sampler=tio.UniformSampler(spec["patch"]),
        num_workers=spec["workers"],
    )
    loader = DataLoader(queue, batch_size=batch, num_workers=0)

    def endless() -> Any:
        while True:  # the queue's epoch is volumes x k patches; keep going across epochs
            for b in loader:
                yield b["volume"], tuple(b["image"][tio.DATA].shape)

    return endless(), queue, opened


#: The contenders of the time-to-first-batch table.
#: ``(contender, volume weights, Loader reader threads)``; ``None``: the Loader's default.
TINY = (
    ("mixle", "uniform", None),
    ("mixle", "uniform", 0),
    ("mixle", "voxels", None),
    ("wrapper", "uniform", None),
)
BUILDERS = {"mixle": mixle_batches, "wrapper": wrapper_batches, "torchio": torchio_batches}


def measure(spec: dict[str, Any]) -> dict[str, Any]:
    """Time to first batch, patches/s and memory of one contender (in this process)."""
    import mixle  # noqa: F401

    if spec["kind"] == "torchio":
        import torch  # noqa: F401
        import torchio  # noqa: F401
    if spec.get("cache") == "off":
        from mixle.reading import set_chunk_cache_bytes

        set_chunk_cache_bytes(0)
    base = vm_hwm()
    me = os.getpid()
    workers_peak = 0
    start = time.perf_counter()
    batches, keep, _ = BUILDERS[spec["kind"]](spec)
    got, shape = next(batches)
    first = time.perf_counter() - start
    volumes = [len(np.unique(np.asarray(got)))]
    start = time.perf_counter()
    n = patches = 0
    while n < spec["batches"] and (n < 2 or time.perf_counter() - start < spec["seconds"]):
        got = np.asarray(next(batches)[0])
        volumes.append(len(np.unique(got)))
        n += 1
        patches += len(got)  # TorchIO's DataLoader ends each queue epoch on a short batch
        if spec["kind"] == "torchio" and spec["workers"]:
            workers_peak = max(workers_peak, sum(private_bytes(p) for p in children(me)))
    seconds = time.perf_counter() - start
    peak = vm_hwm()
    from mixle.reading import chunk_cache

    stats = chunk_cache().stats()
    return {
        "table": "collection",
        "contender": spec["kind"],
        "weights": spec.get("weights", "uniform"),
        "k": spec["k"],
        "workers": spec.get("workers", 0),
        "cache": spec.get("cache", "default") if spec["kind"] != "torchio" else "-",
        "max_open": keep.max_open if spec["kind"] == "mixle" else None,
        "patches_per_s": patches / seconds,
        "first_batch_s": first,
        "peak_rss_mib": peak / MIB,
        "growth_mib": (peak - base) / MIB,
        "workers_mib": workers_peak / MIB if spec.get("workers") else None,
        "volumes_per_batch": float(np.mean(volumes)),
        "batch_shape": list(shape),
        "cache_hits": stats.hits if spec["kind"] != "torchio" else None,
        "cache_misses": stats.misses if spec["kind"] != "torchio" else None,
        "batches": n,
    }


def measure_first(spec: dict[str, Any]) -> dict[str, Any]:
    """Seconds from opening a collection of tiny volumes to its first batch."""
    import mixle  # noqa: F401

    start = time.perf_counter()
    batches, keep, opened = BUILDERS[spec["kind"]](spec)
    next(batches)
    first = time.perf_counter() - start
    del keep
    return {
        "table": "first",
        "contender": spec["kind"],
        "weights": spec.get("weights", "uniform"),
        "threads": spec.get("threads"),
        "volumes": len(spec["paths"]),
        "open_s": opened - start,
        "first_batch_s": first,
    }


# -- driver -------------------------------------------------------------------------------
def run_child(kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    """Run one measurement in a fresh interpreter and return its row."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as fh:
        json.dump(spec, fh)  # 10,000 paths are too long for a command line
    shown = {k: v for k, v in spec.items() if k != "paths"}
    try:
        return run_measurement(__file__, ["--child", kind, fh.name], f"{kind} {shown}", 900)
    finally:
        os.unlink(fh.name)


def has_torchio() -> bool:
    import importlib.util

    return importlib.util.find_spec("torchio") is not None


def contenders(plan: dict[str, Any], torchio: bool) -> list[dict[str, Any]]:
    """The rows of the main table, in the order they are printed."""
    k = plan["locality"]
    out: list[dict[str, Any]] = []
    for locality in (1, k):
        for weights in ("uniform", "voxels"):
            out.append({"kind": "mixle", "weights": weights, "k": locality})
        out.append({"kind": "wrapper", "k": locality})
        if torchio:
            out.append({"kind": "torchio", "k": locality, "workers": 0})
    if torchio:
        out.append({"kind": "torchio", "k": k, "workers": 2})
    for locality in (1, k):
        out.append({"kind": "mixle", "weights": "uniform", "k": locality, "cache": "off"})
        out.append({"kind": "wrapper", "k": locality, "cache": "off"})
    # a bound below the number of volumes: volumes given back and reopened
    for cache in ("default", "off"):
        small = {"cache": cache, "max_open": plan["small_max_open"]}
        out.append({"kind": "mixle", "weights": "uniform", "k": 1, **small})
    return out


def _fmt(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def print_tables(rows: list[dict[str, Any]], plan: dict[str, Any], torchio: bool) -> None:
    main = [r for r in rows if r["table"] == "collection"]
    ref = {
        (r["contender"], r["k"], r["cache"]): r
        for r in main
        if r["contender"] != "mixle" and r["workers"] == 0
    }
    print(
        f"\n{plan['volumes']} zarr volumes (axes {plan['min_size']}..{plan['max_size']}, zstd, "
        f"chunks {plan['min_chunk']}^3..{plan['max_chunk']}^3), random {plan['patch']}^3 "
        f"patches, batch {plan['batch']}; best of {plan['repeats']} interleaved runs"
    )
    print(
        "| contender | volume weights | k | workers | chunk cache | max_open | patches/s "
        "| x wrapper | x torchio | first batch s | peak RSS MiB | +RSS MiB | +RSS x torchio "
        "| workers MiB | vols/batch |"
    )
    print("| --- | --- | ---: | ---: | --- | ---: |" + " ---: |" * 9)
    for r in main:
        wrap = ref.get(("wrapper", r["k"], r["cache"]))
        tio = ref.get(("torchio", r["k"], "-"))
        x_wrap = r["patches_per_s"] / wrap["patches_per_s"] if wrap else None
        x_tio = r["patches_per_s"] / tio["patches_per_s"] if tio else None
        x_mem = r["growth_mib"] / tio["growth_mib"] if tio and tio["growth_mib"] > 0 else None
        weights = r["weights"] if r["contender"] == "mixle" else "-"
        max_open = "-" if r["max_open"] is None else str(r["max_open"])
        print(
            f"| {r['contender']} | {weights} | {r['k']} | {r['workers']} | {r['cache']} "
            f"| {max_open} | {r['patches_per_s']:.0f} | {_fmt(x_wrap, 2)} | {_fmt(x_tio, 2)} "
            f"| {r['first_batch_s']:.2f} | {r['peak_rss_mib']:.0f} | {r['growth_mib']:.0f} "
            f"| {_fmt(x_mem, 2)} | {_fmt(r['workers_mib'])} | {r['volumes_per_batch']:.1f} |"
        )
    if not torchio:
        print(f"TorchIO rows skipped: torchio is not installed ({TORCHIO_INSTALL})")
    first = {
        (r["contender"], r["weights"], r["threads"], r["volumes"]): r
        for r in rows
        if r["table"] == "first"
    }
    counts = sorted({key[-1] for key in first})
    print(
        f"\nTime to first batch (s) for collections of {plan['tiny_size']}^3 .npy volumes, "
        f"{plan['tiny_patch']}^3 patches, batch {plan['batch']}, best of {plan['repeats']} "
        "(x: against the smallest count; read_volumes: the part spent opening the list; "
        "0 threads: the Loader reads in the caller's thread, nothing read ahead)"
    )
    print(
        "| volumes | mixle uniform | x | of it read_volumes | mixle uniform, 0 threads | x "
        "| mixle voxels | x | wrapper | x |"
    )
    print("| ---: |" + " ---: |" * 9)
    for n in counts:
        cells = []
        for c in TINY:
            here, low = first.get((*c, n)), first.get((*c, counts[0]))
            t = here["first_batch_s"] if here else None
            x = t / low["first_batch_s"] if here and low else None
            cells += [_fmt(t, 3), _fmt(x, 2)]
            if c == ("mixle", "uniform", None):
                cells.append(_fmt(here["open_s"] if here else None, 3))
        print(f"| {n} | " + " | ".join(cells) + " |")


def best_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the most patches/s, with the shortest first batch of all runs (the run
    with the shortest first batch where there is no patches/s)."""
    if "patches_per_s" not in runs[0]:
        return dict(min(runs, key=lambda r: r["first_batch_s"]))
    best = dict(max(runs, key=lambda r: r["patches_per_s"]))
    best["first_batch_s"] = min(r["first_batch_s"] for r in runs)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run of a few seconds")
    parser.add_argument("--json", action="store_true", help="also print rows as JSON lines")
    parser.add_argument("--volumes", type=int, help="volumes in the collection (200)")
    parser.add_argument("--min-size", type=int, help="smallest axis length (64)")
    parser.add_argument("--max-size", type=int, help="largest axis length (160)")
    parser.add_argument("--batches", type=int, help="timed batches per contender at most (30)")
    parser.add_argument("--seconds", type=float, help="timed seconds per contender at most (6)")
    parser.add_argument("--locality", type=int, help="patches per volume of the k rows (16)")
    parser.add_argument("--repeats", type=int, help="interleaved runs of every contender (2)")
    parser.add_argument("--tiny", help="comma-separated counts of tiny volumes (100,1000,10000)")
    parser.add_argument("--data-dir", help="keep the volumes in this folder and reuse them")
    parser.add_argument("--no-torchio", action="store_true", help="skip the TorchIO rows")
    parser.add_argument("--only", help="comma-separated contenders to run (mixle,wrapper,torchio)")
    parser.add_argument(
        "--small-max-open",
        type=int,
        help="max_open of the two mixle rows bounded below the number of volumes (64)",
    )
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, spec_path = args.child
        with open(spec_path) as fh:
            spec = json.load(fh)
        print(json.dumps({"measure": measure, "first": measure_first}[kind](spec)))
        return
    plan = dict(QUICK if args.quick else FULL)
    names = ("volumes", "min_size", "max_size", "batches", "seconds", "locality", "repeats")
    for name in (*names, "small_max_open"):
        if getattr(args, name) is not None:
            plan[name] = getattr(args, name)
    if args.tiny:
        plan["tiny"] = tuple(int(n) for n in args.tiny.split(","))
    torchio = has_torchio() and not args.no_torchio
    only = set(args.only.split(",")) if args.only else set(BUILDERS)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(args.data_dir) if args.data_dir else Path(tmp)
        begin = time.perf_counter()
        paths = write_volumes(folder / "collection", plan)
        print(f"volumes ready in {time.perf_counter() - begin:.1f} s", flush=True)
        common = {
            "paths": paths,
            "table": str(folder / "collection" / "volumes.csv"),
            "patch": plan["patch"],
            "batch": plan["batch"],
            "batches": plan["batches"],
            "seconds": plan["seconds"],
            "num_patches": (plan["batches"] + 2) * plan["batch"] * 4,
        }
        specs = [s for s in contenders(plan, torchio) if s["kind"] in only]
        runs: list[list[dict[str, Any]]] = [[] for _ in specs]
        for _ in range(plan["repeats"]):  # interleaved: a busy moment hits one run of each
            for spec, done in zip(specs, runs):
                done.append(run_child("measure", {**common, **spec}))
                print(_progress(done[-1]), flush=True)
        rows += [best_of(done) for done in runs]
        tiny_runs = []
        for count in plan["tiny"]:
            tiny = write_tiny(folder / f"tiny{count}", count, plan["tiny_size"])
            spec = {
                "paths": tiny,
                "table": str(folder / f"tiny{count}" / "volumes.csv"),
                "patch": plan["tiny_patch"],
                "batch": plan["batch"],
                "num_patches": plan["batch"] * 10,
                "k": 1,
            }
            tiny_runs += [
                {**spec, "kind": c, "weights": w, "threads": t} for c, w, t in TINY if c in only
            ]
        runs = [[] for _ in tiny_runs]
        for _ in range(plan["repeats"]):
            for spec, done in zip(tiny_runs, runs):
                done.append(run_child("first", spec))
                print(_progress(done[-1]), flush=True)
        rows += [best_of(done) for done in runs]
    if args.json:
        for row in rows:
            print(json.dumps(row))
    print_tables(rows, plan, torchio)


def _progress(row: dict[str, Any]) -> str:
    shown = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()}
    return "  " + " ".join(f"{k}={v}" for k, v in shown.items())


if __name__ == "__main__":
    main()
