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
import importlib.util
import inspect
import os
import re
import sys
import time
import traceback

from ..trace.fmt import WIDTH, fit, seconds
from ._args import (default_hardware, hardware_choices, natural_int, output_file, parse_mesh, png_file,
                    positive_float, positive_int)
from ._output import can_draw, table_width
from ._progress import start_cluster

__all__ = ["register"]

_MPI_ENV = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")
ABORT_GRACE = 0.2  # seconds a failing MPI rank waits after printing why, before MPI_Abort tears the job down


def _hardware(args: argparse.Namespace, size: int) -> str | None:
    return default_hardware(args.hardware, size)


def _import(path: str):
    """Import the user's script; an error in it is shown as ``python FILE.py`` would show it,
    from the script's own frames, without virtualpar's import machinery above them."""
    if os.path.isdir(path) or not path.endswith(".py"):
        raise _usage(f"virtualpar run: {path!r} is not a Python file (FILE.py:FUNCTION)")
    spec = importlib.util.spec_from_file_location("__virtualpar_run__", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:
        tb = exc.__traceback__
        while tb is not None and os.path.abspath(tb.tb_frame.f_code.co_filename) != os.path.abspath(path):
            tb = tb.tb_next  # a SyntaxError has no frame of the script: its own text names the line
        shown = "".join(traceback.format_exception(type(exc), exc, tb)).rstrip()
        raise SystemExit(f"virtualpar run: importing {path} failed:\n{shown}") from None
    return module


def _functions(module) -> list[str]:
    """The public functions the script itself defines (not those it imports)."""
    return sorted(n for n, v in vars(module).items() if inspect.isfunction(v) and not n.startswith("_")
                  and v.__module__ == module.__name__)


def _defined(path: str) -> list[str]:
    """The public functions a script defines at top level, read without running it (an mpi4py
    script run by mistake without --mpi would start real MPI in the driver, and may never end)."""
    import ast

    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
        return []
    return sorted(n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                  and not n.name.startswith("_"))


def _usage(message: str) -> SystemExit:
    """A usage error found while loading the target: the message on stderr, exit 2 as argparse's."""
    print(message, file=sys.stderr)
    return SystemExit(2)


def _load(target: str):
    path, _, func = target.rpartition(":")
    if not path or not func:
        path = path or target.rstrip(":")
        if not os.path.exists(path):
            raise _usage(f"virtualpar run: expected FILE.py:FUNCTION, got {target!r} (and "
                         f"there is no file {path!r})")
        names = _defined(path)
        hint = f"; {path} defines {', '.join(names)}: e.g. virtualpar run {path}:{names[0]}" if names else ""
        raise _usage(f"virtualpar run: name the function to run on every device, FILE.py:FUNCTION, or pass "
                         f"--mpi to run an mpi4py script; got {target!r}{hint}")
    if not os.path.exists(path):
        raise _usage(f"virtualpar run: no such file {path!r}")
    module = _import(path)
    fn = getattr(module, func, None)
    if not callable(fn):
        what = (
            f"has no function {func!r}"
            if fn is None
            else f"defines {func!r} as {type(fn).__name__}, not a function"
        )
        raise _usage(f"virtualpar run: {path} {what}; its functions: {_functions(module)}")
    return fn


def _run_mpi(args: argparse.Namespace) -> int:
    """An unmodified mpi4py script on ``-n`` emulated devices; each rank's lines stream to this
    terminal as they are printed, prefixed ``[rank]`` when there is more than one (mpiexec's
    ``--tag-output``; ``--no-tag-output`` turns it off); exit code the largest of the ranks'."""
    from .. import Mesh, VirtualParError
    from ..mpi.facade import MPIAbort
    from ..mpi.script import run_script

    path = args.target
    if not os.path.exists(path):
        file, _, func = path.rpartition(":")
        hint = f" (to run {func}(dev) from {file} on every device, drop --mpi)" if file.endswith(".py") and \
            os.path.exists(file) else ""
        print(f"virtualpar run --mpi: no such file {path!r}{hint}", file=sys.stderr)
        return 2
    if args.mesh is not None:
        print("virtualpar run --mpi: --mesh does not apply: an mpi4py program sees COMM_WORLD and splits it "
              "itself; give the number of ranks with -n", file=sys.stderr)
        return 2
    args.n = args.n or 2
    mesh = Mesh({"world": args.n})
    try:
        options = _cluster_options(args, mesh.size)
        with start_cluster(mesh, hardware=_hardware(args, args.n), **options) as cluster:
            codes = cluster.run(run_script, os.path.abspath(path), list(args.script_args))
            _print(mesh, [], [], cluster.stats(), cluster.trace if args.trace or args.png else None, args,
                   codes=codes)
    except VirtualParError as exc:
        sys.stdout.flush()
        # an abort quotes the script's words
        text = str(exc) if isinstance(exc, MPIAbort) else _mpi_tags(str(exc))
        print(f"virtualpar run --mpi: {type(exc).__name__}: {text}", file=sys.stderr)
        return exc.errorcode if isinstance(exc, MPIAbort) else 1
    return max(codes)


def _cluster_options(args: argparse.Namespace, size: int) -> dict:
    tag = size > 1 if args.tag_output is None else args.tag_output
    return dict(timeout=args.timeout, run_timeout=args.run_timeout, eager_limit=args.eager_limit,
                shuffle=args.shuffle, tag_output=tag)


def _mpi_tags(text: str) -> str:
    """The device tags in a message, as the script's MPI tags: each communicator uses its own span
    of device tags (:mod:`virtualpar.mpi.facade_types`), and the last tag of a span is the facade's
    collectives."""
    from ..mpi.facade_types import _COLL, _SPAN

    def mpi(m: re.Match) -> str:
        tag = int(m.group(2))
        if tag < _SPAN:
            return m.group(0)
        return f"{m.group(1)}{tag % _SPAN}" if tag % _SPAN != _COLL else f"{m.group(1)}(a collective)"
    return re.sub(r"(tag[ =])(\d+)", mpi, text)


def _run_under_mpiexec(args: argparse.Namespace) -> int:
    """``step(dev)`` on this MPI process with ``dev`` an :class:`~virtualpar.mpi.device.MPIDevice`;
    rank 0 collects every rank's result, modelled clock, traffic and events and prints them as
    the emulator's ``run`` does."""
    from .. import Mesh
    from ..mpi.device import MPIDevice, collect

    from mpi4py import MPI

    fn = _load(args.target)
    mesh = args.mesh or Mesh({"world": MPI.COMM_WORLD.Get_size()})
    dev = MPIDevice(mesh, hardware=_hardware(args, mesh.size), timeout=args.timeout)
    try:
        got = collect(dev, fn(dev))  # an unpicklable result fails in collect: abort then too, or rank 0 waits
    except BaseException:  # the other ranks would wait for this one forever: abort the job, saying who
        print(f"virtualpar run: {dev.name} raised in {args.target}:\n{traceback.format_exc()}",
              file=sys.stderr, flush=True)
        _unlink_job_segments()
        time.sleep(ABORT_GRACE)  # the launcher forwards our stderr; aborting at once lost it (~1 run in 50)
        MPI.COMM_WORLD.Abort(1)
        return 1  # (Abort may return before the launcher kills this rank: nothing more to do here)
    if got is not None:
        _print(mesh, got["results"], got["clocks"], got["stats"], got["trace"], args)
    return 0


def _unlink_job_segments() -> None:
    """Unlink the shared-memory segments this MPI job maps (MPICH's ``/dev/shm/mpich_shm_*``):
    MPI_Abort kills every rank before MPI_Finalize would remove them.  Ranks that still map them
    keep their mappings, so unlinking first is safe; on systems without /proc this does nothing."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split(None, 5)[5].strip() for line in maps if "/dev/shm/mpich_shm_" in line}
    except OSError:
        return
    for path in paths:
        try:
            os.unlink(path.removesuffix(" (deleted)"))
        except OSError:
            pass  # another rank unlinked it first


def _shown(value) -> str:
    """A device's result as a person reads it: numpy scalars as plain numbers, arrays with numpy's
    own layout (shape and dtype named), anything else as Python writes it."""
    import numpy as np

    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, np.ndarray):
        body = np.array2string(value, max_line_width=90, threshold=64)
        return f"{value.dtype} array of shape {value.shape}\n{body}" if value.ndim else body
    return repr(value)


def _jsonable(value):
    """A device's result for ``--json``: arrays as nested lists, numpy scalars as numbers, JSON's
    own types as they are, anything else as its repr (a string)."""
    import numpy as np

    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {k: _jsonable(v) for k, v in value.items()}
    return repr(value)


def _json(mesh, results, clocks, stats, trace, args: argparse.Namespace, codes) -> None:
    """``--json``: one object on one line (after anything the devices printed)."""
    import json

    out = {"target": args.target, "mesh": dict(mesh.shape), "hardware": _hardware(args, mesh.size),
           "devices": [{"rank": r, "coords": mesh.index(r).as_dict(), "result": _jsonable(v),
                        "modelled_s": float(c)} for r, (v, c) in enumerate(zip(results, clocks))]}
    if codes is not None:
        out["exit_codes"] = list(codes)
    if args.stats:
        out["stats"] = {"bytes": stats.bytes.tolist(), "messages": stats.messages.tolist(),
                        "host_to_device": stats.host_to_device.tolist(),
                        "device_to_host": stats.device_to_host.tolist(), "unit": "bytes"}
    if args.trace or args.png:
        trace = trace() if callable(trace) else trace
    if args.trace:
        out["trace"] = trace.write_chrome(args.trace)
    if args.png:
        from ..trace.gantt import to_png

        out["png"] = to_png(trace, args.png, clock="model", title=f"virtualpar run {args.target} on {mesh}")
    print(json.dumps(out, allow_nan=False, default=repr))


def _print(mesh, results, clocks, stats, trace, args: argparse.Namespace, codes=None) -> None:
    if args.json:
        return _json(mesh, results, clocks, stats, trace, args, codes)
    for rank, (value, clock) in enumerate(zip(results, clocks)):
        head, text, tail = f"device {rank} {mesh.index(rank)}:", _shown(value), f"(modelled {seconds(clock)})"
        if "\n" in text or len(head) + len(text) + len(tail) + 4 > args.width:  # the value below, indented
            print(f"{head}   {tail}")
            body = (line for part in text.splitlines() for line in fit(part, args.width - 4))
            print("\n".join("    " + line for line in body))
        else:
            print(f"{head} {text}   {tail}")
    if args.stats:
        print(stats.format(width=args.width))
    if args.trace or args.png:
        trace = trace() if callable(trace) else trace  # the emulator's is fetched only when asked for
    if args.trace:
        print(f"trace: {trace.write_chrome(args.trace)} (open in chrome://tracing or ui.perfetto.dev)")
    if args.png:
        from ..trace.gantt import to_png

        path = to_png(trace, args.png, clock="model", title=f"virtualpar run {args.target} on {mesh}")
        print(f"timeline: {path} (modelled clock)")


def _run(args: argparse.Namespace) -> int:
    if args.mpi:
        return _run_mpi(args) if not args.png or can_draw("run") else 1
    if "--mpi" in args.script_args:
        print(f"usage: {args.usage}\nvirtualpar run: error: --mpi goes before "
              "FILE.py: what follows an mpi4py "
              "script is the script's own arguments", file=sys.stderr)
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
    if any(v in os.environ for v in _MPI_ENV):
        if args.eager_limit is not None or args.shuffle is not None:
            print("virtualpar run: --eager-limit and --shuffle are modes of the "
                  "emulator; under mpiexec the MPI "
                  "library decides (MPICH: MPIR_CVAR_CH3_EAGER_MAX_MSG_SIZE)", file=sys.stderr)
            return 2
        return _run_under_mpiexec(args)
    from .. import Mesh

    if args.mesh is not None and args.n is not None and args.n != args.mesh.size:  # -n was silently ignored
        print(f"virtualpar run: -n {args.n} and --mesh {args.mesh} ({args.mesh.size} "
              "devices) disagree; give one",
              file=sys.stderr)
        return 2
    from ..errors import UnknownAxisError

    fn = _load(args.target)
    mesh = args.mesh or Mesh({"world": args.n or 2})
    options = _cluster_options(args, mesh.size)
    try:
        with start_cluster(mesh, hardware=_hardware(args, mesh.size), **options) as cluster:
            results = cluster.run(fn)
            trace = cluster.trace if args.trace or args.png else None
            _print(mesh, results, cluster.clocks(), cluster.stats(), trace, args)
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
                   help="seconds any one op may wait (default 60), emulated or under "
                        "mpiexec: then a named error")
    p.add_argument("--run-timeout", type=positive_float, default=None, metavar="S",
                   help="seconds the whole run may take on the emulator (default: no "
                        "limit): a device busy in its "
                        "own code past it, where no op times out, ends the run in a RunTimeout")
    p.add_argument("--eager-limit", type=natural_int, default=None, metavar="BYTES",
                   help="strict mode: a send of more than BYTES waits for its matching "
                        "receive (0: every send), as "
                        "above MPI's eager limit, so a program that only works because "
                        "channels buffer ends in a "
                        "named Deadlock")
    p.add_argument("--shuffle", type=natural_int, default=None, metavar="SEED",
                   help="shuffled mode: seeded random pauses before sends and receives, "
                        "so a result that depends "
                        "on arrival order changes across seeds")
    p.add_argument("--mpi", action="store_true",
                   help="TARGET is an unmodified mpi4py script, run on -n devices")
    p.add_argument("--tag-output", action=argparse.BooleanOptionalAction, default=None,
                   help="prefix each line a device prints with [rank], as mpiexec --tag-output (default: on "
                        "for "
                        "more than one device); device prints stream as they come either way")
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
