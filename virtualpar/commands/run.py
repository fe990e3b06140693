"""``virtualpar run FILE.py:FUNC [--mesh dp=2,tp=2] [--hardware h100-node]``: run ``FUNC(dev)`` from a
script on an emulated cluster and print what each device returned, with the modelled clocks.

The script is loaded as a module (its ``if __name__ == "__main__"`` block does not run); the
function ships to the devices by value, so it may use anything the script defines.  Started under
``mpiexec -n N``, the same command runs ``FUNC(dev)`` on the N MPI processes with ``dev`` backed by
mpi4py (:mod:`virtualpar.mpi.device`), and rank 0 prints what the emulator would.  ``--stats`` adds
the bytes each device sent to each other, ``--trace FILE.json`` writes the Chrome trace (under MPI
the bytes of MPI's own collectives are MPI's business and not counted; those of p2p and of
virtualpar's algorithms chosen with ``algorithm=`` are).  ``--eager-limit BYTES`` (strict mode:
a send of more than BYTES completes only once its receive is posted, so a program that relies on
buffering ends in a named ``Deadlock``) and ``--shuffle SEED`` (seeded pauses before sends and
receives, so races show up) are modes of the emulator, with or without ``--mpi``."""


from __future__ import annotations

import argparse
import os
import re
import sys

from ..trace.fmt import WIDTH
from ._args import (default_hardware, hardware_choices, natural_int, output_file, parse_mesh, png_file,
                    positive_float, positive_int)
from ._output import can_draw, table_width
from ._progress import start_cluster
from ._run_mpi import MPI_ENV, run_mpi_script, run_under_mpiexec
# (other commands import these two from here)
from ._run_mpi import ABORT_GRACE
from ._run_output import print_run
from ._run_script import cluster_options, load

__all__ = ["ABORT_GRACE", "register"]


def _run(args: argparse.Namespace) -> int:
    if args.mpi:
        return run_mpi_script(args) if not args.png or can_draw("run") else 1
    if "--mpi" in args.script_args:
        print(f"usage: {args.usage}\nvirtualpar run: error: --mpi goes before FILE.py: what follows an "
              "mpi4py script is the script's own arguments", file=sys.stderr)
        return 2
    if args.script_args:  # options given after the target (REMAINDER keeps them for --mpi scripts)
        late = argparse.ArgumentParser(prog="virtualpar run", usage=args.usage)
        late.add_argument("--mesh", type=parse_mesh, default=args.mesh)
        late.add_argument("-n", type=positive_int, default=args.n)
        late.add_argument("--hardware", default=args.hardware, choices=hardware_choices())
        late.add_argument("--stats", action="store_true", default=args.stats)
        late.add_argument("--trace", type=output_file, default=args.trace)
        late.add_argument("--timeout", type=positive_float, default=args.timeout)
        late.add_argument("--run-timeout", type=positive_float, default=args.run_timeout)
        late.add_argument("--eager-limit", type=natural_int, default=args.eager_limit)
        late.add_argument("--shuffle", type=natural_int, default=args.shuffle)
        late.add_argument("--tag-output", action=argparse.BooleanOptionalAction, default=args.tag_output)
        late.add_argument("--png", type=png_file, default=args.png)
        late.add_argument("--width", type=table_width, default=args.width)
        late.add_argument("--json", action="store_true", default=args.json)
        late.parse_args(args.script_args, namespace=args)
    if args.png and not can_draw("run"):
        return 1
    if any(v in os.environ for v in MPI_ENV):
        if args.eager_limit is not None or args.shuffle is not None:
            print("virtualpar run: --eager-limit and --shuffle are modes of the emulator; under mpiexec the "
                  "MPI library decides (MPICH: MPIR_CVAR_CH3_EAGER_MAX_MSG_SIZE)", file=sys.stderr)
            return 2
        return run_under_mpiexec(args)
    from .. import Mesh

    if args.mesh is not None and args.n is not None and args.n != args.mesh.size:  # -n was silently ignored
        print(f"virtualpar run: -n {args.n} and --mesh {args.mesh} ({args.mesh.size} devices) disagree; "
              "give one", file=sys.stderr)
        return 2
    from ..errors import UnknownAxisError

    fn = load(args.target)
    mesh = args.mesh or Mesh({"world": args.n or 2})
    options = cluster_options(args, mesh.size)
    try:
        with start_cluster(mesh, hardware=default_hardware(args.hardware, mesh.size), **options) as cluster:
            results = cluster.run(fn)
            trace = cluster.trace if args.trace or args.png else None
            print_run(mesh, results, cluster.clocks(), cluster.stats(), trace, args)
    except UnknownAxisError as exc:
        if args.mesh is not None:
            raise
        hint = _axis_hint(exc.message, mesh.size, args.n is not None)
        raise exc.replace(f"{exc.message}; {hint}") from exc.__cause__
    return 0


