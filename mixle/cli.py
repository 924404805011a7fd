"""The ``mixle`` command line."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from mixle.demo import BACKENDS, run_demo

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mixle", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="write a synthetic volume and sample patches from it")
    demo.add_argument("--size", type=int, default=256, help="edge of the cubic volume (256)")
    demo.add_argument("--backend", choices=BACKENDS, default="auto")
    demo.add_argument("--patch", type=int, default=32, help="patch edge (32)")
    demo.add_argument("--num-patches", type=int, default=512)
    demo.add_argument("--seed", type=int, default=0)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "demo":
        if args.size < 1 or not 1 <= args.patch <= args.size:
            parser.error(f"--patch={args.patch} must be between 1 and --size={args.size}")
        if args.num_patches < 0:
            parser.error(f"--num-patches={args.num_patches} must be >= 0")
        run_demo(
            size=args.size,
            backend=args.backend,
            patch=args.patch,
            num_patches=args.num_patches,
            seed=args.seed,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
