"""The start line of a run: every device begins ``fn`` once every device has been handed it.

Why: the driver hands a run to its devices one by one, and each must wake, read the command and
load the function before it starts; on 2 cores that is a wave of ~40–90 µs of CPU per device (at
16 devices the last one started ~0.6–1.6 ms after the first).  Without a start line the run's
first op absorbs that skew: the first barrier of a run at 16 devices took 5–7× the tenth, and a
wall-clock trace showed the devices starting apart.  MPI programs have the same line at
``MPI_Init``'s end, torch.distributed at ``init_process_group``'s.

How: one fence over every device (transport/arrivals.py: the last to arrive wakes the others, in
the order they arrived), which is not an op: it counts no op, moves no bytes, charges no
modelled time and leaves no trace.  Cost: one more wave of wake-ups per run (an empty run took
0.81 → ~1.05 ms at 16 devices, 5.2 → 7.9 ms at 64); ``VirtualCluster(start_line=False)`` skips it.
"""

from __future__ import annotations

from typing import Any

from .fence_kinds import fence_kinds

__all__ = ["wait_at_start_line", "START_TIMEOUT"]

START_TIMEOUT = 60.0  # seconds a device waits at the start line, at least


def wait_at_start_line(dev: Any, run: int) -> None:
    """Return once every device of ``dev``'s cluster has reached the start of run number ``run``.

    A device that fails before it gets there aborts the cluster (the driver), which ends this
    wait with ``DeviceAborted``; one that never comes (stuck loading the run's arguments) ends it
    after the op timeout, at least ``START_TIMEOUT`` (a user's short op timeout is for their ops:
    8 devices on 2 cores take longer than 0.1 ms to line up)."""
    if dev.size == 1:
        return
    arrivals = dev._endpoint.arrivals
    grp = arrivals.group(fence_kinds(dev.mesh) - 1, range(dev.size))  # the whole mesh
    c = arrivals.arrive(grp)
    if not arrivals.arrived(grp, c):
        timeout = max(dev.config.timeout, START_TIMEOUT)
        dev._endpoint.wait(lambda: arrivals.arrived(grp, c), timeout, None,
                           f"every device to start run #{run} (the start line, within {timeout:g} s)")
