"""``.npz`` files: a group of ``.npy`` members, each described from its zip entry and header."""

from __future__ import annotations

import os
import zipfile
from typing import Any

from mixle.data.sources.arrays.npz.members import (
    NpzMember,
    list_members,
    member_data_start,
    readable_members,
    zip_entry,
)
from mixle.inspection.findings import with_findings
from mixle.inspection.formatting import format_bytes
from mixle.inspection.locations import is_remote
from mixle.inspection.npy_files import _npy_header, npy_report
from mixle.inspection.report import (
    ArrayReport,
    GroupReport,
    LayoutFinding,
    UnsupportedStoreError,
)
from mixle.utils.files import open_regular_file, require_regular_file
from mixle.utils.redact import display_path

__all__ = ["ZIP_MAGICS", "inspect_npz", "is_npz"]

#: How a zip archive starts: a local file header, or the end record of an empty archive.
ZIP_MAGICS = (b"PK\x03\x04", b"PK\x05\x06")


def is_npz(location: str) -> bool:
    """Whether ``location`` is a local zip archive holding at least one ``.npy`` member.

    Reads the first bytes and the zip's central directory, never a member.
    """
    if is_remote(location):
        return False
    try:
        require_regular_file(location, "path")
        with open_regular_file(location, "path") as fh:
            head = fh.read(4)
        if not head.startswith(ZIP_MAGICS):
            return False
        members = list_members(location)
    except (OSError, ValueError):
        return False
    return any(m.name.endswith(".npy") for m in members) or location.endswith(".npz")


def inspect_npz(
    location: str, storage_options: dict[str, Any] | None, patch: tuple[int, ...] | None
) -> GroupReport:
    """The ``.npz`` file at ``location`` (a local path) as a group of its arrays.

    Raises
    ------
    UnsupportedStoreError
        For a URL, or a file that is not a zip archive.
    """
    shown = display_path(location)
    if is_remote(location):
        raise UnsupportedStoreError(f"{shown!r}: mixle inspects local .npz files only")
    require_regular_file(location, "path")
    try:
        members = list_members(location)
    except ValueError as exc:
        raise UnsupportedStoreError(str(exc)) from None
    members = readable_members(members)  # of entries sharing a name, np.load's: the last
    names = {m.name for m in members}
    children = []
    findings: list[LayoutFinding] = []
    with open_regular_file(location, "path") as fh, zipfile.ZipFile(fh) as zf:
        size = os.fstat(fh.fileno()).st_size
        for member in members:
            if not member.name.endswith(".npy"):
                findings.append(
                    LayoutFinding(
                        "members-unlisted",
                        "info",
                        f"member {member.name!r} is not a .npy array: not shown",
                    )
                )
                continue
            # np.load(path)["x"] reads a member named exactly "x" before "x.npy"
            shown = member.name if member.shown in names else member.shown
            children.append(_member_report(fh, zf, member, shown, location, size, patch))
    children.sort(key=lambda r: r.path)
    return GroupReport(
        path="/", format="npz", attributes=0, children=tuple(children), findings=tuple(findings)
    )


def _member_report(
    fh: Any,
    zf: zipfile.ZipFile,
    member: NpzMember,
    shown: str,
    location: str,
    size: int,
    patch: tuple[int, ...] | None,
) -> ArrayReport:
    """One member's report (named ``shown``): from its ``.npy`` header, else the zip entry."""
    what = f"{display_path(location)}::{shown}"
    try:
        start = member_data_start(fh, member, location, size)
    except ValueError as exc:
        raise UnsupportedStoreError(str(exc)) from None
    compressed = member.compress_type != zipfile.ZIP_STORED
    notes: list[LayoutFinding] = []
    if compressed:
        with zf.open(zip_entry(zf, member)) as raw:
            header = _npy_header(raw, what)  # reads the header's few bytes only
        notes.append(
            LayoutFinding(
                "compressed-member",
                "warning",
                f"stored compressed ({member.method}, {format_bytes(member.compress_size)} "
                f"for {format_bytes(member.file_size)}): it cannot be memory-mapped; "
                "read_npz(..., decompress=True) decompresses it once into mixle's cache, or "
                "re-save the file with np.savez (uncompressed) to map it in place",
            )
        )
    else:
        fh.seek(start)
        header = _npy_header(fh, what)
    report, found = npy_report(
        header,
        member.file_size - header[3],
        holder="the member",
        path="/" + shown,
        format="npz",
        stored=member.compress_size,
        codecs=(member.method,) if compressed else (),
    )
    notes.extend(found)
    return with_findings(report, patch, False, notes)
