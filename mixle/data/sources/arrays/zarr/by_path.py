"""What a local path given to ``read_zarr`` is: a zipped zarr store, an icechunk repository,
an N5 container or a file of another format, before zarr is asked to open it.

:func:`open_by_path` returns the zarr store to open for a ``.zip`` file (zarr's
``ZipStore``, read-only) or an icechunk repository folder (a read-only session's store), or
``None`` when zarr opens the path itself (a zarr folder, a URL, a store object). An N5
container, an HDF5, TIFF, NIfTI, ``.npy`` or ``.npz`` file raises
:class:`~mixle.errors.UnsupportedStoreError` naming the mixle reader that opens it.
Nothing here writes to the path: zip files are opened with ``mode="r"``, icechunk
repositories through a read-only session, and icechunk is only asked to open a folder
whose layout is an icechunk repository's (``Repository.open`` creates the folder of a
path that does not exist).
"""

from __future__ import annotations

import json
import os
import stat
import zipfile
from dataclasses import dataclass
from typing import Any

from mixle.data.sources.arrays.base import listing
from mixle.data.sources.arrays.zarr.limits import ZARR_METADATA_LIMIT
from mixle.data.sources.arrays.zarr.zip_members import zip_file_of
from mixle.errors import UnsupportedStoreError
from mixle.utils.files import open_regular_file, require_regular_file
from mixle.utils.optional_deps import imported, require
from mixle.utils.processes import threads_named
from mixle.utils.redact import display_path

__all__ = [
    "ByPathStore",
    "Version",
    "check_zip_holds_zarr",
    "zip_store_folder",
    "is_icechunk_repository",
    "open_by_path",
    "open_icechunk_session",
    "parse_version",
    "release_store",
    "version_text",
]

#: Which icechunk version a source reads: ``{"branch", "tag", "snapshot"}``, one of the first
#: two (or none) as asked, ``"snapshot"`` the id of the snapshot opened (pinned at first open).
Version = dict[str, str | None]

