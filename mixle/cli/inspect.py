"""``mixle inspect``: the arrays in a zarr store, HDF5 file or ``.npy`` file, as a tree.

Given a glob (``'scans/*.zarr'``) or a table of volumes with ``--column``, it summarises
the collection instead: count, shapes, dtypes, chunkings, decoded size, and the volumes
that do not fit together.
"""

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
    MAX_LISTED,
    ArrayReport,
    ArraysSummary,
    CollectionReport,
    GroupReport,
    StoreReport,
    UnsupportedStoreError,
    format_bytes,
    inspect_store,
    inspect_volumes,
    is_collection,
    parse_patch,
)
from mixle.inspection.collections import table_columns_hint
from mixle.inspection.formatting import count_text, fill_text, shape_text, times_text
from mixle.reading.policy import DEFAULT_BATCH_DEADLINE, DEFAULT_REQUEST_TIMEOUT, set_retry_policy
from mixle.utils.redact import display_path, redact_text

__all__ = [
    "parse_named_option",
    "parse_storage_option",
    "register",
    "render_collection",
    "render_report",
]

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


def render_collection(report: CollectionReport, *, width: int | None = None) -> str:
    """The summary of a collection of volumes: one block per array name, then the findings.

    Each line lists at most :data:`~mixle.inspection.MAX_LISTED` values (the most common
    first) and says how many more there are.

    Parameters
    ----------
    report
        What :func:`~mixle.inspection.inspect_volumes` returned.
    width
        Wrap long lines to this many columns (``None``: never wrap).
    """
    head = f"{report.location}  {report.kind} of {count_text(report.count, 'volume')}"
    if report.names is not None:
        head += f", arrays {', '.join(report.names)}"
    if report.columns:
        shown = ", ".join(report.columns[:MAX_LISTED])
        more = (
            f" and {len(report.columns) - MAX_LISTED} more"
            if len(report.columns) > MAX_LISTED
            else ""
        )
        head += f"; {count_text(len(report.columns), 'metadata column')}: {shown}{more}"
    lines = [head]
    for summary in report.summaries:
        indent = "  "
        if summary.name is not None:
            lines.append(f"  {summary.name}")
            indent = "    "
        rows = _summary_rows(summary, report.count, sized=report.names is not None)
        for label, text in rows:
            lines.extend(_wrapped(f"{label:<{_LABEL}}", text, indent, width))
    total = report.nbytes
    read = sum(1 for v in report.volumes if v.ok)
    size = "variable (variable-size dtypes)" if total is None else f"{format_bytes(total)} decoded"
    if report.unreadable:
        size += f" (the {count_text(read, 'array')} read)"
    lines.extend(_wrapped(f"{'total':<{_LABEL}}", size, "  ", width))
    lines.extend(_finding_lines(report.findings, "  ", width))
    return "\n".join(lines)


def _summary_rows(summary: ArraysSummary, count: int, *, sized: bool) -> list[tuple[str, str]]:
    if summary.count == 0:
        return [("shapes", "none read")]

    def ranked(pairs: Sequence[tuple[Any, int]], spell: Any) -> str:
        if len(pairs) == 1:
            value, n = pairs[0]
            every = "every volume" if n == count else count_text(n, "volume")
            return f"{spell(value)} in {every}"
        shown = ", ".join(f"{spell(v)} x{n:,}" for v, n in pairs[:MAX_LISTED])
        more = f", and {len(pairs) - MAX_LISTED} more" if len(pairs) > MAX_LISTED else ""
        return f"{len(pairs)} distinct: {shown}{more}"

    shapes = ranked(summary.shapes, shape_text)
    if len(summary.shapes) > 1 and summary.min_shape and summary.max_shape:
        lo, hi = shape_text(summary.min_shape), shape_text(summary.max_shape)
        shapes = f"{lo} to {hi} per axis; {shapes}"
    chunks = ranked(summary.chunks, lambda c: "none (contiguous)" if c is None else shape_text(c))
    rows = [("shapes", shapes), ("dtypes", ranked(summary.dtypes, str)), ("chunks", chunks)]
    if sized:
        size = "variable" if summary.nbytes is None else f"{format_bytes(summary.nbytes)} decoded"
        rows.append(("size", size))
    return rows


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