def _axis_hint(message: str, n: int, given: bool) -> str:
    """What to add when a function run on ``-n N`` (a one-axis mesh, ``world``) names another
    axis: the ``--mesh`` that names it."""
    found = re.search(r"unknown mesh axis '([^']+)'", message)
    axis = found.group(1) if found else "tp"
    other = "dp" if axis != "dp" else "tp"
    two = f" (or two axes: --mesh {other}=2,{axis}={n // 2})" if n % 2 == 0 and n > 2 else ""
    made = f"-n {n} makes" if given else f"without --mesh, {n} devices make"
    return f"{made} a one-axis mesh (world={n}): name the axes with --mesh, e.g. --mesh {axis}={n}{two}"


def register(sub) -> None:
    p = sub.add_parser("run", help="run FUNC(dev) from a script on every device, or (--mpi) an mpi4py script")
    p.add_argument("target",
                   help="FILE.py:FUNCTION, a function of one argument, the device; with --mpi, FILE.py")
    p.add_argument("--mesh", type=parse_mesh, default=None,
                   help="mesh axes, e.g. dp=2,tp=2 (not with --mpi: use -n)")
    p.add_argument("-n", type=positive_int, default=None,
                   help="devices of a 1-D mesh when --mesh is not given (default 2)")
    p.add_argument("--hardware", default=None, choices=hardware_choices(),
                   help="modelled hardware preset (default: h100-node up to 8 devices, h100-cluster for "
                        "multiples of 8, else the mesh's fully connected NVLink-class links)")
    p.add_argument("--stats", action="store_true", help="print the bytes each device sent to each other")
    p.add_argument("--trace", metavar="FILE.json", type=output_file, default=None,
                   help="write every device's events as a Chrome trace")
    p.add_argument("--timeout", type=positive_float, default=60.0, metavar="S",
                   help="seconds any one op may wait (default 60), emulated or under mpiexec: then a named "
                        "error")
    p.add_argument("--run-timeout", type=positive_float, default=None, metavar="S",
                   help="seconds the whole run may take on the emulator (default: no limit): a device busy "
                        "in its own code past it, where no op times out, ends the run in a RunTimeout")
    p.add_argument("--eager-limit", type=natural_int, default=None, metavar="BYTES",
                   help="strict mode: a send of more than BYTES waits for its matching receive (0: every "
                        "send), as above MPI's eager limit, so a program that only works because channels "
                        "buffer ends in a named Deadlock")
    p.add_argument("--shuffle", type=natural_int, default=None, metavar="SEED",
                   help="shuffled mode: seeded random pauses before sends and receives, so a result that "
                        "depends on arrival order changes across seeds")
    p.add_argument("--mpi", action="store_true",
                   help="TARGET is an unmodified mpi4py script, run on -n devices")
    p.add_argument("--tag-output", action=argparse.BooleanOptionalAction, default=None,
                   help="prefix each line a device prints with [rank], as mpiexec --tag-output (default: on "
                        "for more than one device); device prints stream as they come either way")
    p.add_argument("--png", metavar="FILE.png", type=png_file, default=None,
                   help="draw the run's Gantt chart (modelled clock, each collective named on its boxes); "
                        "needs matplotlib: pip install \"virtualpar[viz]\"")
    p.add_argument("--width", type=table_width, default=WIDTH, metavar="N",
                   help=f"columns of the printed tables (default {WIDTH})")
    p.add_argument("--json", action="store_true",
                   help="instead of the text: one JSON object on one line (after anything the "
                        "devices print): each device's rank, mesh coordinates, result and modelled "
                        "clock in seconds; with --stats the bytes matrices; with --mpi the exit codes")
    rest = p.add_argument("script_args", nargs=argparse.REMAINDER,
                          help="with --mpi: the script's own arguments")
    rest.required = False  # argparse counts a REMAINDER as required: "required: target, script_args"
    p.set_defaults(func=_run, usage=p.format_usage().partition("usage: ")[2].strip())
