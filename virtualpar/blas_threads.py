"""BLAS threads of a device process: ``max(1, cores // devices)``, set once per process.

n device processes on c cores, each with numpy's default of c BLAS threads, thrash (a 4-device
pipeline step ran 26x slower), so every device process limits its BLAS before it computes.
threadpoolctl does the limiting; it finds the BLAS libraries by scanning those loaded, which costs
~2 ms and ~3 MiB of private memory in every process that does it (measured at 256 devices).  Under
fork the driver scans once (:func:`prepare`) and every device inherits the result.

Under fork the devices also inherit the limit itself (:func:`forking`): the driver lowers its own
BLAS threads to the devices' limit while it forks them and restores them right after, and a
device sets the limit only if its BLAS is not there already.  Why: setting OpenBLAS's thread count
starts its thread pool, whose workers then spin for ~0.1 s before they sleep (measured here:
~110 ms of CPU each).  Every device starting one at its first ``run`` put 323 ms of spinning
beside the 259 ms of real work in a 64-device cluster's first barrier (187 vs 69 ms at 16).
A device that inherits one thread never starts a pool at all; the driver's own pool (OpenBLAS
stops it at every fork anyway) starts again once, when its threads are restored, and spins once:
~0.1 s of CPU per cluster start (measured), against ~0.1 s per device before.  Under spawn and
forkserver the devices load OpenBLAS afresh, and it starts its pool as it loads: there the driver
starts them with ``OPENBLAS_NUM_THREADS`` set to their limit (and puts its own value back after).
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Any, Iterator

__all__ = ["prepare", "limit", "forking", "spawning", "threads_for"]

_controller: Any = None  # a threadpoolctl.ThreadpoolController; False if threadpoolctl cannot work here
_limited: tuple[int, int] | None = None  # (pid, threads) once this process has limited its BLAS


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


@contextmanager
def forking(devices: int) -> Iterator[None]:
    """Fork ``devices`` device processes inside this block: they inherit their BLAS limit (see
    the module doc); this process's own thread counts are restored when the block ends."""
    wanted = threads_for(devices)
    lowered = []
    for lib in _blas_libs():
        try:
            before = lib.num_threads
            if before > wanted:
                lib.set_num_threads(wanted)
                lowered.append((lib, before))
        except Exception:  # a BLAS threadpoolctl cannot drive: the device limits it itself
            pass
    try:
        yield
    finally:
        for lib, before in lowered:
            try:
                lib.set_num_threads(before)
            except Exception:
                pass


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
