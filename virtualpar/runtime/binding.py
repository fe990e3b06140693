"""Which cores a device process runs on: its own share of the driver's, dealt round-robin.

Device ``i`` of ``n`` on the ``c`` CPUs the driver may use gets ``k = max(1, c // n)`` of them,
the block starting at CPU ``(i·k) mod c``: with more devices than cores, device i runs on core
``i mod c`` (a 4-stage pipeline on 2 cores: stages 0 and 2 on one core, 1 and 3 on the other); with
fewer, each device owns ``k`` cores, as many as its BLAS threads (:mod:`virtualpar.blas_threads`).
MPI launchers bind ranks the same way (``--bind-to core --map-by core``).

Why bind: left to itself the kernel wakes a message's receiver on the sender's core, where it
preempts the sender, and it balances the load across cores only every few milliseconds.  Measured
on this 2-core VM, paired rounds, unbound → bound: the 4-stage MLP pipeline step 72 → 62 ms
(median of 6 rounds), 8-device barrier 2.1 → 1.5 ms and 512 KiB all_reduce 6.7 → 6.0 ms; at 32 and
64 devices every collective within ±10%.  ``VirtualCluster(bind=False)`` leaves the devices
unbound.  A CPU set the process may not use is skipped silently (binding is an optimisation).

A device binds its main thread at its first ``run``, before it limits its BLAS threads (which
then inherit the binding), not at start-up: 256 devices started in 2.1–2.7 s bound at once against
2.05 s unbound, because half of them then shared the forking driver's core.  Binding shrinks the
process's own CPU set, so the runtime's count of the cores the cluster shares (polling before
sleeping, BLAS threads) is taken before: :func:`bind` records it for
:func:`virtualpar.transport.waiting.usable_cpus`.
"""

from __future__ import annotations

import os

from ..transport import waiting

__all__ = ["cores_of", "bind"]


def cores_of(rank: int, devices: int, cpus: list[int]) -> list[int]:
    """The CPUs of device ``rank`` of ``devices`` sharing ``cpus`` (see the module doc)."""
    c = len(cpus)
    k = max(1, c // max(1, devices))
    start = (rank * k) % c
    return cpus[start:start + k]


def bind(rank: int, devices: int) -> None:
    """Bind this device's calling thread, and the threads it starts from now on, to its cores."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # no affinity on this platform
        return
    waiting.share_cpus(len(cpus))
    mine = cores_of(rank, devices, cpus)
    if len(mine) < len(cpus):
        try:
            os.sched_setaffinity(0, mine)
        except OSError:
            pass
