"""The ``virtualpar`` command line: ``virtualpar tour`` (more subcommands come with later issues)."""

from __future__ import annotations

import argparse
import sys

from . import __version__

__all__ = ["main"]


def _parse_mesh(text: str):
    from .mesh import Mesh

    shape = {}
    for part in text.split(","):
        name, _, size = part.partition("=")
        if not size.strip().isdigit():
            raise argparse.ArgumentTypeError(f"mesh must look like dp=2,tp=2; got {text!r}")
        shape[name.strip()] = int(size)
    return Mesh(shape)


def _tour(args: argparse.Namespace) -> int:
    from .tour import run_tour

    rows = run_tour(sys.stdout, trace_path=args.trace, hardware=args.hardware, mesh=args.mesh)
    return 0 if all(r.correct for r in rows) else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="virtualpar", description="One laptop as a virtual cluster.")
    parser.add_argument("--version", action="version", version=f"virtualpar {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    tour = sub.add_parser("tour", help="run every collective on a 2x2 mesh, check it against numpy, write a trace")
    tour.add_argument("--mesh", type=_parse_mesh, default=None, help="mesh axes, e.g. dp=2,tp=2 (default)")
    tour.add_argument("--hardware", default="h100-node", help="modelled hardware preset (laptop, h100-node, h100-cluster)")
    tour.add_argument("--trace", default="virtualpar-trace.json", help="where to write the Chrome trace")
    tour.set_defaults(func=_tour)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
