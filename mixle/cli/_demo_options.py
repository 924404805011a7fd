"""``mixle demo``'s option checks and where its picture goes."""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from pathlib import Path

from mixle.cli._demo_report import DEFAULT_PNG
from mixle.cli._demo_runs import MIB
from mixle.cli._demo_volume import DTYPE, MIN_SIZE, resolve_backend
from mixle.utils.optional_deps import HAS_MATPLOTLIB

__all__ = ["check_options", "choose_png"]


def check_options(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Check ``mixle demo``'s options; a bad one exits with status 2 naming it and its value.

    Parameters
    ----------
    args
        The parsed options.
    parser
        The ``demo`` parser (its :meth:`~argparse.ArgumentParser.error` exits).
    """
    for option, value, low in (
        ("--size", args.size, MIN_SIZE),
        ("--patch", args.patch, 1),
        ("--batch-size", args.batch_size, 1),
        ("--num-patches", args.num_patches, 1),
        ("--cache-mib", args.cache_mib, 0),
    ):
        if value < low:
            parser.error(f"{option}={value} must be >= {low}")
    if args.patch > args.size:
        parser.error(f"--patch={args.patch} must be at most --size={args.size}")
    try:
        resolve_backend(args.backend)
    except ImportError as err:
        parser.error(f"--backend={args.backend}: {err}")
    tmp = tempfile.gettempdir()
    need = args.size**3 * DTYPE.itemsize
    free = shutil.disk_usage(tmp).free
    if need > free:
        parser.error(
            f"--size={args.size} writes up to {need / MIB:.0f} MiB, but {tmp} has "
            f"{free / MIB:.0f} MiB free; pick a smaller --size or point TMPDIR elsewhere"
        )


def choose_png(
    args: argparse.Namespace, parser: argparse.ArgumentParser
) -> tuple[Path | None, str]:
    """Where the picture goes, and a note to print about the choice.

    ``--png PATH`` is used as given (an existing file is replaced); by default the picture
    goes to :data:`DEFAULT_PNG` in the current directory, or to the first free
    ``mixle-demo-N.png`` when that exists, never replacing a file.

    Returns
    -------
    tuple
        The path (``None``: no picture) and the note (``""``: nothing to say).
    """
    if args.no_png:
        return None, ""
    if args.png is not None:
        path = Path(args.png)
        if not HAS_MATPLOTLIB:
            parser.error(
                f'--png={args.png}: the picture needs matplotlib: pip install -e ".[plot]"'
            )
        if path.suffix.lower() != ".png":
            parser.error(f"--png={args.png} must end in .png")
        if path.is_dir():
            parser.error(f"--png={args.png} is a directory; give a file name ending in .png")
        if not path.parent.is_dir():
            parser.error(f"--png={args.png}: the directory {path.parent} does not exist")
        return path, ""
    if not HAS_MATPLOTLIB:
        return None, 'no picture: pip install -e ".[plot]" for one'
    here = Path.cwd()
    if not os.access(here, os.W_OK):
        parser.error(f"the current directory {here} is not writable; pass --png PATH or --no-png")
    stem, suffix = Path(DEFAULT_PNG).stem, Path(DEFAULT_PNG).suffix
    for n in range(1, 1000):
        candidate = here / (DEFAULT_PNG if n == 1 else f"{stem}-{n}{suffix}")
        if not candidate.exists():
            break
    else:
        parser.error(f"{here} already holds {stem}.png to {stem}-999.png; pass --png PATH")
    note = (
        ""
        if n == 1
        else (
            f"{DEFAULT_PNG} exists and is left alone: the picture goes to {candidate.name} "
            f"(--png {DEFAULT_PNG} replaces it)"
        )
    )
    return candidate, note
