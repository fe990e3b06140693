"""The start line of a run: every device begins ``fn`` once every device has been handed it.

Why: the driver hands a run to its devices one by one, and each must wake, read the command and
load the function before it starts; on 2 cores that is a wave of ~40–90 µs of CPU per device (at
16 devices the last one started ~0.6–1.6 ms after the first).  Without a start line the run's
first op absorbs that skew: the first barrier of a run at 16 devices took 5–7× the tenth, and a
wall-clock trace showed the devices starting apart.  MPI programs have the same line at
``MPI_Init``'s end, torch.distributed at ``init_process_group``'s.

How: one fence over every device (transport/arrivals.py: the last to arrive wakes the others, in
the order they arrived), which is not an op: it counts no op, moves no bytes, charges no
modelled time and leaves no trace.  It only aligns the start, so it never fails a run: a device
that waited the op timeout there begins anyway (a peer still loading the run's arguments delays
nobody's own work past that, and a peer that never comes is named by the first op that needs it,
its stack and all); one that failed before the line aborts the others at once.  Cost: one more
wave of wake-ups per run (an empty run took 0.81 → ~1.05 ms at 16 devices, 5.2 → 7.9 ms at 64);
``VirtualCluster(start_line=False)`` skips it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["wait_at_start_line"]


class _Waited(Exception):
    """The op timeout passed at the start line: begin without the latecomers."""


def _waited() -> _Waited:
    return _Waited()


def wait_at_start_line(dev: Any, run: int) -> None:
    """Return once every device of ``dev``'s cluster has reached the start of run number ``run``,
    or after the op timeout (see the module doc); ``DeviceAborted`` if the cluster is aborted."""
    if dev.size == 1:
        return
    core, mesh = dev._core, dev._group(None)  # the whole mesh, as its collectives resolve it
    arrivals = core.arrivals
    grp = arrivals.group(mesh.kind, mesh.ranks)
    c = arrivals.arrive(grp)
    if arrivals.arrived(grp, c):
        return
    try:
        core.endpoint.wait(lambda: arrivals.arrived(grp, c), core.timeout, _waited,
                           f"every device to start run #{run}")
    except _Waited:
        pass  # the latecomers complete this fence when they arrive; nobody waits for it again
