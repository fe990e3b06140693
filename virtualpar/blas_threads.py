"""BLAS threads of a device process: ``max(1, cores // devices)``, set once per process.

n device processes on c cores, each with numpy's default of c BLAS threads, thrash (a 4-device
pipeline step ran 26x slower), so every device process limits its BLAS before it computes.
threadpoolctl does the limiting; it finds the BLAS libraries by scanning those loaded, which costs
~2 ms and ~3 MiB of private memory in every process that does it (measured at 256 devices).  Under
fork the driver scans once (:func:`prepare`) and every device inherits the result.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["prepare", "limit"]

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


def limit(devices: int) -> int:
    """Limit this process's BLAS to ``max(1, cpus // devices)`` threads, once per process; returns
    the limit (later calls return the first one and change nothing)."""
    global _limited
    if _limited is not None and _limited[0] == os.getpid():
        return _limited[1]
    from .transport.waiting import usable_cpus  # the runtime's own count of the cores we may use

    prepare()
    threads = max(1, usable_cpus() // max(1, devices))
    if _controller:
        try:
            _controller.limit(limits=threads, user_api="blas")
        except Exception:  # a BLAS threadpoolctl does not know: leave it as it is
            pass
    _limited = (os.getpid(), threads)
    return threads
