"""Starting a cluster's device processes: one process, two pipes and one doorbell each.

Per device the driver creates

- a *command pipe* (``Pipe(duplex=True)``): commands out, replies back.  ``Connection.send`` pickles
  in the caller, so an unpicklable object fails loudly here instead of being lost on a feeder thread
  as with ``multiprocessing.Queue``;
- a *sidecar pipe*, answered by a thread in the device, for stack requests while the device's main
  thread is stuck;
- a *doorbell* (a semaphore; one more for the host endpoint), rung by whoever changes something the
  endpoint may be waiting for (see :mod:`virtualpar.transport.endpoint`).

The driver closes its copies of the child ends at once: otherwise a child's death would not break
the pipe and the driver could not see it.  Nothing a start-up creates keeps a name that outlives
a driver killed at any moment: the shared arena has none (transport/shm.py: forked devices inherit
its mapping, spawned ones receive its descriptor), the doorbells' semaphores (named under
``spawn``/``forkserver`` only) are unlinked once every device has opened them, at the handshake,
and before that multiprocessing's resource tracker, which outlives the driver, removes them; the
forkserver removes its listener's directory when the driver dies (runtime/names.py).  The
handshake reply carries the device's pid.

Start-up is all or nothing: if any step fails (a fork error, a device that dies before its
handshake), every process already started is killed and reaped before the error propagates.
"""

from __future__ import annotations

import gc
import multiprocessing as mp
import time
from contextlib import nullcontext
from typing import Any, Callable

import numpy as np

from .. import blas_threads
from ..errors import UsageError
from ..mesh import Mesh
from ..transport.shm import Layout, SharedArena
from .config import ClusterConfig
from .recorder import FlightRecorder
from .supervisor import Supervisor
from .worker import WorkerArgs
from .names import unlink_semaphores

__all__ = ["start_devices", "READY_TIMEOUT"]

READY_TIMEOUT = 60.0  # seconds a device may take from start to its "ready" (spawn imports numpy)
# names first: the forkserver learns to remove its listener's directory before the long imports
_PRELOAD = ["virtualpar.runtime.names", "numpy", "networkx", "virtualpar.runtime.worker",
            "virtualpar.runtime.device"]


def start_devices(
    mesh: Mesh,
    config: ClusterConfig,
    layout: Layout,
    arena: SharedArena,
    start_method: str,
    clocks: list[Any],
    abort_grace: float,
    target: Callable[..., None],
    ready: Callable[[], None] | None = None,
) -> tuple[Supervisor, list[Any], list[int]]:
    """Start ``mesh.size`` processes running ``target(WorkerArgs, arena or None)``; wait until each is ready.

    ``clocks``: each device's modelled clock (a ``DeviceClock``).  Returns the supervisor watching
    the processes, the doorbells (index ``layout.host`` is the host's) and the devices' pids.
    ``ready()``, if given, is called as each device reports ready (a command's progress bar).
    """
    ctx = mp.get_context(start_method)
    if start_method == "forkserver":
        ctx.set_forkserver_preload(_PRELOAD)
    forked = start_method == "fork"
    if forked:
        arena.shared()  # children inherit the mapping: they need no descriptor of it
    doorbells = [ctx.Semaphore(0) for _ in range(layout.endpoints)]
    recorders = [FlightRecorder(arena, layout, r) for r in range(mesh.size)]
    sup = Supervisor(mesh, recorders, arena.view(layout.abort_offset, 1, np.int64), doorbells, abort_grace)
    if forked:  # the devices inherit the driver's BLAS threads: at their share, until they are gone
        sup.blas_release = blas_threads.hold(mesh.size)
    try:
        _spawn(ctx, sup, mesh, config, layout, arena, doorbells, clocks, target, forked)
        deadline = time.monotonic() + READY_TIMEOUT
        pids = []
        for r in range(mesh.size):
            pids.append(sup.recv_reply(r, deadline, "start-up")[1])
            if ready is not None:
                ready()
    except BaseException:
        sup.kill_all()
        sup.release()
        raise
    finally:
        arena.shared()  # every device has mapped it now (or is gone)
        if not forked:
            unlink_semaphores(doorbells)  # every device has opened them now (or is gone)
    return sup, doorbells, pids