#: zarr metadata documents whose presence makes a folder (or zip member prefix) a zarr node.
_ZARR_NODE_FILES = ("zarr.json", ".zarray", ".zgroup")
#: Keys of an N5 dataset's ``attributes.json``.
_N5_DATASET_KEYS = frozenset({"dimensions", "blockSize", "dataType"})
_HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"
_NPY_MAGIC = b"\x93NUMPY"
_TIFF_MAGICS = (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+")
_GZIP_MAGIC = b"\x1f\x8b"
#: NIfTI-1 magic at byte 344 (``n+1`` one file, ``ni1`` header and image apart) and NIfTI-2's.
_NIFTI1_MAGICS = (b"n+1\x00", b"ni1\x00")
_NIFTI2_MAGICS = (b"n+2\x00", b"ni2\x00")
#: The pid of the process where mixle first opened an icechunk repository (see
#: :func:`_refuse_forked_icechunk`).
_icechunk_pid: int | None = None
#: Whether this process was forked from one that had imported icechunk (its stores exist).
_forked_with_icechunk = False
#: Whether this process was forked (here or in an ancestor) while icechunk's runtime ran.
_forked_after_icechunk_ran = False
#: Set just before each fork: whether icechunk's runtime runs (or may run) in the forking
#: process; the child takes it over in :func:`_note_fork`.
_runtime_at_fork = False
#: Names (``/proc/self/task/*/comm``, 15 characters at most) of the threads of icechunk's
#: tokio runtime; icechunk starts them on first use (a storage object), not on import.
_RUNTIME_THREAD_PREFIXES = ("tokio-runtime", "icechunk")


def _icechunk_runtime_threads() -> bool | None:
    """Whether a thread of icechunk's tokio runtime runs in this process.

    Returns
    -------
    bool or None
        ``True`` when a thread named like a tokio runtime worker (``tokio-runtime-w``) is
        alive, ``False`` when none is, ``None`` where the threads cannot be listed (no
        ``/proc/self/task``, as on macOS).
    """
    return threads_named(_RUNTIME_THREAD_PREFIXES)


def _before_fork() -> None:
    # Runs in the forking process. icechunk imported but never used starts no runtime and
    # is safe in the child; a runtime that ran (its threads alive) leaves the child an
    # icechunk that blocks for ever on every call. Where threads cannot be listed, an
    # imported icechunk counts as having run: a clear refusal is better than a hang.
    global _runtime_at_fork
    _runtime_at_fork = imported("icechunk") is not None and _icechunk_runtime_threads() is not False


def _note_fork() -> None:
    global _forked_with_icechunk, _forked_after_icechunk_ran
    _forked_with_icechunk = _forked_with_icechunk or imported("icechunk") is not None
    _forked_after_icechunk_ran = _forked_after_icechunk_ran or _runtime_at_fork


os.register_at_fork(before=_before_fork, after_in_child=_note_fork)


@dataclass(frozen=True)
class ByPathStore:
    """The zarr store mixle opened for a path, and the icechunk version it reads."""

    store: Any
    kind: str  # "zip" or "icechunk"
    version: Version | None = None


def parse_version(branch: object, tag: object, snapshot: object) -> Version | None:
    """``branch=``/``tag=``/``snapshot=`` checked: ``None`` when none is given.

    Raises
    ------
    TypeError
        When one is not a ``str``.
    ValueError
        When one is empty, or more than one is given.
    """
    given = {"branch": branch, "tag": tag, "snapshot": snapshot}
    for name, value in given.items():
        if value is None:
            continue
        if not isinstance(value, str):
            raise TypeError(f"{name}={value!r} must be a str (an icechunk {name} name or id)")
        if not value:
            raise ValueError(f"{name}={value!r} must not be empty")
    named = [name for name, value in given.items() if value is not None]
    if len(named) > 1:
        raise ValueError(
            f"{' and '.join(f'{n}={given[n]!r}' for n in named)}: give at most one of "
            "branch=, tag= and snapshot= (an icechunk repository is read at one version)"
        )
    if not named:
        return None
    return {"branch": branch, "tag": tag, "snapshot": snapshot}  # type: ignore[dict-item]


def version_text(version: Version | None) -> str:
    """How a repr names the version: ``branch='main' @ 1E846...``."""
    if not version:
        return ""
    asked = [f"{k}={version[k]!r}" for k in ("branch", "tag") if version.get(k)]
    snapshot = version.get("snapshot")
    if snapshot and asked:
        return f"{asked[0]} @ snapshot {snapshot}"
    return asked[0] if asked else f"snapshot={snapshot!r}"


def open_by_path(path: Any, component: str | None, version: Version | None) -> ByPathStore | None:
    """The store to open for ``path`` when it is a zip file or an icechunk repository.

    Parameters
    ----------
    path
        What ``read_zarr`` was given (a local path, a URL or a store object).
    component
        The path inside the store (checked for zarr metadata inside a zip).
    version
        :func:`parse_version`'s answer: icechunk's branch, tag or pinned snapshot.

    Returns
    -------
    ByPathStore or None
        ``None`` when zarr opens ``path`` as it is (a zarr folder, a URL, a store object
        other than a read-only ``ZipStore``).

    Raises
    ------
    ValueError
        ``branch=``/``tag=``/``snapshot=`` given for something that is not a local icechunk
        repository; a branch, tag or snapshot the repository does not have (the message
        lists its branches and tags).
    UnsupportedStoreError
        A zip file that holds no zarr store (the message lists some of its members), an N5
        container, or an HDF5, TIFF, NIfTI, ``.npy`` or ``.npz`` file: the message names
        the reader to use.
    ImportError
        An icechunk repository where icechunk is not installed.
    RuntimeError
        An icechunk repository in a process forked after mixle used icechunk in its parent.
    """
    if type(path).__module__.split(".")[0] == "icechunk" and _forked_with_icechunk:
        _refuse_forked_icechunk(display_path(path), inherited=True)  # it would hang
    zarr = imported("zarr")
    if zarr is not None and isinstance(path, zarr.storage.ZipStore) and path.read_only:
        # its own handle, not the caller's: a forked child must not share the file offset
        return ByPathStore(_zip_store(os.fspath(path.path), component), "zip")
    local = _local_path(path)
    if local is None:
        if version is not None:
            raise ValueError(_not_icechunk(version, path, "is not a local icechunk repository"))
        return None
    if not os.path.exists(local):
        return None  # read_zarr says no such file
    if os.path.isdir(local):
        if is_icechunk_repository(local):
            return _icechunk_store(local, version or {"branch": "main"})
        if version is not None:
            raise ValueError(_not_icechunk(version, path, "is a folder but no icechunk repository"))
        _refuse_n5(local, component)
        return None
    if version is not None:
        raise ValueError(_not_icechunk(version, path, "is a file, not an icechunk repository"))
    require_regular_file(local, "path")  # a FIFO or a device: refused before it is opened
    with open_regular_file(local, "path") as fh:
        head = fh.read(512)
    if zipfile.is_zipfile(local):
        return ByPathStore(_zip_store(local, component), "zip")
    if local.lower().endswith(".zip"):
        raise UnsupportedStoreError(f"path={display_path(local)!r} is not a zip file")
    _refuse_other_format(local, head)
    return None


def release_store(store: Any) -> None:
    """Close a store :func:`open_by_path` opened (a zip file's descriptor)."""
    zarr = imported("zarr")
    zipped = zarr is not None and isinstance(store, zarr.storage.ZipStore)
    if zipped and getattr(store, "_is_open", False):
        store.close()


def is_icechunk_repository(folder: str) -> bool:
    """Whether ``folder`` has an icechunk repository's layout (``snapshots/`` and ``refs/``).

    icechunk 1 writes ``refs/``, ``snapshots/``, ``manifests/``, ``transactions/`` (and
    ``chunks/``, ``config.yaml``); a later format keeps a ``repo`` file beside
    ``snapshots/``. A zarr store has ``zarr.json``, ``.zarray`` or ``.zgroup`` at its root.
    """
    if any(os.path.lexists(os.path.join(folder, name)) for name in _ZARR_NODE_FILES):
        return False
    if not os.path.isdir(os.path.join(folder, "snapshots")):
        return False
    return os.path.isdir(os.path.join(folder, "refs")) or os.path.isfile(
        os.path.join(folder, "repo")
    )


# -- zip files -----------------------------------------------------------------------------
def _zip_store(path: str, component: str | None) -> Any:
    """zarr's ``ZipStore`` over ``path``, read-only, once it is known to hold a zarr node."""
    zarr = require("zarr", "zarr", feature="read_zarr on a zip file")
    shown = display_path(path)
    store = zarr.storage.ZipStore(path, mode="r")
    try:
        names = zip_file_of(store).namelist()  # parsed now: a damaged zip fails here
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        raise UnsupportedStoreError(
            f"path={shown!r} is a damaged zip file ({type(exc).__name__}: {exc})"
        ) from None
    try:
        check_zip_holds_zarr(names, shown, component, zip_file_of(store))
    except BaseException:
        store.close()
        raise
    return store


def check_zip_holds_zarr(
    names: list[str],
    shown: str,
    component: str | None,
    zf: zipfile.ZipFile | None = None,
    for_inspect: bool = False,
) -> None:
    """Refuse a zip file with no zarr metadata at its root (or at ``component``).

    Parameters
    ----------
    names
        The zip's member names.
    shown
        How messages name the zip file.
    component
        The path inside the store that will be opened, if any.
    zf
        The open zip, to tell arrays from groups (their ``zarr.json``) when the store was
        zipped with its folder, so the message names whole ``component=`` values.
    for_inspect
        Word the message for ``mixle inspect`` (which takes no ``component=``).

    Raises
    ------
    UnsupportedStoreError
        Naming ``read_npz`` for a ``.npz`` archive, the exact ``component=`` to pass when
        the store was zipped with its folder, and some of the zip's members.
    """
    members = set(names)
    prefixes = [""] + ([f"{component.strip('/')}/"] if component else [])
    if any(f"{p}{m}" in members for p in prefixes for m in _ZARR_NODE_FILES):
        return
    if names and all(n.endswith(".npy") for n in names if not n.endswith("/")):
        raise UnsupportedStoreError(
            f"path={shown!r} is a NumPy .npz archive, not a zipped zarr store; use "
            f"mixle.read_npz({shown!r}, name) (its {listing(sorted(names), 'members')})"
        )
    nested = sorted(
        (n.count("/"), n.rsplit("/", 1)[0])
        for n in names
        if "/" in n and n.rsplit("/", 1)[1] in _ZARR_NODE_FILES
    )
    hint = ""
    if nested:
        top = nested[0][1]
        where = f"its zarr store sits in folder {top!r} inside the zip"
        if for_inspect:
            tops = sorted({n.split("/", 1)[0] for n in names if not _is_zip_litter(n)})
            hint = (
                f"; {where}, and mixle inspect reads a store at the zip's root or in the one "
                f"top folder all members sit in ({listing(tops, 'top-level entries')}): "
                f"read it with mixle.read_zarr({shown!r}, component={top + '/<array>'!r}), "
                "or zip the store's contents rather than its folder"
            )
        else:
            hint = f"; {where}: " + _component_hint(names, top, component, zf)
    raise UnsupportedStoreError(
        f"path={shown!r} is a zip file but not a zipped zarr store: no zarr.json, .zarray or "
        f".zgroup at its root{hint} (its {listing(sorted(names), 'members')})"
    )


def zip_store_folder(names: list[str]) -> str | None:
    """The one folder a zip's members all sit in when it holds the zarr store's root.

    A store zipped with its folder (``zip -r x.zip x.zarr``) has every member under
    ``x.zarr/`` and its root metadata at ``x.zarr/zarr.json`` (or ``.zgroup``/``.zarray``);
    macOS's ``__MACOSX/`` entries are ignored. ``None`` for any other zip.
    """
    kept = [n for n in names if not _is_zip_litter(n)]
    tops = {n.split("/", 1)[0] for n in kept}
    if len(tops) != 1 or not all("/" in n for n in kept):
        return None
    (top,) = tops
    members = set(kept)
    return top if any(f"{top}/{m}" in members for m in _ZARR_NODE_FILES) else None


def _is_zip_litter(name: str) -> bool:
    return name.startswith("__MACOSX/") or name == "__MACOSX"


#: How many ``zarr.json`` members of a store zipped with its folder a message reads (to
#: tell arrays from groups) before it lists folders instead.
_HINT_METADATA_READS = 64


def _component_hint(
    names: list[str], top: str, component: str | None, zf: zipfile.ZipFile | None
) -> str:
    """``pass component='top/...'``: the exact value to pass for a store zipped in ``top``."""
    tail = "or zip the store's contents rather than its folder"
    if component:
        inside = f"{top}/{component.strip('/')}"
        if any(f"{inside}/{m}" in set(names) for m in _ZARR_NODE_FILES):
            return f"pass component={inside!r}, {tail}"
    arrays = [
        n.rsplit("/", 1)[0] for n in names if n.startswith(f"{top}/") and n.endswith("/.zarray")
    ]
    v3 = sorted(n for n in names if n.startswith(f"{top}/") and n.endswith("/zarr.json"))
    if zf is not None:  # a zarr.json says whether its folder is an array; read a few
        reads = v3[:_HINT_METADATA_READS]
        arrays += [n.rsplit("/", 1)[0] for n in reads if _is_v3_array(zf, n)]
    if len(set(arrays)) == 1:
        return f"pass component={arrays[0]!r}, {tail}"
    if arrays:
        return f"pass component= one of {listing(sorted(set(arrays)), 'its arrays')}, {tail}"
    return f"pass component={top!r} followed by the array's path below it, {tail}"


def _is_v3_array(zf: zipfile.ZipFile, key: str) -> bool:
    """Whether the ``zarr.json`` member ``key`` says ``"node_type": "array"`` (small ones only)."""
    try:
        if zf.getinfo(key).file_size > ZARR_METADATA_LIMIT:
            return False
        with zf.open(key) as member:
            doc = json.loads(member.read(ZARR_METADATA_LIMIT + 1))
    except (OSError, ValueError, zipfile.BadZipFile, RecursionError, KeyError):
        return False
    return isinstance(doc, dict) and doc.get("node_type") == "array"


# -- icechunk ------------------------------------------------------------------------------
def _icechunk_store(folder: str, version: Version) -> ByPathStore:
    """A read-only session's store at ``version`` of the icechunk repository ``folder``."""
    _repo, session = open_icechunk_session(folder, version)
    branch, tag = version.get("branch"), version.get("tag")
    pinned: Version = {"branch": branch, "tag": tag, "snapshot": str(session.snapshot_id)}
    return ByPathStore(session.store, "icechunk", pinned)


def open_icechunk_session(folder: str, version: Version) -> tuple[Any, Any]:
    """``(repository, read-only session)`` of the icechunk repository ``folder`` at ``version``.

    Parameters
    ----------
    folder
        A local folder with an icechunk repository's layout (:func:`is_icechunk_repository`).
    version
        ``{"snapshot": id}``, ``{"tag": name}`` or ``{"branch": name}`` (checked in that
        order; :func:`parse_version`).

    Raises
    ------
    ValueError
        The branch, tag or snapshot does not exist (the message lists branches and tags).
    ImportError
        icechunk is not installed (names ``pip install -e ".[icechunk]"``).
    RuntimeError
        In a process forked after mixle used icechunk in its parent.
    """
    global _icechunk_pid
    icechunk = require("icechunk", "icechunk", feature="read_zarr on an icechunk repository")
    shown = display_path(folder)
    _refuse_forked_icechunk(shown)
    _icechunk_pid = os.getpid()
    repo = icechunk.Repository.open(icechunk.local_filesystem_storage(os.path.abspath(folder)))
    snapshot, branch, tag = version.get("snapshot"), version.get("branch"), version.get("tag")
    try:
        if snapshot:
            session = repo.readonly_session(snapshot_id=snapshot)
        elif tag:
            session = repo.readonly_session(tag=tag)
        else:
            session = repo.readonly_session(branch=branch)
    except icechunk.IcechunkError as exc:
        asked = f"snapshot={snapshot!r}" if snapshot else f"tag={tag!r}" if tag else None
        asked = asked or f"branch={branch!r}"
        branches = sorted(repo.list_branches())
        tags = sorted(repo.list_tags())
        reason = str(exc).strip().splitlines()[-1].strip().removeprefix("`->").strip()
        raise ValueError(
            f"{asked} cannot be opened in icechunk repository {shown!r} ({reason}); "
            f"{listing(branches, 'branches')}; {listing(tags, 'tags')}"
        ) from None
    return repo, session


def _refuse_forked_icechunk(shown: str, inherited: bool = False) -> None:
    """Refuse icechunk in a child forked after icechunk ran in this process's parent.

    icechunk runs on a tokio runtime whose threads do not survive ``fork``: any icechunk
    call in such a child blocks for ever (opening a new repository too), so it is refused.
    Known to have run: mixle opened a repository there, the parent's icechunk runtime
    threads were alive at the fork (however the parent used icechunk, see
    :func:`_before_fork`), or (``inherited``) the store object given was made there.
    """
    forked_after_mixle = _icechunk_pid is not None and _icechunk_pid != os.getpid()
    if inherited or forked_after_mixle or _forked_after_icechunk_ran:
        raise RuntimeError(
            f"icechunk repository {shown!r} cannot be opened in a process forked after the "
            "parent used icechunk: icechunk's runtime does not survive fork and would hang; "
            "start workers with 'spawn' or 'forkserver' (Loader(worker_start_method='spawn'), "
            "the default) and pass the source pickled"
        )


def _not_icechunk(version: Version, path: Any, what: str) -> str:
    asked = ", ".join(f"{k}={v!r}" for k, v in version.items() if v is not None)
    return (
        f"{asked} only applies to a local icechunk repository folder; "
        f"path={display_path(path)!r} {what}"
    )


# -- other formats ------------------------------------------------------------------------
def _refuse_n5(folder: str, component: str | None) -> None:
    """Refuse an N5 container, naming ``mixle.read_n5``.

    It is one when no zarr metadata lies on the way to ``component`` and ``attributes.json``
    holds ``"n5"`` or a dataset's keys (at the root or at ``component``), or the folder is
    named ``*.n5``.
    """
    parts = [p for p in (component or "").split("/") if p]
    for depth in range(len(parts) + 1):
        here = os.path.join(folder, *parts[:depth])
        if any(os.path.lexists(os.path.join(here, name)) for name in _ZARR_NODE_FILES):
            return  # zarr metadata on the way: zarr's store (N5 attributes beside it or not)
    attributes = _small_json(os.path.join(folder, "attributes.json"))
    inner = _small_json(os.path.join(folder, *parts, "attributes.json")) if parts else None
    is_n5 = isinstance(attributes, dict) and (
        "n5" in attributes or attributes.keys() >= _N5_DATASET_KEYS
    )
    is_n5 = is_n5 or os.path.basename(os.path.normpath(folder)).lower().endswith(".n5")
    if not is_n5 and not (isinstance(inner, dict) and inner.keys() >= _N5_DATASET_KEYS):
        return
    shown = display_path(folder)
    dataset = "/".join(parts) if parts else "..."
    raise UnsupportedStoreError(
        f"path={shown!r} is an N5 container, not a zarr store; use "
        f"mixle.read_n5({shown!r}, dataset={dataset!r})"
    )


def _small_json(path: str) -> Any:
    """The JSON document in the regular file ``path`` if it is small and valid, else ``None``."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    if not stat.S_ISREG(info.st_mode) or info.st_size > ZARR_METADATA_LIMIT:
        return None
    try:
        with open_regular_file(path, "attributes.json") as fh:
            return json.loads(fh.read(ZARR_METADATA_LIMIT + 1).decode("utf-8"))
    except (OSError, ValueError, RecursionError):
        return None


def _refuse_other_format(path: str, head: bytes) -> None:
    """Refuse a file whose first bytes say which other mixle reader opens it."""
    shown = display_path(path)
    lower = path.lower()
    found = None
    if head.startswith(_HDF5_MAGIC):
        found = ("an HDF5 file", f"mixle.read_hdf5({shown!r}, dataset=...)")
    elif head[:4] in _TIFF_MAGICS:
        found = ("a TIFF file", f"mixle.read_tiff({shown!r})")
    elif head.startswith(_NPY_MAGIC):
        found = ("a .npy file", f"mixle.read_npy({shown!r})")
    elif head[344:348] in _NIFTI1_MAGICS or head[4:8] in _NIFTI2_MAGICS:
        found = ("a NIfTI file", f"mixle.read_nifti({shown!r})")
    elif head.startswith(_GZIP_MAGIC) and lower.endswith((".nii.gz", ".hdr.gz")):
        found = ("a gzipped NIfTI file", f"mixle.read_nifti({shown!r})")
    if found is not None:
        raise UnsupportedStoreError(
            f"path={shown!r} is {found[0]}, not a zarr store; use {found[1]}"
        )


def _local_path(path: Any) -> str | None:
    """``path`` as a local path (``file://`` stripped), or ``None`` for URLs and stores."""
    if isinstance(path, os.PathLike):
        path = os.fspath(path)
    if not isinstance(path, str):
        return None
    if path.startswith("file://"):
        return path[len("file://") :]
    return None if "://" in path or "::" in path else path
