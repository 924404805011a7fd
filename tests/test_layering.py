"""The layer order of ``docs/architecture.md``, checked on mixle's own source with ``ast``.

The order is read from the page's ``layers`` block, so the page and this test cannot drift
apart. Every import in ``mixle/`` (at module level or inside a function; type-only imports
under ``if TYPE_CHECKING:`` excepted) names its own layer or a lower one; runtime imports form
no cycle; and a heavy optional dependency is imported at module level only inside the adapter
that needs it.
"""

from __future__ import annotations

import ast
import fnmatch
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "mixle"
ARCHITECTURE = ROOT / "docs" / "architecture.md"

# heavy optional dependencies -> the modules (dotted prefixes) that may import them at module level
ADAPTERS: dict[str, tuple[str, ...]] = {
    "jax": ("mixle.jax",),
    "jaxlib": ("mixle.jax",),
    "zarr": ("mixle.data.sources.arrays.zarr",),
    "numcodecs": ("mixle.data.sources.arrays.zarr", "mixle.data.sources.arrays.n5"),
    "icechunk": ("mixle.data.sources.arrays.zarr",),
    "tifffile": ("mixle.data.sources.arrays.tiff",),
    "imagecodecs": ("mixle.data.sources.arrays.tiff",),
    "nibabel": ("mixle.data.sources.arrays.nifti",),
    "blosc2": ("mixle.data.sources.arrays.b2nd",),
    "h5py": ("mixle.data.sources.arrays.hdf5",),
    "hdf5plugin": ("mixle.data.sources.arrays.hdf5",),
    "pyarrow": ("mixle.data.sources.records.parquet_source",),
    "sqlalchemy": (
        "mixle.data.sources.records.sql.sql_connect",
        "mixle.data.sources.records.sql.sql_backend",
    ),
    "pandas": ("mixle.data.sources.records.dataframe_source",),
    "datasets": ("mixle.data.sources.records.hf",),
    "array_record": ("mixle.data.sources.records.array_record_source",),
    "polars": ("mixle.data.sources.records.dataframe_source",),
    "dask": ("mixle.utils.parallel.dask_backend",),
    "distributed": ("mixle.utils.parallel.dask_backend",),
    "fsspec": ("mixle.reading",),
    "aiohttp": ("mixle.reading",),
    "s3fs": ("mixle.reading",),
    "obstore": ("mixle.reading",),
    "matplotlib": ("mixle.plot",),
    "torch": (),
    "tensorstore": (),
    "xarray": (),
    "netCDF4": (),
    "h5netcdf": (),
}


def read_layers(text: str) -> list[tuple[str, list[str]]]:
    """``[(layer, [module patterns])]``, lowest first, from the page's ``layers`` block."""
    block = re.search(r"```text\n# layers.*?\n(.*?)```", text, re.S)
    assert block, f"{ARCHITECTURE} has no ```text # layers block"
    layers = []
    for line in block.group(1).splitlines():
        if line.strip():
            name, *patterns = line.split()
            layers.append((name, patterns))
    return layers


LAYERS = read_layers(ARCHITECTURE.read_text())


def layer_of(module: str, layers: list[tuple[str, list[str]]] = LAYERS) -> int:
    """The index of ``module``'s layer: the longest pattern that matches it wins."""
    best: tuple[int, int] | None = None
    for index, (_, patterns) in enumerate(layers):
        for pattern in patterns:
            if fnmatch.fnmatchcase(module, pattern) and (best is None or len(pattern) > best[0]):
                best = (len(pattern), index)
    if best is None:
        raise AssertionError(f"{module} is in no layer of {ARCHITECTURE.name}")
    return best[1]


def modules(package: Path = PACKAGE) -> dict[str, Path]:
    """Every module of the package, by dotted name."""
    found = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> list[tuple[str, int, bool]]:
    """``(imported module, line, run at import)`` for every runtime import in ``path``.

    Import statements, and calls that import by a literal name: ``importlib.import_module``,
    ``__import__`` and mixle's ``require``. Bodies of ``if TYPE_CHECKING:`` are skipped.
    """
    tree = ast.parse(path.read_text(), str(path))
    type_only = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and _is_type_checking(node.test)
        for stmt in node.body
        for inner in ast.walk(stmt)
    }
    at_import = _run_at_import(tree)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, *([base] if base else [])])
            targets = [
                f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names
            ]
        elif isinstance(node, ast.Call) and (literal := _imported_by_call(node)) is not None:
            targets = [literal]
        else:
            continue
        found += [(target, node.lineno, id(node) in at_import) for target in targets]
    return found


def _is_type_checking(test: ast.expr) -> bool:
    """Whether an ``if`` test is exactly ``TYPE_CHECKING`` (or ``typing.TYPE_CHECKING``)."""
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imported_by_call(call: ast.Call) -> str | None:
    """The literal module name an ``import_module``/``__import__``/``require`` call imports."""
    func = call.func
    called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if called not in ("import_module", "__import__", "require") or not call.args:
        return None
    first = call.args[0]
    return first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) else None