def parse_named_option(values: Sequence[str], option: str) -> str | dict[str, str] | None:
    """Repeated ``--column``/``--dataset`` values as one value or ``{name: value}``.

    ``["image_path"]`` gives ``"image_path"``; ``["image=image_path", "label=label_path"]``
    gives ``{"image": "image_path", "label": "label_path"}`` (a bare value among named ones
    is named after itself).

    Raises
    ------
    ValueError
        An empty name or value, or a name given twice.
    """
    if not values:
        return None
    if len(values) == 1 and "=" not in values[0]:
        if not values[0]:
            raise ValueError(f"{option} needs a value, got ''")
        return values[0]
    named: dict[str, str] = {}
    for text in values:
        name, sep, value = text.partition("=")
        if not sep:
            name = value = text
        name, value = name.strip(), value.strip()
        if not name or not value:
            raise ValueError(f"{option} {text!r} must look like NAME=VALUE or VALUE")
        if name in named:
            raise ValueError(f"{option} names {name!r} twice ({named[name]!r} and {value!r})")
        named[name] = value
    return named


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
        help="show the arrays in a zarr store, HDF5 file or .npy file (or a collection of "
        "volumes), and chunking advice",
        description=(
            "Show the tree of arrays in a zarr store (v2, v3, sharded), an HDF5 file or a .npy "
            "file: shape, dtype, chunks, shards, codecs, fill value, stored bytes and "
            "compression ratio, with warnings when the chunking suits patch reads badly. "
            "Given a glob ('scans/*.zarr') or a table of volumes with --column, summarise the "
            "collection: count, shapes, dtypes, chunkings, decoded size, and warnings for "
            "volumes that do not fit together. "
            "Reads metadata and object sizes only, never chunk data; opens read-only."
        ),
    )
    cmd.add_argument(
        "path",
        metavar="PATH_OR_URL",
        help="local path, file://, http(s)://, s3://; a glob of stores (quote it); a table "
        "(.csv, .tsv, .parquet, .jsonl) with --column",
    )
    cmd.add_argument(
        "--column",
        dest="columns",
        metavar="[NAME=]COLUMN",
        action="append",
        default=[],
        help="read PATH as a table of volumes whose paths are in COLUMN (repeat with NAME= "
        "for aligned arrays per volume: --column image=image_path --column label=label_path)",
    )
    cmd.add_argument(
        "--dataset",
        dest="datasets",
        metavar="[NAME=]DATASET",
        action="append",
        default=[],
        help="collections: the HDF5 dataset inside each file (NAME= for one array name)",
    )
    cmd.add_argument(
        "--component",
        dest="components",
        metavar="[NAME=]ARRAY",
        action="append",
        default=[],
        help="collections: the zarr array inside each group (NAME= for one array name)",
    )
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
    if is_collection(args.path, table=bool(args.columns)):
        return _run_collection(args, parser, options)
    hint = table_columns_hint(args.path)
    if hint is not None:
        raise UnsupportedStoreError(hint)
    if args.datasets or args.components:
        parser.error(
            "--dataset and --component name the array inside each volume of a collection "
            f"(a glob or a table with --column); {display_path(args.path)!r} is one store: "
            "its tree shows every array"
        )
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
    print(render_report(report, width=width, ascii=_plain(out)), file=out)
    return 0


def _run_collection(
    args: argparse.Namespace, parser: argparse.ArgumentParser, options: dict[str, Any] | None
) -> int:
    if args.patch is not None:
        parser.error(
            "--patch costs patches in one store; inspect one volume of the collection for it"
        )
    try:
        columns = parse_named_option(args.columns, "--column")
        dataset = parse_named_option(args.datasets, "--dataset")
        component = parse_named_option(args.components, "--component")
    except ValueError as exc:
        parser.error(str(exc))
    old = set_retry_policy(timeout=args.timeout, deadline=args.deadline)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("default")
            report = inspect_volumes(
                args.path,
                columns=columns,
                dataset=dataset,
                component=component,
                storage_options=options,
            )
    finally:
        set_retry_policy(**dataclasses.asdict(old))
    for found in caught:
        text = " ".join(redact_text(str(found.message), options).split())
        print(f"mixle inspect: warning: {text}", file=sys.stderr)
    out: TextIO = sys.stdout
    if args.json:
        print(json.dumps(report.to_dict(), indent=2), file=out)
    else:
        width = shutil.get_terminal_size().columns if out.isatty() else None
        print(render_collection(report, width=width), file=out)
    bad = report.unreadable
    if bad:
        out.flush()
        print(
            f"mixle inspect: {report.location}: {count_text(len(bad), 'volume')} of "
            f"{report.count} could not be read (named in the report)",
            file=sys.stderr,
        )
        return 1
    return 0


def _plain(out: TextIO) -> bool:
    """Whether ``out`` cannot encode the tree's box-drawing characters."""
    encoding = getattr(out, "encoding", None) or "ascii"
    try:
        "└→".encode(encoding)
    except (UnicodeEncodeError, LookupError):
        return True
    return False
