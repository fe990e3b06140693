"""``virtualpar schedule NAME --stages S --microbatches M [--virtual V] [--costs F=1,B=2,W=0] [--json]``:
the simulator's grid, makespan, bubble and peak activations per stage — no processes."""

from __future__ import annotations

import argparse
import json
import sys

from ._args import parse_costs, positive_int

__all__ = ["register"]


def _schedule(args: argparse.Namespace) -> int:
    from ..pipeline import SCHEDULES, build, format_grid, simulate

    if args.name not in SCHEDULES:
        print(f"virtualpar schedule: unknown schedule {args.name!r}; choose one of {', '.join(SCHEDULES)}", file=sys.stderr)
        return 2
    sched, placement = build(args.name, args.stages, args.microbatches, args.virtual)
    sim = simulate(sched, placement, args.microbatches, costs=args.costs)
    grid = sim.grid()
    if args.json:
        print(json.dumps({"schedule": args.name, "ranks": args.stages, "stages": placement.stages,
                          "microbatches": args.microbatches, "makespan": sim.makespan, "bubble": sim.bubble,
                          "peak_activations": sim.peak_activations, "utilisation": sim.utilisation,
                          "grid": {str(r): [str(a) if a else None for a in row] for r, row in grid.items()}}))
        return 0
    print(f"{args.name}: {args.stages} pipeline ranks, {placement.stages} stages, {args.microbatches} microbatches, "
          f"costs {dict(sorted({**{'F': 1.0, 'B': 2.0, 'I': 1.0, 'W': 1.0}, **(args.costs or {})}.items()))}")
    print(format_grid(grid))
    print(f"makespan {sim.makespan:g}   bubble {sim.bubble:.4f}   peak activations per stage {sim.peak_activations}")
    return 0


def register(sub) -> None:
    p = sub.add_parser("schedule", help="simulate a pipeline schedule: grid, makespan, bubble, peak activations")
    p.add_argument("name", help="gpipe, 1f1b, interleaved_1f1b, looped_bfs, zb_h1 or zbv")
    p.add_argument("--stages", type=positive_int, default=4, help="pipeline ranks (default 4)")
    p.add_argument("--microbatches", type=positive_int, default=8, help="microbatches per step (default 8)")
    p.add_argument("--virtual", type=positive_int, default=None, help="model chunks per rank (stages = ranks x virtual)")
    p.add_argument("--costs", type=parse_costs, default=None, help="per-action costs, e.g. F=1,B=2,W=0")
    p.add_argument("--json", action="store_true", help="fields makespan, bubble, peak_activations, grid")
    p.set_defaults(func=_schedule)