def _run_at_import(tree: ast.Module) -> set[int]:
    """Ids of the nodes run when the module is imported: all but function bodies (class
    bodies, ``with``/``try``/``if`` blocks, decorators and default values included)."""
    out: set[int] = set()

    def visit(node: ast.AST) -> None:
        out.add(id(node))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            arguments = node.args
            parts = [*arguments.defaults, *arguments.kw_defaults]
            if not isinstance(node, ast.Lambda):
                parts += node.decorator_list
            for part in parts:
                if part is not None:
                    visit(part)
            return
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return out


def upward_imports(known: dict[str, Path], layers: list[tuple[str, list[str]]]) -> list[str]:
    """``module -> target`` lines for every import that names a higher layer."""
    bad = []
    for name, path in known.items():
        mine = layer_of(name, layers)
        for target, line, _ in imports(name, path, known):
            if target.split(".")[0] == "mixle" and layer_of(target, layers) > mine:
                theirs = layers[layer_of(target, layers)][0]
                bad.append(f"{path}:{line}: {name} ({layers[mine][0]}) imports {target} ({theirs})")
    return bad


def import_cycles(known: dict[str, Path]) -> list[list[str]]:
    """The strongly connected groups (more than one module) of the runtime import graph."""
    graph = {
        name: sorted({t for t, _, _ in imports(name, path, known) if t in known and t != name})
        for name, path in known.items()
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []
    for root in graph:  # Tarjan's algorithm, iterative
        if root in index:
            continue
        work = [(root, iter(graph[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    work.append((child, iter(graph[child])))
                elif child in stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    cycles.append(sorted(group))
    return cycles


def heavy_imports(known: dict[str, Path]) -> list[str]:
    """Module-level imports of a heavy optional dependency outside its adapter."""
    bad = []
    for name, path in known.items():
        for target, line, at_top in imports(name, path, known):
            allowed = ADAPTERS.get(target.split(".")[0])
            inside = allowed is not None and any(
                name == a or name.startswith(f"{a}.") for a in allowed
            )
            if at_top and allowed is not None and not inside:
                bad.append(f"{path}:{line}: {name} imports {target} at module level")
    return bad


def test_every_module_has_a_layer() -> None:
    for name in modules():
        layer_of(name)


def test_no_import_runs_upward() -> None:
    assert upward_imports(modules(), LAYERS) == []


def test_no_import_cycle() -> None:
    assert import_cycles(modules()) == []


def test_heavy_optional_dependencies_stay_in_their_adapter() -> None:
    assert heavy_imports(modules()) == []


def test_the_checks_catch_what_they_guard(tmp_path: Path) -> None:
    """Upward imports, a cycle and module-level heavy imports are each reported, however
    they are spelled; a type-only import is not."""
    package = tmp_path / "mixle"
    (package / "reading").mkdir(parents=True)
    (package / "data" / "sources").mkdir(parents=True)
    for init in ("", "reading/", "data/", "data/sources/"):
        (package / f"{init}__init__.py").write_text("")
    files = {
        "reading/plan.py": "def f():\n    from mixle.data.sources import zarr_source\n",
        "reading/by_name.py": "import importlib\nimportlib.import_module('mixle.loading')\n",
        "reading/negated.py": (
            "from typing import TYPE_CHECKING\nif not TYPE_CHECKING:\n    import mixle.loading\n"
        ),
        "data/sources/zarr_source.py": "import zarr\nfrom mixle.data.sources import other\n",
        "data/sources/other.py": "from mixle.data.sources.zarr_source import x\n",
        "data/sources/typed.py": (
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import mixle.loading\n"
        ),
        "data/sources/in_class.py": "class A:\n    import h5py\n",
        "data/sources/required.py": "from x import require\nH5 = require('h5py')\n",
        "data/sources/lazy.py": "def f(a=1):\n    import h5py\n",
    }
    for name, text in files.items():
        (package / name).write_text(text)
    known = modules(package)
    layers = [
        ("base", ["mixle", "mixle.data"]),
        ("reading", ["mixle.reading", "mixle.reading.*"]),
        ("sources", ["mixle.data.sources", "mixle.data.sources.*"]),
        ("loading", ["mixle.loading"]),
    ]
    upward = sorted(line.split(": ", 1)[1] for line in upward_imports(known, layers))
    assert upward == [
        "mixle.reading.by_name (reading) imports mixle.loading (loading)",
        "mixle.reading.negated (reading) imports mixle.loading (loading)",
        "mixle.reading.plan (reading) imports mixle.data.sources.zarr_source (sources)",
    ]
    assert import_cycles(known) == [["mixle.data.sources.other", "mixle.data.sources.zarr_source"]]
    heavy = sorted(line.split(": ", 1)[1] for line in heavy_imports(known))
    assert heavy == [
        "mixle.data.sources.in_class imports h5py at module level",
        "mixle.data.sources.required imports h5py at module level",
        "mixle.data.sources.zarr_source imports zarr at module level",
    ]


@pytest.mark.parametrize(
    ("module", "layer"),
    [
        ("mixle.utils.parallel.multiprocessing", "parallel"),
        ("mixle.utils.files", "base"),
        ("mixle.data.sources.array_source", "faces"),
        ("mixle.data.sources.arrays.zarr.chunks", "sources"),
        ("mixle.data.index_math.sharding", "contracts"),
    ],
)
def test_the_most_specific_pattern_names_the_layer(module: str, layer: str) -> None:
    assert LAYERS[layer_of(module)][0] == layer
