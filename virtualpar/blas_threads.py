"""BLAS threads of a device process: ``max(1, cores // devices)``, set once per process.

n device processes on c cores, each with numpy's default of c BLAS threads, thrash (a 4-device
pipeline step ran 26x slower), so every device process limits its BLAS before it computes.
threadpoolctl does the limiting; it finds the BLAS libraries by scanning those loaded, which costs
~2 ms and ~3 MiB of private memory in every process that does it (measured at 256 devices).  Under
fork the driver scans once (:func:`prepare`) and every device inherits the result.

Under fork the devices also inherit the limit itself (:func:`hold`): the driver lowers its own
BLAS threads to the devices' share before it forks them, and a device sets the limit only if its
BLAS is not there already.  Why: setting OpenBLAS's thread count starts its thread pool, whose
workers then spin for ~0.1 s before they sleep (measured here: ~110 ms of CPU each).  Every device
starting one at its first ``run`` put 323 ms of spinning beside the 259 ms of real work in a
64-device cluster's first barrier (187 vs 69 ms at 16).  A device that inherits one thread never
starts a pool at all.

The driver keeps its own BLAS at that share while any cluster it forked is open, and gets its
thread counts back when the last one closes: it shares the cores with its devices, as they share
them with each other.  Restoring them at once, as it used to right after the fork, started the
driver's own pool (OpenBLAS stops it at every fork), whose worker spun ~0.1 s on one of the
cores the new devices were starting on: a 2-device cluster's first 4 KiB ping-pong measured
16-21 µs one way, against ~10 µs a second later or with no restore (benchmarks/README.md).  Now
it spins once the devices are gone (or not at all, if another cluster is forked before it
stops: the fork stops the pool).

Under spawn and forkserver the devices load OpenBLAS afresh, and it starts its pool as it loads:
there the driver starts them with ``OPENBLAS_NUM_THREADS`` set to their limit (and puts its own
value back after).
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Any, Callable, Iterator

__all__ = ["prepare", "limit", "hold", "spawning", "threads_for"]

_controller: Any = None  # a threadpoolctl.ThreadpoolController; False if threadpoolctl cannot work here
_limited: tuple[int, int] | None = None  # (pid, threads) once this process has limited its BLAS
_holds = 0  # clusters holding this process's BLAS at their devices' share (see hold)
_restore: list[tuple[Any, int]] = []  # (library, its thread count before the first of them)


def prepare() -> None:
    """Find this process's BLAS libraries now (the driver calls it before forking devices)."""
    global _controller
    if _controller is None:
        try:
            from threadpoolctl import ThreadpoolController

            _controller = ThreadpoolController()
        except Exception:  # no threadpoolctl, or a BLAS it cannot read: leave BLAS as it is
            _controller = False


def threads_for(devices: int) -> int:
    """The BLAS threads of each of ``devices`` device processes sharing this process's cores."""
    from .transport.waiting import usable_cpus  # the runtime's own count of the cores we may use

    return max(1, usable_cpus() // max(1, devices))


def _blas_libs() -> list[Any]:
    prepare()
    if not _controller:
        return []
    try:
        return list(_controller.select(user_api="blas").lib_controllers)
    except Exception:  # a BLAS threadpoolctl cannot read: leave it as it is
        return []


def hold(devices: int) -> Callable[[], None]:
    """Lower this process's BLAS threads to the share of each of ``devices`` devices (the devices
    forked now inherit it) and keep them there until every hold is released; returns this hold's
    release, which puts the thread counts back once it is the last (see the module doc; calling
    it again does nothing)."""
    global _holds
    wanted = threads_for(devices)
    for lib in _blas_libs():
        try:
            before = lib.num_threads
            if before > wanted:
                lib.set_num_threads(wanted)
                if not any(kept is lib for kept, _ in _restore):
                    _restore.append((lib, before))
        except Exception:  # a BLAS threadpoolctl cannot drive: the device limits it itself
            pass
    _holds += 1
    released = False

    def release() -> None:
        global _holds
        nonlocal released
        if released:
            return
        released = True
        _holds -= 1
        if _holds == 0:
            for lib, before in _restore:
                try:
                    lib.set_num_threads(before)
                except Exception:
                    pass
            _restore.clear()

    return release


@contextmanager
def spawning(devices: int) -> Iterator[None]:
    """Start ``devices`` device processes that load numpy afresh (spawn, forkserver) inside this
    block: OpenBLAS reads its thread count from the environment as it loads (see the module doc)."""
    name, before = "OPENBLAS_NUM_THREADS", os.environ.get("OPENBLAS_NUM_THREADS")
    os.environ[name] = str(threads_for(devices))
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


def limit(devices: int) -> int:
    """Limit this process's BLAS to ``max(1, cpus // devices)`` threads, once per process; returns
    the limit (later calls return the first one and change nothing)."""
    global _limited
    if _limited is not None and _limited[0] == os.getpid():
        return _limited[1]
    threads = threads_for(devices)
    for lib in _blas_libs():
        try:
            if lib.num_threads != threads:  # forked at its limit already (see forking): keep it
                lib.set_num_threads(threads)
        except Exception:  # a BLAS threadpoolctl does not know: leave it as it is
            pass
    _limited = (os.getpid(), threads)
    return threads
