"""Record sources vs pandas and pyarrow on the same files: rows/s and peak RSS.

Each measurement runs in a fresh process (through ``sh -c``, so the parent's peak RSS does
not carry over) and prints one row of the table:

- ``random batches``: ``get_batch`` of shuffled batches of 256 rows (index/row groups
  loaded first, as in a training epoch), vs pandas ``iloc`` and pyarrow ``take`` on a table
  read whole into memory.
- ``streaming``: every row once, in blocks, vs pandas ``read_csv(chunksize=)`` and pyarrow's
  streaming readers.

Usage: ``python3 benchmarks/tabular.py [--rows 1000000]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap

import numpy as np

BATCH = 256
BATCHES = 200

MEASURE = textwrap.dedent(
    """
    import json, resource, sys, time
    import numpy as np
    kind, method, path, batch, batches = sys.argv[1:6]
    batch, batches = int(batch), int(batches)

    def peak():
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    rows = 0
    if method == "mixle-random":
        import mixle
        src = mixle.read_csv(path) if kind == "csv" else mixle.read_parquet(path)
        n = len(src)
        t0 = time.perf_counter()
        for _ in range(batches):
            rows += len(src.get_batch(rng.integers(0, n, batch))["a"])
    elif method == "mixle-stream":
        import mixle
        src = mixle.read_csv(path) if kind == "csv" else mixle.read_parquet(path)
        for block in src.iter_batches(8192):
            rows += len(block["a"])
    elif method == "pandas-random":
        import pandas as pd
        df = pd.read_csv(path) if kind == "csv" else pd.read_parquet(path)
        t0 = time.perf_counter()
        for _ in range(batches):
            part = df.iloc[rng.integers(0, len(df), batch)]
            rows += len({c: part[c].to_numpy() for c in df.columns}["a"])
    elif method == "pandas-stream":
        import pandas as pd
        for chunk in pd.read_csv(path, chunksize=8192):
            rows += len(chunk)
    elif method == "pyarrow-random":
        import pyarrow.csv as pacsv, pyarrow.parquet as pq
        table = pacsv.read_csv(path) if kind == "csv" else pq.read_table(path)
        t0 = time.perf_counter()
        for _ in range(batches):
            part = table.take(rng.integers(0, table.num_rows, batch))
            rows += len({c: part.column(c).to_numpy() for c in part.column_names}["a"])
    elif method == "pyarrow-stream":
        import pyarrow.csv as pacsv, pyarrow.parquet as pq
        if kind == "csv":
            for b in pacsv.open_csv(path):
                rows += b.num_rows
        else:
            for b in pq.ParquetFile(path).iter_batches(8192):
                rows += b.num_rows
    elapsed = time.perf_counter() - t0
    print(json.dumps({"rows_per_s": rows / elapsed, "peak_mib": peak()}))
    """
)


def _write(folder: str, rows: int) -> tuple[str, str]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    a = np.arange(rows)
    b = rng.standard_normal(rows)
    name = np.char.add("name-", (a % 9973).astype(str))
    csv_path = os.path.join(folder, "table.csv")
    with open(csv_path, "w") as fh:
        fh.write("a,b,name\n")
        for lo in range(0, rows, 100_000):
            part = zip(
                a[lo : lo + 100_000].tolist(),
                b[lo : lo + 100_000].tolist(),
                name[lo : lo + 100_000].tolist(),
            )
            fh.write("".join(f"{x},{y!r},{z}\n" for x, y, z in part))
    pq_path = os.path.join(folder, "table.parquet")
    pq.write_table(pa.table({"a": a, "b": b, "name": name}), pq_path, row_group_size=65_536)
    return csv_path, pq_path


def _run(kind: str, method: str, path: str, env: dict[str, str]) -> dict[str, float]:
    out = subprocess.run(
        [
            "sh",
            "-c",
            '"$0" -c "$1" "$2" "$3" "$4" "$5" "$6"',
            sys.executable,
            MEASURE,
            kind,
            method,
            path,
            str(BATCH),
            str(BATCHES),
        ],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        csv_path, pq_path = _write(folder, args.rows)
        env = {**os.environ, "MIXLE_CACHE_DIR": os.path.join(folder, "cache")}
        sizes = {"csv": os.path.getsize(csv_path), "parquet": os.path.getsize(pq_path)}
        print(f"{args.rows:,} rows (int64, float64, string); random batches of {BATCH} rows")
        print(f"{'file':<22} {'method':<16} {'access':<15} {'rows/s':>12} {'peak RSS':>10}")
        for kind, path in (("csv", csv_path), ("parquet", pq_path)):
            label = f"{kind} ({sizes[kind] / 2**20:.0f} MiB)"
            for method in ("mixle", "pandas", "pyarrow"):
                for access in ("random", "stream"):
                    if kind == "parquet" and method == "pandas" and access == "stream":
                        continue  # pandas has no streaming Parquet reader
                    result = _run(kind, f"{method}-{access}", path, env)
                    shown = "random batches" if access == "random" else "streaming"
                    print(
                        f"{label:<22} {method:<16} {shown:<15} "
                        f"{result['rows_per_s']:>12,.0f} {result['peak_mib']:>7.0f} MiB"
                    )


if __name__ == "__main__":
    main()
