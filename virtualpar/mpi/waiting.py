"""Waiting under MPI with a deadline, so that a mistake ends in a named error, not a hang.

MPI's blocking calls wait forever: a collective one member skips, two members calling different
collectives, a receive nobody sends.  The emulator names these (its fences and waits have
deadlines, its driver sees every device); under ``mpiexec`` the device polls the non-blocking form
of the call (``Iprobe``, ``Test``) until its deadline, then raises — and ``virtualpar run`` aborts
the job with that error.  Polling spins for the first 2 ms (MPICH busy-polls too), then sleeps
0.1 ms between polls: a short call costs a few µs more than MPI's blocking form, a long wait
little CPU.
"""

from __future__ import annotations

import time
from typing import Callable

__all__ = ["wait_for", "DEFAULT_TIMEOUT"]

DEFAULT_TIMEOUT = 60.0  # seconds, the emulator's default op timeout
_SPIN = 2e-3  # seconds of polling before a wait starts sleeping between polls


def wait_for(done: Callable[[], bool], deadline: float, on_timeout: Callable[[], Exception]) -> None:
    """Poll ``done()`` until it is true; past ``deadline`` (``time.monotonic()``) raise ``on_timeout()``."""
    spin_until = time.monotonic() + _SPIN
    polls = 0
    while not done():  # spinning: the clock is read every 64 polls
        polls += 1
        if polls % 64 == 0 and time.monotonic() > spin_until:
            break
    else:
        return
    while not done():  # a long wait: sleep between polls
        if time.monotonic() > deadline:
            raise on_timeout()
        time.sleep(1e-4)
