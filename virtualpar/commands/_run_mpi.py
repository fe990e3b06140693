"""``virtualpar run`` and MPI: ``--mpi`` runs an unmodified mpi4py script on emulated devices, and
the same command started by ``mpiexec`` runs ``FUNC(dev)`` on the MPI processes with ``dev`` backed
by mpi4py, rank 0 printing what the emulator would.  A rank that fails aborts the job, saying who."""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
import traceback

from ._args import default_hardware
from ._progress import start_cluster
from ._run_output import print_run
from ._run_script import cluster_options, load

__all__ = ["ABORT_GRACE", "MPI_ENV", "run_mpi_script", "run_under_mpiexec"]

MPI_ENV = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")
ABORT_GRACE = 0.2  # seconds a failing MPI rank waits after printing why, before MPI_Abort tears the job down


def run_mpi_script(args: argparse.Namespace) -> int:
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
        options = cluster_options(args, mesh.size)
        with start_cluster(mesh, hardware=default_hardware(args.hardware, args.n), **options) as cluster:
            codes = cluster.run(run_script, os.path.abspath(path), list(args.script_args))
            print_run(mesh, [], [], cluster.stats(), cluster.trace if args.trace or args.png else None, args,
                   codes=codes)
    except VirtualParError as exc:
        sys.stdout.flush()
        # an abort quotes the script's words
        text = str(exc) if isinstance(exc, MPIAbort) else _mpi_tags(str(exc))
        print(f"virtualpar run --mpi: {type(exc).__name__}: {text}", file=sys.stderr)
        return exc.errorcode if isinstance(exc, MPIAbort) else 1
    return max(codes)


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


def run_under_mpiexec(args: argparse.Namespace) -> int:
    """``step(dev)`` on this MPI process with ``dev`` an :class:`~virtualpar.mpi.device.MPIDevice`;
    rank 0 collects every rank's result, modelled clock, traffic and events and prints them as
    the emulator's ``run`` does."""
    from .. import Mesh
    from ..mpi.device import MPIDevice, collect

    from mpi4py import MPI

    fn = load(args.target)
    mesh = args.mesh or Mesh({"world": MPI.COMM_WORLD.Get_size()})
    dev = MPIDevice(mesh, hardware=default_hardware(args.hardware, mesh.size), timeout=args.timeout)
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
        print_run(mesh, got["results"], got["clocks"], got["stats"], got["trace"], args)
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
