"""``virtualpar schedule NAME [--stages R] [--microbatches M] [--virtual V]
[--costs F=1,I=1,W=1 | --unit-costs] [--json] [--png FILE] [--html FILE]``: the simulator's grid,
makespan, bubble and peak activations per stage, and the schedule's diagram — no processes."""

from __future__ import annotations

import argparse
import json

from ..trace.fmt import WIDTH, fit, number
from ._args import add_picture_args, check_cost_kinds, parse_costs, positive_int, usage_error
from ._output import table_width

__all__ = ["register", "default_costs", "COST_HELP"]

#: The grid is printed (and put in --json) up to this many cells, ranks x columns.
MAX_GRID_CELLS = 50_000

COST_HELP = ("costs per action kind in cost units (any one time unit; makespan and the axis are in the "
             "same unit), e.g. F=1,I=1,W=1; default F=1,B=2 for gpipe, 1f1b, "
             "interleaved_1f1b and looped_bfs, "
             "F=1,I=1,W=1 for zb_h1 and zbv (which split B into I and W); kinds not given take the default; "
             "a kind the schedule never runs is refused")


def default_costs(name: str) -> dict[str, float]:
    """The costs a named schedule is timed with when none are given (model units)."""
    from ..pipeline.schedules import used_kinds

    return {"F": 1.0, "I": 1.0, "W": 1.0} if "I" in used_kinds(name) else {"F": 1.0, "B": 2.0}


def _costs(args: argparse.Namespace, kinds: tuple[str, ...]) -> dict[str, float]:
    if args.unit_costs:
        return {k: 1.0 for k in kinds}
    return {**default_costs(args.name), **(args.costs or {})}


def _cell(sim) -> float:
    """The time one column of the step grid stands for: the shortest action."""
    return min((e - s for _, s, e in sim.times.values() if e > s), default=0.0)


def _text(sim, width: int) -> str:
    """The simulated schedule as text: the step grid (folded to ``width``) when the actions sit on
    equal cells, else a time axis scaled to ``width`` (see :func:`format_timeline`)."""
    from ..pipeline.timeline_grid import format_timeline

    rows: dict = {r: [] for r in range(sim.ranks)}
    for a, (r, s, e) in sorted(sim.times.items(), key=lambda kv: (kv[1][1], kv[1][2])):
        rows[r].append((a, (s, e)))
    return format_timeline(rows, width=width, unit="cost units")


def _grid_cells(sim) -> int:
    """An upper bound on the grid's cells, without building it."""
    durations = [e - s for _, s, e in sim.times.values() if e > s]
    columns = len({s for _, s, _ in sim.times.values()})
    if durations:
        columns = max(columns, int(sim.makespan / min(durations)) + 1)
    return sim.ranks * columns


def _schedule(args: argparse.Namespace) -> int:
    from ..errors import UsageError
    from ..pipeline import SCHEDULES, build, simulate
    from ..pipeline.diagram import Diagram
    from ..pipeline.schedules import check_size, used_kinds
    from ._pictures import write_pictures

    if args.name not in SCHEDULES:
        return usage_error("schedule", f"unknown schedule {args.name!r}; choose one of "
                                       f"{', '.join(SCHEDULES)}")
    kinds = used_kinds(args.name)
    if args.unit_costs and args.costs:
        return usage_error("schedule", "--unit-costs sets every kind to 1; give it or --costs, not both")
    refused = check_cost_kinds(args.costs, kinds, args.name)
    if refused:
        return usage_error("schedule", refused)
    costs = _costs(args, kinds)
    try:
        check_size(args.name, args.stages, args.microbatches, args.virtual)
        sched, placement = build(args.name, args.stages, args.microbatches, args.virtual)
        sim = simulate(sched, placement, args.microbatches, costs=costs)
    except UsageError as exc:
        return usage_error("schedule", exc.message)
    cells = _grid_cells(sim)
    grid = sim.grid() if cells <= MAX_GRID_CELLS else None
    omitted = (f"grid omitted: {sim.ranks} ranks x ~{cells // sim.ranks} columns is more than "
               f"{MAX_GRID_CELLS:,} cells; draw it with --html/--png, or use fewer microbatches") \
        if grid is None else None
    title = f"{args.name}: {args.stages} ranks, {placement.stages} stages, {args.microbatches} microbatches"
    if args.json:
        print(json.dumps({"schedule": args.name, "ranks": args.stages, "stages": placement.stages,
                          "microbatches": args.microbatches, "costs": costs, "cost_unit": "cost units",
                          "makespan": sim.makespan, "bubble": sim.bubble,
                          "peak_activations": sim.peak_activations, "utilisation": sim.utilisation,
                          "grid": None if grid is None else {str(r): [str(a) if a else None for a in row]
                                                             for r, row in grid.items()},
                          **({"grid_omitted": omitted} if omitted else {})}))
    else:
        given = ", ".join(f"{k}={number(v)}" for k, v in costs.items())
        text = _text(sim, args.width) if grid is not None else "\n".join(fit(f"({omitted})", args.width))
        cells = f"; one column per {number(_cell(sim))} cost unit" if text.startswith("rank |") else ""
        print("\n".join(fit(f"{title}; costs {given} (cost units){cells}", args.width)))
        print(text)
        peaks = ", ".join(str(p) for p in sim.peak_activations)
        print("\n".join(fit(f"makespan {number(sim.makespan)} cost units   bubble {sim.bubble:.2%}   "
                            f"peak activations per stage {peaks}", args.width)))
    if args.png or args.html:
        try:
            diagram = Diagram.from_simulation(sim, placement, title)
        except UsageError as exc:
            return usage_error("schedule", exc.message)
        return write_pictures(diagram, args, "schedule")
    return 0


def register(sub) -> None:
    from ..pipeline.schedules import SCHEDULES

    p = sub.add_parser("schedule",
                       help="simulate a pipeline schedule: grid, makespan, bubble, peak activations, diagram")
    p.add_argument("name", metavar="NAME", help=f"the schedule: {', '.join(SCHEDULES)}")
    p.add_argument("--stages", type=positive_int, default=4, help="pipeline ranks (default 4; at most 512)")
    p.add_argument("--microbatches", type=positive_int, default=8, help="microbatches per step (default 8)")
    p.add_argument("--virtual", type=positive_int, default=None,
                   help="model chunks per rank (stages = ranks x virtual)")
    p.add_argument("--costs", type=parse_costs, default=None, metavar="KIND=UNITS,...", help=COST_HELP)
    p.add_argument("--unit-costs", action="store_true", help="every kind the schedule runs costs 1 cost unit")
    p.add_argument("--json", action="store_true",
                   help="one JSON object: makespan, bubble, peak_activations, utilisation, costs used, grid")
    p.add_argument("--width", type=table_width, default=WIDTH, metavar="N",
                   help=f"columns of the printed grid: a wider one folds into blocks of steps "
                        f"(default {WIDTH})")
    add_picture_args(p, "the simulated schedule")
    p.set_defaults(func=_schedule)