def check_not_bootstrapping(start_method: str) -> None:
    """Refuse to start a cluster inside a spawned process that is still importing its parent's main
    module (a script without ``if __name__ == "__main__":`` under spawn or forkserver).  Each device
    would start a cluster of its own there: the driver kills them when the first one fails, and a
    killed process cannot free the shared memory it had just made."""
    # a device: multiprocessing refuses daemons children (an assert, gone under -O)
    if mp.current_process().daemon:
        raise UsageError(f"a VirtualCluster cannot be started inside a device ({mp.current_process().name}): "
                         "devices do not start processes; create clusters in the "
                         "driver, one after the other or "
                         "side by side")
    if start_method != "fork" and getattr(mp.current_process(), "_inheriting", False):
        raise UsageError(f"VirtualCluster(start_method={start_method!r}) was created "
                         "while a process started by "
                         f"{start_method} imports the main module: put the code that "
                         "creates the cluster under "
                         "`if __name__ == \"__main__\":` (each device started by "
                         f"{start_method} imports the main "
                         f"module again)")


def _before_fork() -> None:
    """What every device would otherwise do for itself after the fork, each paying its own copy:
    import what a first ``run`` needs (cloudpickle unpickles functions shipped by value) and find
    the BLAS libraries to limit (threadpoolctl's scan, ~3 MiB a device)."""
    import cloudpickle  # noqa: F401

    blas_threads.prepare()


def _start_all(procs: list[Any], forked: bool) -> None:
    """Start every process.  Under fork the driver's objects are frozen first (``gc.freeze``): a
    device's full collection then never writes the GC headers of the objects it inherited, so the
    pages holding them stay shared with the driver instead of being copied into every device
    (measured: 64 devices after a ``gc.collect()`` each hold 0.28 GiB frozen, 1.0 GiB not).  The
    driver unfreezes its own objects once the children exist.  Forked devices inherit their BLAS
    limit from the driver (``start_devices`` holds it there, ``blas_threads.hold``); spawned ones get
    it from their environment (``blas_threads.spawning``)."""
    freeze = forked and gc.get_freeze_count() == 0  # a driver that froze its own objects keeps them frozen
    if forked:
        _before_fork()
    if freeze:
        gc.freeze()
    try:
        with nullcontext() if forked else blas_threads.spawning(len(procs)):
            for proc in procs:
                proc.start()
    finally:
        if freeze:
            gc.unfreeze()


def _spawn(ctx: Any, sup: Supervisor, mesh: Mesh, config: ClusterConfig, layout: Layout, arena: SharedArena,
           doorbells: list[Any], clocks: list[Any], target: Callable[..., None], forked: bool) -> None:
    child_ends = []
    try:
        for r in range(mesh.size):
            here: list[Any] = []
            try:
                cmd_here, cmd_there = ctx.Pipe(duplex=True)
                here.append(cmd_here)
                child_ends.append(cmd_there)
                side_here, side_there = ctx.Pipe(duplex=True)
                here.append(side_here)
                child_ends.append(side_there)
                args = WorkerArgs(r, mesh, config, layout, arena.name, doorbells, cmd_there, side_there,
                                  clocks[r])
                proc = ctx.Process(target=target, args=(args, arena), daemon=True,
                                   name=f"virtualpar-device-{r}")
            except BaseException:
                for conn in here:
                    conn.close()  # not handed to the supervisor yet
                raise
            sup.add(proc, cmd_here, side_here)
        _start_all(sup.procs, forked)
    finally:
        for conn in child_ends:
            conn.close()  # the child has its own copy; ours would hide the child's death
