"""``virtualpar strategy NAME --workers W --stages S --batches B [--group-size G] [--json]``: the unified
scheme's schedule of one strategy, its statistics and its worker × time diagram."""

from __future__ import annotations

import argparse
import json
import sys

from ._args import positive_int

__all__ = ["register"]


def _strategy(args: argparse.Namespace) -> int:
    from ..strategies import STRATEGIES, OldestBatchFirst, OldestStageFirst, simulate, to_text

    if args.name not in STRATEGIES:
        print(f"virtualpar strategy: unknown strategy {args.name!r}; choose one of {', '.join(STRATEGIES)}", file=sys.stderr)
        return 2
    if args.group_size is not None and args.name not in ("looped", "fs_looped"):
        print(f"virtualpar strategy: --group-size applies to looped and fs_looped; {args.name} has no batch groups",
              file=sys.stderr)
        return 2
    fn = STRATEGIES[args.name](args.workers, args.stages, args.batches, args.group_size)
    policy = OldestStageFirst if args.policy == "oldest-stage" else OldestBatchFirst
    run = simulate(args.workers, args.stages, args.batches, fn, policy, max_activations=args.max_activations)
    stats = {"strategy": args.name, "workers": args.workers, "stages": args.stages, "batches": args.batches,
             "latency": run.latency, "throughput": run.throughput, "utilisation": run.utilisation,
             "activation_transmissions": run.activation_transmissions,
             "weight_transmissions": run.weight_transmissions, "gradient_transmissions": run.gradient_transmissions,
             "weight_storage": run.weight_storage, "peak_activations": run.peak_activations,
             "mean_activations": run.mean_activations}
    if args.json:
        stats["schedule"] = [{"stage": i.work.stage, "batch": i.work.batch, "direction": i.work.direction.value,
                              "compute": i.workers.compute, "weight": i.workers.weight, "start": i.start, "end": i.end}
                             for i in run.items]
        print(json.dumps(stats))
        return 0
    print(to_text(run))
    print(f"latency {run.latency:g}  throughput {run.throughput:.3f} items/time/worker  peak activations "
          f"{run.peak_activations}  mean {run.mean_activations:.2f}")
    print(f"transmissions: activations {run.activation_transmissions}, weights {run.weight_transmissions} "
          f"(of which gradients back {run.gradient_transmissions}); weights stored per worker {run.weight_storage}")
    return 0


def register(sub) -> None:
    p = sub.add_parser("strategy", help="simulate a training strategy of the unified work->worker scheme")
    p.add_argument("name", help="ddp, fsdp, gpipe, looped, fs_looped or cuckoo")
    p.add_argument("--workers", type=positive_int, default=4, help="devices that run the work (default 4)")
    p.add_argument("--stages", type=positive_int, default=4, help="model stages (default 4)")
    p.add_argument("--batches", type=positive_int, default=8, help="(micro)batches in the step (default 8)")
    p.add_argument("--group-size", type=positive_int, default=None, help="looped strategies: workers per batch group")
    p.add_argument("--policy", choices=("oldest-batch", "oldest-stage"), default="oldest-batch",
                   help="which ready work a free worker takes first (default oldest-batch)")
    p.add_argument("--max-activations", type=positive_int, default=None, help="per-worker cap (1F1B emerges from gpipe)")
    p.add_argument("--json", action="store_true", help="print the statistics as one JSON object")
    p.set_defaults(func=_strategy)
