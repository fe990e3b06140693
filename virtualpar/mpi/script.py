"""Run an unmodified mpi4py script on one device, with ``mpi4py.MPI`` resolving to the facade
(:func:`module_for` builds that module: ``COMM_WORLD``, the constants, ``Wtime``...)."""

from __future__ import annotations

import time
import types
from typing import Any

from .facade import Cartcomm, Comm, MPIAbort, OutsideSubset
from .facade_requests import REQUEST_NULL, UNDEFINED, Request
from .facade_types import (ANY_SOURCE, ANY_TAG, DOUBLE, FLOAT, IN_PLACE, INT, LONG, MAX, MIN, PROC_NULL, PROD,
                           SUM, TAG_UB, WTIME_IS_GLOBAL, AbortJob, Datatype, Op, Status)

__all__ = ["run_script", "module_for"]


def run_script(dev: Any, path: str, argv: list[str]) -> int:
    """Run the mpi4py script ``path`` on this device with ``mpi4py.MPI`` resolving to the facade;
    returns its exit code.  The script prints straight to the device's streams, so its lines reach
    the driver as they are printed (as under ``mpiexec``; ``VirtualCluster(tag_output=True)`` prefixes
    them with the rank).  virtualpar's own errors (a deadlock, a mismatch, ``comm.Abort``, an
    exception the script did not catch: the others are stopped, as mpiexec stops them) are raised,
    so the run reports them by name, after what the script printed until then."""
    import runpy
    import sys
    import traceback

    from ..errors import VirtualParError

    mpi = module_for(dev)
    pkg = types.ModuleType("mpi4py")
    pkg.MPI = mpi  # type: ignore[attr-defined]
    saved = {k: sys.modules.get(k) for k in ("mpi4py", "mpi4py.MPI")}
    sys.modules["mpi4py"], sys.modules["mpi4py.MPI"] = pkg, mpi
    argv0, sys.argv = sys.argv, [path, *argv]
    code = 0
    streams = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _line_buffered(sys.stdout), _line_buffered(sys.stderr)
    try:
        try:
            runpy.run_path(path, run_name="__main__")
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except VirtualParError:
            raise
        except AbortJob as job:  # Comm.Abort, through whatever `except Exception` the script has
            raise job.error from None
        except BaseException as exc:  # the others must not wait for this rank (python -m mpi4py aborts too)
            tb = exc.__traceback__
            while tb is not None and tb.tb_frame.f_code.co_filename != path:
                tb = tb.tb_next  # from the script's own frames, as ``python script.py`` shows them
            traceback.print_exception(type(exc), exc, tb or exc.__traceback__)
            raise MPIAbort(f"rank {dev.rank} raised {type(exc).__name__}: {exc} (its traceback is above); "
                           "the other ranks are stopped rather than left waiting for it",
                           rank=dev.rank, errorcode=1) from None
    finally:
        sys.argv = argv0
        for ours, theirs in zip((sys.stdout, sys.stderr), streams):  # flushed before the reply
            try:
                ours.close() if ours is not theirs else ours.flush()  # (closefd=False: the descriptor stays)
            except (OSError, ValueError, AttributeError):
                pass
        sys.stdout, sys.stderr = streams
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
    return code


def _line_buffered(stream: Any) -> Any:
    """A line-buffered text stream on ``stream``'s descriptor, so that each line leaves in one
    write as it is printed, even into a pipe (``reconfigure(line_buffering=True)`` writes a print's
    text and its newline apart, and two ranks' lines then glue); ``stream`` itself if it has none."""
    try:
        stream.flush()
        return open(stream.fileno(), "w", buffering=1, encoding="utf-8", errors="backslashreplace",
                    closefd=False)
    except (AttributeError, OSError, ValueError):
        return stream


def module_for(dev: Any) -> types.ModuleType:
    """An ``mpi4py.MPI`` module for ``dev``: ``COMM_WORLD`` spans every device."""
    mod = types.ModuleType("mpi4py.MPI")
    t0 = time.perf_counter()
    names = dict(
        COMM_WORLD=Comm(dev, tuple(range(dev.size)), 1),
        COMM_SELF=Comm(dev, (dev.rank,), 0),  # context 0: no other communicator's (they are >= 1)
        Comm=Comm, Cartcomm=Cartcomm, Request=Request, Status=Status, Op=Op, Datatype=Datatype,
        SUM=SUM, PROD=PROD, MAX=MAX, MIN=MIN, IN_PLACE=IN_PLACE,
        DOUBLE=DOUBLE, FLOAT=FLOAT, INT=INT, LONG=LONG,
        ANY_SOURCE=ANY_SOURCE, ANY_TAG=ANY_TAG, PROC_NULL=PROC_NULL, UNDEFINED=UNDEFINED,
        REQUEST_NULL=REQUEST_NULL, TAG_UB=TAG_UB, WTIME_IS_GLOBAL=WTIME_IS_GLOBAL,
        Wtime=lambda: time.perf_counter() - t0, Wtick=lambda: time.get_clock_info("perf_counter").resolution,
        Get_processor_name=lambda: f"virtualpar-{dev.rank}",
    )
    finalized = [False]  # mpi4py initialises at import and finalises at exit; a script may also call Finalize

    def finalize() -> None:
        finalized[0] = True

    names.update(Is_initialized=lambda: True, Is_finalized=lambda: finalized[0], Finalize=finalize)
    mod.__dict__.update(names)

    def missing(name: str) -> Any:
        raise OutsideSubset(f"MPI.{name} is outside the subset virtualpar emulates; run this program under "
                            "real MPI (mpiexec) for it")

    mod.__getattr__ = missing  # type: ignore[attr-defined]
    return mod
