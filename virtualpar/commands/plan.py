"""``virtualpar plan``: which (dp, tp, pp, cp, microbatches, schedule, zero, sp, recompute) to pick for a
GPT on N devices, before anyone rents them — ranked by modelled step time among those that fit
device memory (:mod:`virtualpar.parallel.plan`), with why the winner wins.

    virtualpar plan --model small --devices 64 --hardware h100-cluster
    virtualpar plan --model tiny --devices 8 --confirm      # run the top 3 for real and compare

``--confirm`` trains the top configurations (distinct by more than 2 % of modelled time) for two
steps on emulated devices and checks that the modelled clock of the real runs keeps their order.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import numpy as np

from ..trace.fmt import WIDTH, nbytes, seconds, table
from ._args import hardware_choices, positive_int, positive_number, usage_error
from ._output import table_width
from ._progress import bar

__all__ = ["register", "confirm"]


def _row(i: int, e: Any) -> list[Any]:
    return [i, e.label(), seconds(e.step_time), f"{100 * e.bubble:.1f}%", seconds(e.exposed_comm),
            seconds(e.compute), nbytes(e.memory["total"]), f"{100 * e.mfu:.2f}%"]


def _why(best: Any, others: list[tuple[str, Any]]) -> list[str]:
    """Sentences comparing the winner with the best of other families, by the three causes."""
    lines = []
    for name, e in others:
        if e is None or e is best:
            continue
        parts = [f"bubble {100 * e.bubble:.1f}% vs {100 * best.bubble:.1f}%"]
        parts.append(f"exposed communication {seconds(e.exposed_comm)} vs {seconds(best.exposed_comm)}")
        parts.append(f"compute {seconds(e.compute)} vs {seconds(best.compute)}")
        parts.append(f"memory {nbytes(e.memory['total'])} vs {nbytes(best.memory['total'])}")
        slower = e.step_time / best.step_time
        lines.append(f"- {name} ({e.label()}) is {slower:.2f}× slower: " + "; ".join(parts))
    return lines


def _families(fit: list[Any]) -> list[tuple[str, Any]]:
    def first(pred: Any) -> Any:
        return next((e for e in fit if pred(e.config)), None)
    return [("the runner-up", fit[1] if len(fit) > 1 else None),
            ("the best pure data parallelism", first(lambda c: c.tp == c.pp == c.cp == 1)),
            ("the best without a pipeline", first(lambda c: c.pp == 1)),
            ("the best with tensor parallelism", first(lambda c: c.tp > 1)),
            ("the best with context parallelism", first(lambda c: c.cp > 1))]


def distinct(fit: list[Any], k: int, margin: float = 0.02) -> list[Any]:
    """The first ``k`` estimates whose modelled step times differ from each other's by more than
    ``margin`` (ties, e.g. zero=0 and zero=1 at the same time, have no order to confirm)."""
    out: list[Any] = []
    for e in fit:
        if all(abs(e.step_time - o.step_time) > margin * o.step_time for o in out):
            out.append(e)
        if len(out) == k:
            break
    return out


def confirm(model_name: str, picked: list[Any], batch: int, seq: int, hardware: str, dtype: str,
            progress: Any = None) -> list[float]:
    """The modelled step time of a real run (2 steps, the second timed) of each picked configuration."""
    from .. import nn
    from ..parallel import ParallelTrainer
    from ._training import synthetic_batch
    from ._progress import start_cluster

    times = []
    for e in picked:
        model = nn.GPT.preset(model_name, dtype=np.dtype(dtype))
        trainer = ParallelTrainer(model, e.config, optimizer=nn.AdamW(1e-3))
        with start_cluster(e.config.mesh(), hardware=hardware) as cluster:
            for k in range(2):
                tokens, targets = synthetic_batch(k, batch, seq, model.vocab)
                cluster.execute(trainer, tokens, targets)
        times.append(trainer.last_step_time)
        if progress is not None:
            progress()
    return times


def _run(args: argparse.Namespace) -> int:
    from .. import nn
    from ..errors import MeshError, UsageError
    from ..parallel.plan import plan
    from ..sim.hardware import get_hardware
    from ._args import default_hardware

    hardware = default_hardware(args.hardware, args.devices)
    if hardware is None:
        return usage_error("plan", f"{args.devices} devices are not whole nodes of 8: name the machine with "
                                   f"--hardware (one of {', '.join(hardware_choices())})")
    hw = get_hardware(hardware)
    try:
        hw.topology(args.devices)
    except MeshError as exc:
        return usage_error("plan", str(exc))
    model = nn.GPT.preset(args.model)
    seq = args.seq or model.seq_len
    batch = args.batch or max(8, args.devices)
    capacity = None if args.memory is None else args.memory * 2 ** 30
    try:
        fit, unfit = plan(model, args.devices, hw, batch, seq, args.dtype, capacity)
    except UsageError as exc:
        return usage_error("plan", str(exc))
    if not fit:
        return usage_error("plan", f"none of the {unfit} configurations fits in "
                                   f"{nbytes(capacity or hw.device.memory_capacity)} per device")
    top = fit[:args.top]
    checked = None
    if args.confirm:
        if args.devices > 16:
            return usage_error("plan", f"--confirm runs the top configurations on {args.devices} "
                                       f"emulated devices; "
                                       "keep it to 16 or fewer")
        picked = distinct(fit, 3)
        with bar(len(picked), "confirming", "run") as advance:
            real = confirm(args.model, picked, batch, seq, hardware, args.dtype, advance)
        order = sorted(range(len(real)), key=lambda i: real[i])
        checked = {"configurations": [e.label() for e in picked], "modelled": [e.step_time for e in picked],
                   "real_modelled_clock": real, "order_holds": order == list(range(len(real)))}
    if args.json:
        print(json.dumps({"command": "plan", "model": args.model, "devices": args.devices,
                          "hardware": hardware, "batch": batch, "seq": seq, "dtype": args.dtype,
                          "fit": len(fit), "do_not_fit": unfit,
                          "ranking": [e.as_dict() for e in top], "confirm": checked}, indent=1))
        return 0 if checked is None or checked["order_holds"] else 1
    print(f"plan for GPT {args.model!r} ({model.num_parameters():,} parameters) on {args.devices} × "
          f"{hw.device.name} ({hardware}), batch {batch} × {seq} tokens, {args.dtype}: {len(fit)} "
          f"configurations fit in {nbytes(top[0].capacity)} per device, {unfit} do not")
    print(table(["#", "configuration", "step", "bubble", "exposed comm", "compute", "memory/device", "MFU"],
                [_row(i + 1, e) for i, e in enumerate(top)], width=args.width))
    print(f"\nwhy #1 wins ({top[0].label()}, {seconds(top[0].step_time)} a step):")
    for line in _why(top[0], _families(fit)):
        print(line)
    if checked is not None:
        print("\nconfirmed on the modelled clock of real runs (2 steps each, the second timed):")
        print(table(["configuration", "modelled by the plan", "real run"],
                    [[c, seconds(m), seconds(r)] for c, m, r in
                     zip(checked["configurations"], checked["modelled"], checked["real_modelled_clock"])],
                    width=args.width))
        print("the order holds" if checked["order_holds"] else "the order does NOT hold")
        return 0 if checked["order_holds"] else 1
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser("plan",
                       help="rank every parallel configuration of a GPT on N devices by modelled step time",
                       description=__doc__.split("\n\n")[0].replace("``", ""))
    p.add_argument("--model", default="small", choices=("tiny", "small"), help="GPT preset (default small)")
    p.add_argument("--devices", type=positive_int, default=8, metavar="N",
                   help="devices to plan for (default 8)")
    p.add_argument("--hardware", default=None, choices=hardware_choices(),
                   help="modelled machine (default h100-node up to 8 devices, h100-cluster for "
                        "multiples of 8)")
    p.add_argument("--batch", type=positive_int, default=None, metavar="ROWS",
                   help="sequences per step (default max(8, devices))")
    p.add_argument("--seq", type=positive_int, default=None, metavar="TOKENS",
                   help="tokens per sequence (default the model's seq_len)")
    p.add_argument("--dtype", default="float32", choices=("float32", "float64"),
                   help="element type: bytes per value and the peak FLOP/s it runs at (default float32)")
    p.add_argument("--memory", type=positive_number, default=None, metavar="GiB",
                   help="device memory to fit in, GiB (default the hardware's)")
    p.add_argument("--top", type=positive_int, default=10, metavar="N",
                   help="configurations to show (default 10)")
    p.add_argument("--confirm", action="store_true",
                   help="train the top 3 (distinct) configurations on emulated devices and check the "
                        "order holds "
                        "on their modelled clock (exit 1 if not)")
    p.add_argument("--json", action="store_true", help="print one JSON document instead of the tables")
    p.add_argument("--width", type=table_width, default=WIDTH, metavar="N",
                   help=f"columns of the tables (default {WIDTH})")
    p.set_defaults(func=_run)
