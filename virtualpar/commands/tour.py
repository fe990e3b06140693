"""``virtualpar tour``: the guided run on built-in defaults."""

from __future__ import annotations

import argparse
import sys

from ._args import output_file, parse_mesh

__all__ = ["register"]


def _tour(args: argparse.Namespace) -> int:
    from ..tour import run_tour

    rows = run_tour(sys.stdout, trace_path=args.trace, hardware=args.hardware, mesh=args.mesh)
    return 0 if all(r.correct for r in rows) else 1


def register(sub) -> None:
    tour = sub.add_parser("tour", help="run every collective on a 2x2 mesh, check it against numpy, write a trace")
    tour.add_argument("--mesh", type=parse_mesh, default=None, help="mesh axes, e.g. dp=2,tp=2 (default); each axis of more than one device is a group of the tour")
    tour.add_argument("--hardware", default="h100-node", help="modelled hardware preset (laptop, h100-node, h100-cluster)")
    tour.add_argument("--trace", type=output_file, default="virtualpar-trace.json", help="where to write the Chrome trace")
    tour.set_defaults(func=_tour)
