"""``virtualpar strategy NAME [--workers W] [--stages S] [--batches B] [--group-size G]
[--costs F=1,B=2] [--json] [--png FILE] [--html FILE]``: the unified scheme's schedule of one
strategy, its statistics and its worker x time diagram."""

from __future__ import annotations

import argparse
import json

from ..trace.fmt import WIDTH, fit, number
from ._args import add_picture_args, check_cost_kinds, parse_costs, positive_int, usage_error
from ._output import table_width

__all__ = ["register"]

#: The scheduler looks at every batch for each of the 2SB items: O(S·B²) steps.
MAX_WORKERS, MAX_STAGES, MAX_BATCHES, MAX_ITEMS = 512, 512, 1024, 1 << 16


def _limits(args: argparse.Namespace) -> str | None:
    for flag, value, most in (("--workers", args.workers, MAX_WORKERS), ("--stages", args.stages, MAX_STAGES),
                              ("--batches", args.batches, MAX_BATCHES)):
        if value > most:
            return (f"{flag} {value}: at most {most} (a diagram of more is unreadable, and the scheduler's "
                    f"work grows as stages x batches^2)")
    items = 2 * args.stages * args.batches
    if items > MAX_ITEMS:
        return (f"--stages {args.stages} --batches {args.batches}: {items:,} work items (2 x stages x "
                f"batches); at most {MAX_ITEMS:,}: the scheduler compares every batch for each item, "
                f"{items * args.batches:,} steps here")
    return None


def _strategy(args: argparse.Namespace) -> int:
    from ..errors import UsageError
    from ..pipeline.diagram import Diagram
    from ..strategies import STRATEGIES, OldestBatchFirst, OldestStageFirst, simulate, to_text
    from ._pictures import write_pictures

    if args.name not in STRATEGIES:
        return usage_error("strategy", f"unknown strategy {args.name!r}; choose one of "
                                       f"{', '.join(STRATEGIES)}")
    if args.group_size is not None and args.name not in ("looped", "fs_looped"):
        return usage_error("strategy", f"--group-size applies to looped and fs_looped; {args.name} has no "
                                       f"batch groups")
    refused = check_cost_kinds(args.costs, ("F", "B"), f"the strategy {args.name}")
    if refused or _limits(args):
        return usage_error("strategy", refused or _limits(args))
    costs = {"F": 1.0, "B": 2.0, **(args.costs or {})}
    policy = OldestStageFirst if args.policy == "oldest-stage" else OldestBatchFirst
    try:
        fn = STRATEGIES[args.name](args.workers, args.stages, args.batches, args.group_size)
        run = simulate(args.workers, args.stages, args.batches, fn, policy, forward_cost=costs["F"],
                       backward_cost=costs["B"], max_activations=args.max_activations)
    except UsageError as exc:
        return usage_error("strategy", exc.message)
    stats = {"strategy": args.name, "workers": args.workers, "stages": args.stages, "batches": args.batches,
             "costs": costs, "cost_unit": "cost units",
             "latency": run.latency, "throughput": run.throughput, "utilisation": run.utilisation,
             "activation_transmissions": run.activation_transmissions,
             "weight_transmissions": run.weight_transmissions,
             "gradient_transmissions": run.gradient_transmissions,
             "weight_storage": run.weight_storage, "peak_activations": run.peak_activations,
             "mean_activations": run.mean_activations}
    if args.json:
        stats["schedule"] = [{"stage": i.work.stage, "batch": i.work.batch,
                              "direction": i.work.direction.value,
                              "compute": i.workers.compute, "weight": i.workers.weight, "start": i.start,
                              "end": i.end}
                             for i in run.items]
        print(json.dumps(stats))
    else:
        lines = [f"{args.name}: {args.workers} workers, {args.stages} stages, {args.batches} batches; costs "
                 f"F={number(costs['F'])}, B={number(costs['B'])} (cost units); a cell f2:5 / b2:5 is the "
                 f"forward / backward of stage 2 for batch 5; columns headed by their start time",
                 to_text(run, args.width),
                 f"latency {number(run.latency)} cost units   throughput {number(run.throughput)} items per "
                 f"cost unit per worker   activations: peak {run.peak_activations}, mean "
                 f"{number(run.mean_activations, 3)}",
                 f"transmissions: activations {run.activation_transmissions}, "
                 f"weights {run.weight_transmissions} "
                 f"(gradients back {run.gradient_transmissions}); weights stored per worker: "
                 f"{', '.join(map(str, run.weight_storage))}"]
        print("\n".join(line for text in lines for line in (text.splitlines() if text.startswith("worker |")
                                                             else fit(text, args.width))))
    if args.png or args.html:
        title = f"{args.name}: {args.workers} workers, {args.stages} stages, {args.batches} batches"
        return write_pictures(Diagram.from_strategy(run, title), args, "strategy")
    return 0


def register(sub) -> None:
    from ..strategies import STRATEGIES

    p = sub.add_parser("strategy", help="simulate a training strategy of the unified work->worker scheme")
    p.add_argument("name", metavar="NAME", help=f"the strategy: {', '.join(STRATEGIES)}")
    p.add_argument("--workers", type=positive_int, default=4, help="devices that run the work (default 4)")
    p.add_argument("--stages", type=positive_int, default=4, help="model stages (default 4)")
    p.add_argument("--batches", type=positive_int, default=8, help="(micro)batches in the step (default 8)")
    p.add_argument("--group-size", type=positive_int, default=None,
                   help="looped strategies: workers per batch group")
    p.add_argument("--policy", choices=("oldest-batch", "oldest-stage"), default="oldest-batch",
                   help="which ready work a free worker takes first (default oldest-batch)")
    p.add_argument("--max-activations", type=positive_int, default=None,
                   help="per-worker cap (1F1B emerges from gpipe)")
    p.add_argument("--costs", type=parse_costs, default=None, metavar="KIND=UNITS,...",
                   help="forward and backward costs in cost units (any one time unit; latency is in the same "
                        "unit), default F=1,B=2; the scheme runs F and B only, so I or W is refused")
    p.add_argument("--json", action="store_true",
                   help="print the statistics, the costs used and the schedule as one JSON object")
    p.add_argument("--width", type=table_width, default=WIDTH, metavar="N",
                   help=f"columns of the printed diagram: a wider one folds into blocks of columns "
                        f"(default {WIDTH})")
    add_picture_args(p, "the strategy's schedule (workers as rows)")
    p.set_defaults(func=_strategy)
