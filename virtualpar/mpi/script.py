"""Run an unmodified mpi4py script on one device, with ``mpi4py.MPI`` resolving to the facade."""

from __future__ import annotations

import types
from typing import Any

from .facade import MPIAbort, module_for
from .facade_types import AbortJob

__all__ = ["run_script"]


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
