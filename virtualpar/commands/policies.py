"""``virtualpar policies``: run every MatMul (or FeedForward) sharding policy once and tabulate it."""

from __future__ import annotations

import argparse
import json
import sys

from ..trace.fmt import WIDTH, count, fit, nbytes, seconds, table
from ._args import default_hardware, hardware_choices, parse_mesh, png_file, positive_int, usage_error
from ._output import can_draw, table_width
from ._progress import bar, start_cluster

__all__ = ["register", "format_rows"]

_HEAD = ("policy", "ok", "model", "estimate", "sent/dev", "FLOP/dev", "peak/dev", "host in", "host out",
         "wall")
_NOTE = ("model: the modelled time of one forward, which also charges each kernel's memory traffic (the "
         "roofline), which small shapes are bound by; estimate: the closed form the explorer ranks by (each "
         "collective's steps·α + bytes/β, FLOPs at peak); sent: bytes to other devices; host in / out: "
         "bytes "
         "placed on / fetched from all devices together; wall: on this machine. Above: each policy's layouts "
         "and the collectives it ran")


def _shape(text: str) -> tuple[int, ...]:
    try:
        dims = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError("shape must be comma-separated ints, e.g. "
                                         f"4096,2048,4096; got {text!r}") from None
    if not dims or any(d <= 0 for d in dims):
        raise argparse.ArgumentTypeError(f"shape dims must be positive; got {text!r}")
    return dims


def format_rows(rows, width: int = WIDTH) -> str:
    """The rows as a table of at most ``width`` columns (one row per policy; long cells wrap), then
    the layouts and any errors, each wrapped at ``width`` too."""
    cells = [
        (r.policy, ("yes" if r.correct else "NO") + ("" if r.matches_closed_form else "*"),
         seconds(r.modelled_s), seconds(r.modelled_closed_form_s), nbytes(r.bytes_device_to_device),
         count(r.flops_per_device), nbytes(r.peak_bytes_per_device), nbytes(r.bytes_host_to_device),
         nbytes(r.bytes_device_to_host), seconds(r.wall_s))
        # cannot apply here: the reason follows
        if not r.error else (r.policy, "n/a", *["-"] * (len(_HEAD) - 2))
        for r in rows]
    right = [False, False] + [True] * (len(_HEAD) - 2)
    lines = [table(_HEAD, cells, width=width, right=right), ""]
    for r in rows:
        what = r.error or f"{r.layouts}; {' '.join(r.collectives) or 'no collective'}"
        lines += fit(f"{r.policy}: {what}", width)
    lines += [""] + fit(_NOTE, width)
    if any(not r.matches_closed_form and not r.error for r in rows):
        lines += fit("* measured bytes or FLOPs differ from the policy's closed form", width)
    return "\n".join(lines)


def _policies(args: argparse.Namespace) -> int:
    import numpy as np

    from ..tensor_parallel.table import check_shape_fits, explore_rows, policy_rows

    want = 4 if args.ffn else 3
    if len(args.shape) != want:
        dims = "b,s,m,h" if args.ffn else "m,k,n"
        got = ",".join(map(str, args.shape))
        return usage_error("policies", f"--shape needs {want} dims ({dims}), got {got}")
    from ..errors import UsageError

    try:
        check_shape_fits(args.shape, args.ffn, np.dtype(args.dtype))  # before the cluster starts
    except UsageError as exc:
        return usage_error("policies", exc.message)
    if args.png and not can_draw("policies"):
        return 1
    hardware = default_hardware(args.hardware, args.mesh.size)
    what = "FeedForward b,s,m,h" if args.ffn else "MatMul m,k,n"
    with start_cluster(args.mesh, hardware=hardware) as cluster:
        if args.explore is not None:
            with bar(None, "candidates run", "candidate") as progress:
                rows = explore_rows(cluster, args.shape, ffn=args.ffn, dtype=np.dtype(args.dtype),
                                    limit=args.explore or None, progress=progress)
        else:
            from ..tensor_parallel.ffn import FFN_POLICIES
            from ..tensor_parallel.matmul import MATMUL_POLICIES

            total = len(FFN_POLICIES) if args.ffn else len(MATMUL_POLICIES) + 1  # + "auto"
            with bar(total, "policies run", "policy") as progress:
                rows = policy_rows(cluster, args.shape, ffn=args.ffn, dtype=np.dtype(args.dtype),
                                   progress=progress)
    if args.png:
        from ._policy_chart import draw

        title = (f"{what} = {','.join(map(str, args.shape))}, {args.dtype}, mesh {args.mesh}, "
                 f"{hardware or 'the mesh links'}")
        print(f"chart: {draw(rows, args.png, title)}", file=sys.stderr if args.json else sys.stdout)
    if args.json:
        print(json.dumps([r.to_dict() for r in rows], indent=1, allow_nan=False))
    else:
        which = (
            "explorer's candidates, fastest modelled first" if args.explore is not None else "named policies"
        )
        head = (f"# {what} = {','.join(map(str, args.shape))}, {args.dtype}, mesh {args.mesh}, hardware "
                f"{hardware or 'the mesh links'}; {which}; each measured on its second execute, weights "
                "resident; "
                "/dev: the most any device sent, computed or held; n/a: the policy cannot apply (why: below)")
        print("\n".join(fit(head, args.width)))
        print(format_rows(rows, args.width))
    return 0 if all(r.correct for r in rows if not r.error) else 1


def register(sub) -> None:
    p = sub.add_parser("policies",
                       help="run every MatMul / FeedForward sharding policy once: correct?, "
                            "bytes, FLOPs, memory, time")
    p.add_argument("--mesh", type=parse_mesh, default=parse_mesh("x=2,y=4"),
                   help="mesh axes, e.g. x=2,y=4 (default)")
    p.add_argument("--shape", type=_shape, default=None,
                   help="the sizes in elements: m,k,n (MatMul, default 1024,512,1024) or b,s,m,h "
                        "with --ffn (default 8,128,1024,4096)")
    p.add_argument("--ffn", action="store_true", help="the FeedForward block instead of one MatMul")
    p.add_argument("--hardware", default=None, choices=hardware_choices(),
                   help="modelled hardware preset (%(choices)s); "
                   "default: h100-node up to 8 devices, h100-cluster for multiples of 8, "
                   "else the mesh's own links")
    p.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    p.add_argument("--json", action="store_true",
                   help="the same rows as JSON, with the field names of PolicyRow")
    p.add_argument("--explore", type=positive_int, nargs="?", const=0, default=None, metavar="N",
                   help="instead of the named policies: every assignment of mesh axes "
                        "(the explorer), fastest "
                        "modelled first, each run and checked; N: only the first N")
    p.add_argument("--png", metavar="FILE.png", type=png_file, default=None,
                   help="also draw the comparison: per policy, modelled time (compute and communication), "
                        "bytes "
                        "moved and peak memory per device; needs matplotlib: pip install \"virtualpar[viz]\"")
    p.add_argument("--width", type=table_width, default=WIDTH, metavar="N",
                   help=f"columns of the printed table (default {WIDTH})")
    p.set_defaults(func=_run)



def _run(args: argparse.Namespace) -> int:
    if args.shape is None:
        # seconds, not minutes, on a laptop
        args.shape = (8, 128, 1024, 4096) if args.ffn else (1024, 512, 1024)
    return _policies(args)
