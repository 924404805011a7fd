"""``mixle inspect``: the arrays in a zarr store, HDF5 file or ``.npy`` file, as a tree."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import shutil
import sys
import textwrap
import warnings
from collections.abc import Sequence
from typing import Any, TextIO

from mixle.inspection import (
    ArrayReport,
    GroupReport,
    StoreReport,
    format_bytes,
    inspect_store,
    parse_patch,
)
from mixle.inspection.formatting import count_text, fill_text, shape_text, times_text
from mixle.reading.policy import DEFAULT_BATCH_DEADLINE, DEFAULT_REQUEST_TIMEOUT, set_retry_policy
from mixle.utils.redact import redact_text

__all__ = ["parse_storage_option", "register", "render_report"]

_UNICODE = {"branch": "├── ", "last": "└── ", "pipe": "│   ", "blank": "    ", "then": " → "}
_ASCII = {"branch": "|-- ", "last": "`-- ", "pipe": "|   ", "blank": "    ", "then": " -> "}
#: Width of the label column of an array block.
_LABEL = 13


def render_report(report: StoreReport, *, width: int | None = None, ascii: bool = False) -> str:
    """The report as an indented tree, one block per array with its findings under it.

    Parameters
    ----------
    report
        What :func:`~mixle.inspection.inspect_store` returned.
    width
        Wrap long lines to this many columns (``None``: never wrap).
    ascii
        Draw the tree with ASCII characters only.
    """
    marks = _ASCII if ascii else _UNICODE
    lines: list[str] = []
    root = report.root
    title = f"{report.location}  {_title(root)}"
    lines.append(title)
    if isinstance(root, ArrayReport):
        lines.extend(_array_lines(root, "  ", marks, width))
    else:
        lines.extend(_finding_lines(root.findings, "  ", width))
        _children(root, "", marks, width, lines)
    return "\n".join(lines)


def _title(node: GroupReport | ArrayReport) -> str:
    if isinstance(node, GroupReport):
        return f"{node.format} group, {count_text(node.attributes, 'attribute')}"
    return f"{node.format} array {shape_text(node.shape)} {node.dtype}"


def _children(
    group: GroupReport, indent: str, marks: dict[str, str], width: int | None, lines: list[str]
) -> None:
    for k, child in enumerate(group.children):
        last = k == len(group.children) - 1
        lines.append(f"{indent}{marks['last' if last else 'branch']}{child.name}  {_title(child)}")
        inner = indent + marks["blank" if last else "pipe"]
        if isinstance(child, ArrayReport):
            lines.extend(_array_lines(child, inner + "  ", marks, width))
        else:
            lines.extend(_finding_lines(child.findings, inner + "  ", width))
            _children(child, inner, marks, width, lines)


def _array_lines(
    a: ArrayReport, indent: str, marks: dict[str, str], width: int | None
) -> list[str]:
    rows: list[tuple[str, str]] = []
    if a.shards is not None:
        rows.append(
            ("shards", f"{shape_text(a.shards)}; {_stored_of(a.shards_stored, a.shards_in_grid)}")
        )
    if a.chunks is None and a.layout == "virtual":
        rows.append(("chunks", "none here (virtual: read from its source datasets)"))
    elif a.chunks is None:
        rows.append(("chunks", f"none ({a.layout}, read without decoding)"))
    else:
        size = "" if a.chunk_nbytes is None else f" = {format_bytes(a.chunk_nbytes)} decoded"
        unit = "inner chunks" if a.shards is not None else "chunks"
        missing = f", {a.chunks_missing} missing" if a.chunks_missing else ""
        grid = f"{_stored_of(a.chunks_stored, a.chunks_in_grid)}{missing}"
        rows.append(
            (unit if a.shards is not None else "chunks", f"{shape_text(a.chunks)}{size}; {grid}")
        )
    raw = "those of its sources" if a.layout == "virtual" else "none (raw bytes)"
    rows.append(("codecs", marks["then"].join(a.codecs) if a.codecs else raw))
    if a.inner_codecs:
        rows.append(("inner", marks["then"].join(a.inner_codecs)))
    fill = fill_text(a.fill_value, a.dtype)
    rows.append(("fill", f"{fill}; order {a.order}; {count_text(a.attributes, 'attribute')}"))
    whole = "variable size" if a.nbytes is None else f"{format_bytes(a.nbytes)} decoded"
    rows.append(("stored", f"{_stored_text(a)}; whole array {whole}"))
    cost = a.patch_cost
    if cost is not None:
        edge = "x".join(map(str, cost.patch))
        if cost.chunks_touched is None:
            text = f"reads its {format_bytes(cost.patch_bytes)} directly, nothing to decode"
        else:
            touched = cost.shards_touched
            shards = "" if touched is None else f"{count_text(touched, 'shard')}, "
            text = (
                f"touches {count_text(cost.chunks_touched, 'chunk')}, {shards}decodes "
                f"{format_bytes(cost.decoded_bytes)} per {format_bytes(cost.patch_bytes)} patch "
                f"(read amplification {cost.read_amplification:.3g}x)"
            )
        rows.append(("patch", f"{edge}: {text}"))
    lines = []
    for label, text in rows:
        lines.extend(_wrapped(f"{label:<{_LABEL}}", text, indent, width))
    lines.extend(_finding_lines(a.findings, indent, width))
    return lines


def _stored_text(a: ArrayReport) -> str:
    """Stored bytes, the data they hold, and the compression ratio (data bytes / stored)."""
    if a.virtual_sources:
        return f"nothing here (virtual: {count_text(len(a.virtual_sources), 'source dataset')})"
    if a.stored_bytes is None:
        return "unknown"
    text = format_bytes(a.stored_bytes)
    if a.data_bytes is not None:
        text += f" for {format_bytes(a.data_bytes)} of data"
    if a.decoded_bytes is not None and a.decoded_bytes != a.data_bytes:
        text += f" ({format_bytes(a.decoded_bytes)} decoded with the edge chunks' padding)"
    ratio = a.compression_ratio
    if ratio is not None:
        text += f" (ratio {times_text(ratio)} = data / stored)"
    return text


def _finding_lines(findings: Sequence[Any], indent: str, width: int | None) -> list[str]:
    lines: list[str] = []
    for f in findings:
        lines.extend(_wrapped(f"{f.severity:<{_LABEL}}", f.message, indent, width))
    return lines


def _wrapped(label: str, text: str, indent: str, width: int | None) -> list[str]:
    first = f"{indent}{label}"
    if width is None:
        return [first + text]
    rest = indent + " " * len(label)
    return textwrap.wrap(
        text,
        width=max(width, len(first) + 20),
        initial_indent=first,
        subsequent_indent=rest,
        break_on_hyphens=False,
        break_long_words=False,
    ) or [first]


def _stored_of(stored: int | None, grid: int | None) -> str:
    if grid is None:
        return "not counted"
    return f"{grid} in the grid, {'?' if stored is None else stored} stored"


# -- the command ---------------------------------------------------------------------------
def parse_storage_option(text: str) -> tuple[str, Any]:
    """``"KEY=VALUE"`` as ``(key, value)``; the value is read as JSON when it parses as JSON.

    Raises
    ------
    ValueError
        When ``text`` has no ``=`` or an empty key.
    """
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"--storage-option {text!r} must look like KEY=VALUE (e.g. anon=true)")
    try:
        value: Any = json.loads(raw)
    except ValueError:
        value = raw
    return key.strip(), value


def _patch_arg(text: str) -> tuple[int, ...]:
    try:
        edges = parse_patch([int(p) for p in text.replace("x", ",").split(",")], "--patch")
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a patch size: give N or N,N,... with every N >= 1"
        ) from None
    assert edges is not None
    return edges


def _seconds_arg(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not (seconds > 0 and math.isfinite(seconds)):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds > 0, such as 30")
    return seconds


def _storage_option_arg(text: str) -> tuple[str, Any]:
    try:
        return parse_storage_option(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``mixle inspect`` to the command line."""
    cmd = sub.add_parser(
        "inspect",
        help="show the arrays in a zarr store, HDF5 file or .npy file, and chunking advice",
        description=(
            "Show the tree of arrays in a zarr store (v2, v3, sharded), an HDF5 file or a .npy "
            "file: shape, dtype, chunks, shards, codecs, fill value, stored bytes and "
            "compression ratio, with warnings when the chunking suits patch reads badly. "
            "Reads metadata and object sizes only, never chunk data; opens read-only."
        ),
    )
    cmd.add_argument("path", metavar="PATH_OR_URL", help="local path, file://, http(s)://, s3://")
    cmd.add_argument(
        "--storage-option",
        dest="storage_options",
        metavar="KEY=VALUE",
        action="append",
        type=_storage_option_arg,
        default=[],
        help="fsspec option for URLs (repeatable; VALUE is read as JSON when it is JSON)",
    )
    cmd.add_argument(
        "--patch",
        metavar="N[,N,...]",
        type=_patch_arg,
        help="cost a random patch of this size: chunks touched, bytes decoded per patch byte",
    )
    cmd.add_argument(
        "--timeout",
        metavar="SECONDS",
        type=_seconds_arg,
        help="URLs: give up on a request that waits this long to connect, for its first byte "
        f"or between two bytes, and retry it (default: the retry policy's, "
        f"{DEFAULT_REQUEST_TIMEOUT:g})",
    )
    cmd.add_argument(
        "--deadline",
        metavar="SECONDS",
        type=_seconds_arg,
        help="URLs: give up on the whole inspection after this long, with status 1 "
        f"(default: the retry policy's, {DEFAULT_BATCH_DEADLINE:g})",
    )
    cmd.add_argument("--json", action="store_true", help="print the report as JSON")
    cmd.set_defaults(run=_run)


def _run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    options = dict(args.storage_options) or None
    old = set_retry_policy(timeout=args.timeout, deadline=args.deadline)
    # errors end the command in mixle.cli.main: status 1 and one line naming the path (the
    # warnings of a failed inspection are dropped with it)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("default")
            report = inspect_store(args.path, storage_options=options, patch=args.patch)
    finally:
        set_retry_policy(**dataclasses.asdict(old))
    for found in caught:  # one line each, credentials masked
        text = " ".join(redact_text(str(found.message), options).split())
        print(f"mixle inspect: warning: {text}", file=sys.stderr)
    out: TextIO = sys.stdout
    if args.json:
        print(json.dumps(report.to_dict(), indent=2), file=out)
        return 0
    width = shutil.get_terminal_size().columns if out.isatty() else None
    encoding = getattr(out, "encoding", None) or "ascii"
    try:
        "└→".encode(encoding)
        plain = False
    except (UnicodeEncodeError, LookupError):
        plain = True
    print(render_report(report, width=width, ascii=plain), file=out)
    return 0
