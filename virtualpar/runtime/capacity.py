"""How many devices this machine can hold, checked before a cluster allocates anything.

``VirtualCluster(10000)`` used to run for 6 s and end in a raw ``OSError: Cannot allocate memory``
from ``mmap``.  Here the cluster's needs are set against what the machine has, from figures read in
microseconds, and a cluster that cannot fit is refused with how many devices would.

What a cluster of n devices (E = n + 1 endpoints, the host included) surely touches:

- shared memory: per pair of endpoints a ring's two control lines and three traffic counters,
  ``2·64 + 3·8 = 152`` bytes, so ``152·E²`` (the driver zeroes and reads them all), plus per device
  its flight recorder (~16 KiB) and its fence words.  Rings and scratch are backed only where
  traffic touches them, so they are not counted: that would refuse clusters that run today;
- private memory: an idle device process, at least ``PROCESS_BYTES`` (measured proportional set
  size of an idle device: 16 MiB forked, 19 MiB under forkserver, 39 MiB spawned; the bound takes
  half the smallest);
- address space: the whole segment is mapped at once, ``Layout.total_bytes`` (``E·(E-1)`` rings of
  ``ring_bytes``), which must stay below ``ADDRESS_SPACE`` (x86-64 user space is 128 TiB);
- open files: the driver holds ``FDS_PER_DEVICE`` descriptors per device (command pipe, sidecar
  pipe, process sentinel), under ``RLIMIT_NOFILE``.

Limits: shared ≤ /dev/shm free; shared + private ≤ memory available; each of the others ≤ its own.
These are lower bounds of the need: a cluster that passes may still run short once its traffic
touches its rings, but one that fails could not have started.
"""

from __future__ import annotations

import resource
from typing import Callable

from .. import sysmem
from ..errors import ResourceLimitError
from ..transport.shm import RECORD_BYTES, RECORD_SLOTS, Layout

__all__ = ["check_capacity", "PROCESS_BYTES", "FDS_PER_DEVICE", "ADDRESS_SPACE"]

PROCESS_BYTES = 8 << 20  # private memory of one idle device process, at least
FDS_PER_DEVICE = 3  # the driver's descriptors per device
FDS_SPARE = 64  # the driver's own files, the doorbells' and the forkserver's
ADDRESS_SPACE = 64 << 40  # bytes one mapping may take (half of x86-64's 128 TiB user space)
_PAIR_BYTES = 2 * 64 + 3 * 8  # control lines and traffic counters per pair of endpoints
_DEVICE_SHARED = 64 + RECORD_SLOTS * RECORD_BYTES  # a device's flight recorder


def _shared(n: int) -> int:
    return _PAIR_BYTES * (n + 1) ** 2 + _DEVICE_SHARED * n


def _open_files_limit() -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 30


def check_capacity(layout: Layout) -> None:
    """Refuse a cluster of ``layout.devices`` devices that this machine cannot hold (see the module
    doc), with ``ResourceLimitError`` naming the limit, both figures and how many devices fit."""
    n = layout.devices
    shm, avail, files = sysmem.shm_free(), sysmem.physical_available(), _open_files_limit()
    per_ring = layout.total_bytes / max(1, n * (n + 1))  # the segment's bytes per directed channel, about
    gib = sysmem.gib
    shared, private = _shared(n), n * PROCESS_BYTES
    limits: list[tuple[Callable[[int], bool], str]] = [
        (lambda k: _shared(k) <= shm,
         f"its shared memory (152 B per pair of endpoints and ~16 KiB per device: {gib(shared)}) exceeds "
         f"the {gib(shm)} free in {sysmem.SHM_DIR}"),
        (lambda k: _shared(k) + k * PROCESS_BYTES <= avail,
         f"its memory ({gib(shared)} shared and at least {gib(PROCESS_BYTES)} per device process: "
         f"{gib(shared + private)}) exceeds the {gib(avail)} this machine has available"),
        (lambda k: k * (k + 1) * per_ring <= ADDRESS_SPACE,
         f"its shared segment ({gib(layout.total_bytes)}, mostly a ring of {gib(layout.ring_bytes)} per pair "
         f"of devices) is more than the {gib(ADDRESS_SPACE)} of address space one mapping may take"),
        (lambda k: FDS_PER_DEVICE * k + FDS_SPARE <= files,
         f"the driver needs {FDS_PER_DEVICE} open files per device ({FDS_PER_DEVICE * n + FDS_SPARE} in "
         f"all) and may open {files} (ulimit -n)"),
    ]
    failed = [(ok, why) for ok, why in limits if not ok(n)]
    if not failed:
        return
    fits = _largest(n, lambda k: all(ok(k) for ok, _ in limits))
    why = "; ".join(why for _, why in failed)
    raise ResourceLimitError(
        f"a cluster of {n} devices does not fit on this machine: {why}. At most {fits} devices fit "
        f"(with ring_bytes={layout.ring_bytes}); use fewer devices",
        devices=n, fits=fits, shm_free=shm, available=avail)


def _largest(n: int, ok: Callable[[int], bool]) -> int:
    """The largest k < n with ``ok(k)`` (``ok`` holds for every smaller k too), 0 if none does."""
    lo, hi = 0, n  # ok(lo) assumed (0 devices need nothing), not ok(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return lo
