"""``virtualpar policies``: run every MatMul (or FeedForward) sharding policy once and tabulate it."""

from __future__ import annotations

import argparse
import json
import sys

from ._args import default_hardware, hardware_choices, parse_mesh, positive_int

__all__ = ["register", "format_rows"]

_HEAD = ("policy", "ok", "collectives", "dev<->dev B", "host->devs B", "devs->host B", "FLOPs/dev",
         "peak B/dev", "wall s", "model s", "comm+FLOP s")


def _shape(text: str) -> tuple[int, ...]:
    try:
        dims = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"shape must be comma-separated ints, e.g. 4096,2048,4096; got {text!r}") from None
    if not dims or any(d <= 0 for d in dims):
        raise argparse.ArgumentTypeError(f"shape dims must be positive; got {text!r}")
    return dims


def format_rows(rows) -> str:
    """The rows as an aligned text table (one line per policy, then the layouts and any errors)."""
    cells = [_HEAD] + [
        (r.policy, ("yes" if r.correct else "NO") + ("" if r.matches_closed_form else "*"),
         " ".join(r.collectives) or "-", f"{r.bytes_device_to_device:,}", f"{r.bytes_host_to_device:,}",
         f"{r.bytes_device_to_host:,}", f"{r.flops_per_device:.3g}", f"{r.peak_bytes_per_device:,}",
         f"{r.wall_s:.4f}", f"{r.modelled_s:.3g}", f"{r.modelled_closed_form_s:.3g}")
        if not r.error else (r.policy, "n/a", *["-"] * (len(_HEAD) - 2))  # cannot apply here: the reason follows
        for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(_HEAD))]
    lines = ["  ".join(c[i].ljust(widths[i]) for i in range(len(_HEAD))) for c in cells]
    lines.append("")
    lines += [f"{r.policy}: {r.error or r.layouts}" for r in rows]
    lines.append("comm+FLOP s: the closed form the explorer ranks by (each collective's steps·α + bytes/β, FLOPs at "
                 "peak); model s also charges each kernel's memory traffic (the roofline), which small shapes are "
                 "bound by")
    if any(not r.matches_closed_form and not r.error for r in rows):
        lines.append("* measured bytes or FLOPs differ from the policy's closed form")
    return "\n".join(lines)


def _policies(args: argparse.Namespace) -> int:
    import numpy as np

    from .. import VirtualCluster
    from ..tensor_parallel.table import explore_rows, policy_rows

    want = 4 if args.ffn else 3
    if len(args.shape) != want:
        print(f"virtualpar policies: --shape needs {want} dims ({'b,s,m,h' if args.ffn else 'm,k,n'}), got {args.shape}", file=sys.stderr)
        return 2
    hardware = default_hardware(args.hardware, args.mesh.size)
    with VirtualCluster(args.mesh, hardware=hardware) as cluster:
        if args.explore is not None:
            rows = explore_rows(cluster, args.shape, ffn=args.ffn, dtype=np.dtype(args.dtype), limit=args.explore or None)
        else:
            rows = policy_rows(cluster, args.shape, ffn=args.ffn, dtype=np.dtype(args.dtype))
    if args.json:
        print(json.dumps([r.to_dict() for r in rows], indent=1, allow_nan=False))
    else:
        what = "FeedForward b,s,m,h" if args.ffn else "MatMul m,k,n"
        which = "explorer's candidates, fastest modelled first" if args.explore is not None else "named policies"
        print(f"# {what} = {args.shape}, {args.dtype}, mesh {args.mesh}, hardware {hardware or 'the mesh links'}; {which}; "
              "each measured on its second execute, weights resident; per device: the most any device sent, computed or "
              "held; host columns: all devices together; n/a: the policy cannot apply (why: below)")
        print(format_rows(rows))
    return 0 if all(r.correct for r in rows if not r.error) else 1


def register(sub) -> None:
    p = sub.add_parser("policies", help="run every MatMul / FeedForward sharding policy once: correct?, bytes, FLOPs, memory, time")
    p.add_argument("--mesh", type=parse_mesh, default=parse_mesh("x=2,y=4"), help="mesh axes, e.g. x=2,y=4 (default)")
    p.add_argument("--shape", type=_shape, default=None, help="m,k,n (MatMul, default 1024,512,1024) or b,s,m,h with --ffn (default 8,128,1024,4096)")
    p.add_argument("--ffn", action="store_true", help="the FeedForward block instead of one MatMul")
    p.add_argument("--hardware", default=None, choices=hardware_choices(), help="modelled hardware preset (%(choices)s); "
                   "default: h100-node up to 8 devices, h100-cluster for multiples of 8, else the mesh's own links")
    p.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    p.add_argument("--json", action="store_true", help="the same rows as JSON, with the field names of PolicyRow")
    p.add_argument("--explore", type=positive_int, nargs="?", const=0, default=None, metavar="N",
                   help="instead of the named policies: every assignment of mesh axes (the explorer), fastest "
                        "modelled first, each run and checked; N: only the first N")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    if args.shape is None:
        args.shape = (8, 128, 1024, 4096) if args.ffn else (1024, 512, 1024)  # seconds, not minutes, on a laptop
    return _policies(args)
