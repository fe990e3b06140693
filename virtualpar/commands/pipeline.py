"""``virtualpar pipeline [NAME] [--stages D] [--microbatches M] [--unit-costs | --costs F=1,B=2] [--json]
[--png FILE] [--html FILE] [--clock model|wall]``: train the MLP on a cluster with schedule NAME and show
the step that ran (text grid and diagram)."""

from __future__ import annotations

import argparse
import json
import sys

from ..trace.fmt import WIDTH, fit
from ._args import (add_picture_args, check_cost_kinds, hardware_choices, parse_costs, positive_int,
                    usage_error)

__all__ = ["register"]


def _pipeline(args: argparse.Namespace) -> int:
    import io

    from ..errors import UsageError
    from ..pipeline import SCHEDULES
    from .pipeline_demo import plan_demo, report, run_demo
    from ..pipeline.schedules import check_size, used_kinds
    from ._pictures import write_pictures

    name = args.name
    if args.schedule is not None:  # the old flag, kept working: the schedule is positional everywhere now
        if name is not None and name != args.schedule:
            return usage_error("pipeline", f"the schedule is given twice: {name!r} and --schedule "
                                           f"{args.schedule!r}")
        name = args.schedule
    name = name or "1f1b"
    if name not in SCHEDULES:
        return usage_error("pipeline", f"unknown schedule {name!r}; choose one of {', '.join(SCHEDULES)}")
    if args.unit_costs and args.costs:
        return usage_error("pipeline", "--unit-costs sets every kind to 1; give it or --costs, not both")
    kinds = used_kinds(name)
    refused = check_cost_kinds(args.costs, kinds, name)
    if refused:
        return usage_error("pipeline", refused)
    defaults = {k: 2.0 if k == "B" else 1.0 for k in kinds}
    costs = {k: 1.0 for k in kinds} if args.unit_costs else {**defaults, **args.costs} if args.costs else None
    try:
        check_size(name, args.stages or 1, args.microbatches, args.virtual)
        plan_demo(name, args.stages, args.microbatches, args.batch, args.virtual)
    except UsageError as exc:
        return usage_error("pipeline", exc.message)
    run = run_demo(name, args.stages, args.microbatches, args.steps, args.batch, args.hardware,
                   check=not args.no_check, costs=costs, virtual=args.virtual)
    timeline = run.op.timeline(clock=args.clock)
    if args.json:
        text = io.StringIO()
        report(text, run, args.steps, args.clock)
        print(json.dumps({"schedule": name, "devices": run.devices, "virtual": run.virtual,
                          "stages": run.stages, "microbatches": run.microbatches, "batch": run.batch,
                          "losses": run.losses, "costs": costs, "cost_unit": "cost units" if costs else None,
                          "hardware": None if costs else run.hardware,
                          "clock": run.clock, "clock_unit": "cost units" if costs else "seconds",
                          "step_makespan": timeline.diagram.makespan, "step_bubble": timeline.diagram.bubble,
                          "matches_single_process": run.matches}))
    else:
        report(sys.stdout, run, args.steps, args.clock)
        if costs is None and timeline.diagram.note:  # slivers on a time axis: say why, and what shows it
            print("\n".join(fit(f"note: on {args.hardware} this small MLP's compute fills "
                                f"{1 - timeline.diagram.bubble:.1%} of the ranks' time; they mostly wait for "
                                f"transfers. The schedule's own shape: virtualpar pipeline {name} "
                                "--unit-costs",
                                WIDTH)))
    if args.png or args.html:
        code = write_pictures(timeline.diagram, args, "pipeline")
        if code:
            return code
    return 0 if run.matches is not False else 1


def register(sub) -> None:
    from ..pipeline.schedules import SCHEDULES

    p = sub.add_parser("pipeline", help="train a 4-stage MLP with a pipeline schedule and show what ran")
    p.add_argument("name", nargs="?", default=None, metavar="NAME",
                   help=f"the schedule (default 1f1b): {', '.join(SCHEDULES)}")
    p.add_argument("--schedule", default=None, help=argparse.SUPPRESS)  # the old spelling, still accepted
    p.add_argument("--stages", type=positive_int, default=None,
                   help="pipeline devices (default 4, or 2 for schedules with 2 chunks per device)")
    p.add_argument("--virtual", type=positive_int, default=None,
                   help="model chunks per device (default: the schedule's, 1 or 2); the MLP is "
                        "cut into stages x virtual")
    p.add_argument("--microbatches", type=positive_int, default=8, help="microbatches per step (default 8)")
    p.add_argument("--steps", type=positive_int, default=3, help="training steps (default 3)")
    p.add_argument("--batch", type=positive_int, default=64,
                   help="samples per step, split into the microbatches: a multiple of them (default 64)")
    p.add_argument("--hardware", default="h100-node", choices=hardware_choices(),
                   help="modelled hardware preset (default h100-node): %(choices)s")
    p.add_argument("--no-check", action="store_true", help="float32, no comparison with one process")
    p.add_argument("--unit-costs", action="store_true",
                   help="model every kind the schedule runs at 1 cost unit on free links (the textbook grid)")
    p.add_argument("--costs", type=parse_costs, default=None, metavar="KIND=UNITS,...",
                   help="model the actions at these costs in cost units (a 1 FLOP/s device on free links "
                        "instead of --hardware, so the clock counts the units), e.g. F=1,I=1,W=1; default "
                        "F=1,B=2, or F=1,I=1,W=1 for zb_h1 and zbv (which split B into I and W); a kind the "
                        "schedule never runs is refused")
    p.add_argument("--clock", choices=("model", "wall"), default="model",
                   help="the clock the timeline and the diagram show: modelled (default) or this machine's "
                        "wall clock")
    p.add_argument("--json", action="store_true",
                   help="one JSON object: losses, costs used, modelled clock, the "
                        "step's makespan and bubble, "
                        "the check")
    add_picture_args(p, "the last executed step")
    p.set_defaults(func=_pipeline)
