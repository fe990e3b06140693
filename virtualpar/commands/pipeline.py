"""``virtualpar pipeline --schedule 1f1b``: train the MLP on a cluster and show the timeline that ran."""

from __future__ import annotations

import argparse
import sys

from ._args import positive_int

__all__ = ["register"]


def _pipeline(args: argparse.Namespace) -> int:
    from ..pipeline import SCHEDULES
    from ..pipeline.demo import train_demo

    if args.schedule not in SCHEDULES:
        print(f"virtualpar pipeline: unknown schedule {args.schedule!r}; choose one of {', '.join(SCHEDULES)}",
              file=sys.stderr)
        return 2
    ok = train_demo(sys.stdout, args.schedule, args.stages, args.microbatches, args.steps, args.batch,
                    args.hardware, check=not args.no_check, unit=args.unit_costs, virtual=args.virtual)
    return 0 if ok else 1


def register(sub) -> None:
    p = sub.add_parser("pipeline", help="train seed 003's MLP with a pipeline schedule and show what ran")
    p.add_argument("--schedule", default="1f1b", help="gpipe, 1f1b, interleaved_1f1b, looped_bfs, zb_h1, zbv")
    p.add_argument("--stages", type=positive_int, default=None,
                   help="pipeline devices (default 4, or 2 for schedules with 2 chunks per device)")
    p.add_argument("--virtual", type=positive_int, default=None,
                   help="model chunks per device (default: the schedule's, 1 or 2); the MLP is cut into stages x virtual")
    p.add_argument("--microbatches", type=positive_int, default=8, help="microbatches per step (default 8)")
    p.add_argument("--steps", type=positive_int, default=3, help="training steps (default 3)")
    p.add_argument("--batch", type=positive_int, default=64,
                   help="samples per step, split into the microbatches (default 64)")
    p.add_argument("--hardware", default="h100-node", help="modelled hardware preset")
    p.add_argument("--no-check", action="store_true", help="float32, no comparison with one process")
    p.add_argument("--unit-costs", action="store_true", help="model F=1, B=2 time units on free links (textbook grid)")
    p.set_defaults(func=_pipeline)
