"""icechunk repositories (local folders): the zarr report of one version, and which it is.

The repository is opened through a read-only session (nothing is written); the report is
:mod:`~mixle.inspection.zarr_stores`'s for the zarr tree at that version, stored sizes
from icechunk's manifests (chunk data is never read). The root gets an ``"icechunk"``
finding naming the branch or tag, the snapshot, its commit message and date, the branches
and tags, and the ``read_zarr`` call that reads the same version.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import os
from typing import Any

from mixle.data.sources.arrays.base import listing
from mixle.data.sources.arrays.zarr.by_path import (
    is_icechunk_repository,
    open_icechunk_session,
    parse_version,
)
from mixle.inspection.locations import is_remote
from mixle.inspection.report import ArrayReport, GroupReport, LayoutFinding, UnsupportedStoreError
from mixle.inspection.zarr_stores import _zarr_node
from mixle.utils.redact import display_path

__all__ = ["MAX_COUNTED_COMMITS", "inspect_icechunk", "is_icechunk"]

#: Commits counted back from the snapshot inspected (a long history is not walked further).
MAX_COUNTED_COMMITS = 10_000


def is_icechunk(location: str) -> bool:
    """Whether ``location`` is a local folder laid out as an icechunk repository."""
    return not is_remote(location) and os.path.isdir(location) and is_icechunk_repository(location)


def inspect_icechunk(
    location: str,
    storage_options: dict[str, Any] | None,
    patch: tuple[int, ...] | None,
    *,
    branch: str | None = None,
    tag: str | None = None,
    snapshot: str | None = None,
) -> GroupReport | ArrayReport:
    """The root node of the icechunk repository at ``location``, at one version.

    Parameters
    ----------
    location
        A local icechunk repository folder.
    storage_options
        Must be ``None`` (local repositories only).
    patch
        As for :func:`~mixle.inspection.inspect_store`.
    branch, tag, snapshot
        The version (at most one; default: the head of branch ``"main"``).

    Raises
    ------
    UnsupportedStoreError
        ``location`` is not an icechunk repository, or zarr cannot open its tree.
    ValueError
        The branch, tag or snapshot does not exist (the message lists branches and tags).
    ImportError
        icechunk is not installed (``pip install -e ".[icechunk]"``).
    """
    from mixle.utils.optional_deps import require

    zarr = require("zarr", "zarr", feature="mixle inspect")
    if storage_options:
        raise ValueError("storage_options only apply to URLs; icechunk repositories are local")
    shown = display_path(location)
    if not is_icechunk(location):
        raise UnsupportedStoreError(
            f"{shown!r} is not an icechunk repository (no snapshots/ and refs/ folders)"
        )
    version = parse_version(branch, tag, snapshot) or {"branch": "main"}
    repo, session = open_icechunk_session(location, version)
    try:
        node = zarr.open(store=_sized_store_type()(session.store), mode="r")
    except (FileNotFoundError, ValueError, TypeError, AttributeError) as exc:
        raise UnsupportedStoreError(
            f"icechunk repository {shown!r} holds no zarr tree zarr can open at "
            f"{_asked(version)}: {type(exc).__name__}: {exc}"
        ) from None
    root = _zarr_node(zarr, node, "/", patch, False, shown, None, False)
    finding = _version_finding(repo, session, version, shown)
    return dataclasses.replace(root, findings=(finding, *root.findings))


@functools.cache
def _sized_store_type() -> type:
    """A wrapper of icechunk's store whose ``getsize`` raises for a chunk never written.

    icechunk's ``getsize`` answers ``0`` for a key it does not hold (zarr's stores raise
    ``FileNotFoundError``), which would count every chunk of the grid as stored.
    """
    from zarr.storage import WrapperStore

    class IcechunkSizes(WrapperStore):  # type: ignore[type-arg,misc]
        async def getsize(self, key: str) -> int:
            if not await self._store.exists(key):
                raise FileNotFoundError(key)
            return int(await self._store.getsize(key))

    return IcechunkSizes


def _asked(version: dict[str, Any]) -> str:
    return next(f"{k}={v!r}" for k, v in version.items() if v is not None)


def _version_finding(repo: Any, session: Any, version: dict[str, Any], shown: str) -> LayoutFinding:
    """Which version the report shows, and how to read that same version."""
    snapshot = str(session.snapshot_id)
    info = repo.lookup_snapshot(snapshot)
    commits = sum(
        1 for _ in itertools.islice(repo.ancestry(snapshot_id=snapshot), MAX_COUNTED_COMMITS)
    )
    counted = f"{commits:,}" if commits < MAX_COUNTED_COMMITS else f"at least {commits:,}"
    branches = sorted(repo.list_branches())
    tags = sorted(repo.list_tags())
    message = (info.message or "").strip().splitlines()
    asked = _asked(version)
    return LayoutFinding(
        "icechunk",
        "info",
        f"icechunk repository at {asked}: snapshot {snapshot}, written "
        f"{info.written_at:%Y-%m-%d %H:%M:%S %Z}"
        + (f" ({message[0][:80]!r})" if message else "")
        + f", {counted} snapshots in its history; {listing(branches, 'branches')}; "
        f"{listing(tags, 'tags')}; read this version with mixle.read_zarr({shown!r}, "
        f"component, snapshot={snapshot!r}), or the head with {asked}",
    )
