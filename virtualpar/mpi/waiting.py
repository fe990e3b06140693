"""Waiting under MPI with a deadline, so that a mistake ends in a named error, not a hang.

MPI's blocking calls wait forever: a collective one member skips, two members calling different
collectives, a receive nobody sends.  The emulator names these (its fences and waits have
deadlines, its driver sees every device); under ``mpiexec`` the device polls the non-blocking form
of the call (``Iprobe``, ``Test``) until its deadline, then raises — and ``virtualpar run`` aborts
the job with that error.  Polling costs no more than MPI's own progress: the first few hundred
polls spin, later ones sleep 0.2 ms between.
"""

from __future__ import annotations

import time
from typing import Callable

__all__ = ["wait_for", "DEFAULT_TIMEOUT"]

DEFAULT_TIMEOUT = 60.0  # seconds, the emulator's default op timeout
_SPIN = 200


def wait_for(done: Callable[[], bool], deadline: float, on_timeout: Callable[[], Exception]) -> None:
    """Poll ``done()`` until it is true; past ``deadline`` (``time.monotonic()``) raise ``on_timeout()``."""
    polls = 0
    while not done():
        polls += 1
        if polls > _SPIN:
            if time.monotonic() > deadline:
                raise on_timeout()
            time.sleep(2e-4)
