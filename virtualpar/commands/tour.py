"""``virtualpar tour``: the guided run on built-in defaults."""

from __future__ import annotations

import argparse
import sys

from ._args import default_hardware, hardware_choices, output_file, parse_mesh, usage_error

__all__ = ["register"]


def _tour(args: argparse.Namespace) -> int:
    import dataclasses
    import io
    import json

    from ..tour import run_tour

    size = args.mesh.size if args.mesh is not None else 4
    if size < 2:
        return usage_error("tour", f"the tour needs a mesh of at least 2 devices (its collectives have a "
                                   f"root at position 1); got {args.mesh}")
    hardware = default_hardware(args.hardware, size)
    out = io.StringIO() if args.json else sys.stdout
    rows = run_tour(out, trace_path=args.trace, hardware=hardware, mesh=args.mesh)
    if args.json:  # one object on stdout: every collective run and section, with its check
        print(json.dumps({"hardware": hardware, "trace": args.trace, "modelled_unit": "seconds",
                          "rows": [dataclasses.asdict(r) for r in rows],
                          "correct": all(r.correct for r in rows)}))
    return 0 if all(r.correct for r in rows) else 1


def register(sub) -> None:
    tour = sub.add_parser("tour",
                          help="run every collective on a 2x2 mesh, check it against numpy, write a trace")
    tour.add_argument("--mesh", type=parse_mesh, default=None,
                      help="mesh axes, e.g. dp=2,tp=2 (default); each axis of more than one "
                           "device is a group of the tour")
    tour.add_argument("--hardware", default=None, choices=hardware_choices(),
                      help="modelled hardware preset, one of %(choices)s; default: h100-node up to 8 "
                           "devices, h100-cluster for multiples of 8")
    tour.add_argument("--trace", type=output_file, default="virtualpar-trace.json",
                      help="where to write the Chrome trace")
    tour.add_argument("--json", action="store_true",
                      help="instead of the text: one JSON object with every collective run (op, group, "
                           "algorithm, bytes, modelled seconds, correct) and each section's check")
    tour.set_defaults(func=_tour)
