"""The warm-up a cluster runs once, right after start-up, so that its first collectives cost what later
ones do.

Why: a forked device shares the driver's memory copy-on-write, and CPython writes into every
object and code object it runs (reference counts, the specialising interpreter's caches), so the
first pass through any code path copies each page it touches (~2.5–10 µs a page on this VM); the
first use of shared scratch memory allocates its pages and maps the peers'.  Measured at 64
devices on 2 cores: a device's first barrier took ~290 page faults and ~1.4–6 ms of CPU against
~0.1 ms for the next, so the cluster's first barrier took 60–90 ms against 2–5 ms, and the few
calls after it still carried the spread with which 64 cold devices left it.  MPI pays the same in
``MPI_Init`` and NCCL in its communicator's set-up; here the driver starts the warm-up as the
last step of ``VirtualCluster()`` and does not wait for it: the cluster finishes warming while the
driver's own code goes on, and the first call that needs the devices waits for the rest
(``ClusterControl.finish_warm_up``).

Every device runs, over the whole mesh, each twice (the second call takes the cached paths the
user's repeated calls will take): a barrier, an all_reduce that fills a fence's payload slot, a
broadcast of one item, and — while they stay cheap — an all_gather of one item and an all_reduce
through the shared scratch memory, of ``scratch_warm_bytes(devices, scratch_bytes,
fence_payload_bytes)`` bytes, after which each device reads a byte of every page of that much of
each peer's scratch (``_map_peers``).  Those cost each device a page fault per scratch page it
writes and per peer whose scratch it reads, so they are bounded twice: the scratch the cluster
warms (``WARM_SCRATCH_BYTES`` in all, so at most that much memory), and the cluster's size
(neither above ``WARM_MAX_PEERS`` devices: at 256 devices mapping every peer's scratch took
~1.3–1.9 s of the cluster's time).  Shuffled mode pauses nothing in it (its seeded pauses are the
user's ops').  Afterwards every trace of it is wiped, whether it succeeded or not: the device's
modelled clock, op count, flight record, trace events, collective sequence numbers and message
numbers here, and the traffic counters and published clocks in the driver once every device is
done.  (A device that *died* in it keeps its flight record: that is what the driver reports, as
"during the warm-up".)  A failure is raised by the first call, saying it was the warm-up's.
``VirtualCluster(warm_up=False)`` skips it.

First, each device reads every doorbell once (``_map_doorbells``).  A doorbell is a POSIX
semaphore, a page of its own that a forked device maps only when it first touches it; the last
member to arrive at a fence rings every other member, so each device's first ring took a page
fault per peer (~3 µs each, measured: 64 first posts 160–200 µs, later ones 5 µs), one after
the other on the critical path of the wake-up wave — 63 of them at 64 devices, in whichever of
the first barriers that device happened to arrive last.  At 256 devices the reads cost each
device ~0.7 ms, once.

Up to ``WARM_MAX_PEERS`` devices, the barrier and the all_reduce that rides in a fence run
``QUICKEN_ROUNDS`` times in all: CPython 3.11 specialises (quickens) a function's bytecode only on
its 8th call, and until then every call of the collective path runs the generic, slower
instructions.  Measured at 16 devices on 2 cores (5 clusters each, the bench's protocol; this VM's
speed swings, so these are indications, not paired figures): after two rounds the bench's first
barrier took 0.96–1.34 ms, 2.0–3.5× its tenth; after this warm-up 0.69–1.68 ms, 1.8–2.3×; with
ten rounds of the very calls in a run just before, 0.65–0.86 ms, 1.1–2.0× (so more than
specialisation is at work: the CPU of a device's barrier still falls from ~40–60 to ~25 µs over
its first ten calls).  The warm-up costs ~0.1 s more at 64 devices; above 64 each round costs tens
of ms, and it is skipped.

Last, each device faults in a reserve of ``result_reserve_bytes(devices)`` for its receive-buffer
pool (transport/pool.py): the results of its first collectives of each size land there instead
of in fresh pages (a 512 KiB result is 128 page faults, half the CPU of a first all_reduce at 16
devices).  Bounded like the scratch: ``RESULT_RESERVE_BYTES`` per device, ``WARM_RESULT_BYTES``
over the cluster (at 256 devices, 256 KiB each).
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["warm_up", "scratch_warm_bytes", "result_reserve_bytes", "WARM_SCRATCH_BYTES", "WARM_MAX_PEERS",
           "WARM_TIMEOUT", "QUICKEN_ROUNDS", "RESULT_RESERVE_BYTES", "WARM_RESULT_BYTES"]

WARM_SCRATCH_BYTES = 32 << 20  # scratch the warm-up may touch, over the whole cluster
WARM_MAX_PEERS = 64  # no scratch all_reduce or all_gather in the warm-up of a larger cluster (see above)
RESULT_RESERVE_BYTES = 1 << 20  # a device's warm reserve for results and receives, at most
WARM_RESULT_BYTES = 64 << 20  # the reserves of the whole cluster, at most
WARM_TIMEOUT = 60.0  # seconds each warm-up op may wait, at least (the driver notices a device that dies)
# rounds of the barrier and the small all_reduce: CPython 3.11 specialises a function's code on its 8th call
QUICKEN_ROUNDS = 8
_PAGE = 4096


def scratch_warm_bytes(devices: int, scratch_bytes: int, fence_payload_bytes: int) -> int:
    """Bytes of the warm-up's scratch all_reduce: ``WARM_SCRATCH_BYTES / devices`` in whole pages, at
    most ``scratch_bytes``; 0 (none) if that does not reach past ``fence_payload_bytes`` (the array
    would ride in a fence) or the cluster has more than ``WARM_MAX_PEERS`` devices."""
    if devices < 2 or devices > WARM_MAX_PEERS:
        return 0
    nbytes = min(scratch_bytes, WARM_SCRATCH_BYTES // devices) // _PAGE * _PAGE
    return nbytes if nbytes > fence_payload_bytes else 0


def result_reserve_bytes(devices: int) -> int:
    """Bytes of each device's warm result reserve: ``WARM_RESULT_BYTES / devices`` in whole pages, at
    most ``RESULT_RESERVE_BYTES``."""
    return min(RESULT_RESERVE_BYTES, WARM_RESULT_BYTES // max(devices, 1)) // _PAGE * _PAGE


def warm_up(dev: Any) -> None:
    """Run the warm-up's collectives on ``dev`` (every device of the cluster at once), then forget them."""
    core = dev._core  # the device's machinery (runtime/core.py)
    ep = core.endpoint
    shuffle, ep.shuffle = ep.shuffle, None  # shuffled mode's pauses are the user's ops'
    try:
        _map_doorbells(ep)
        n, payload = dev.size, core.arrivals.payload_bytes
        small = np.zeros(max(1, payload // 8))  # fills this device's fence slots (both parities: two calls)
        big_bytes = scratch_warm_bytes(n, core.scratch_bytes, payload)
        big = np.zeros(big_bytes // 8) if big_bytes else None
        timeout = max(dev.config.timeout, WARM_TIMEOUT)  # a user's short op timeout is for the user's ops
        for _ in range(2):
            dev.barrier(timeout=timeout)
            dev.all_reduce(small, timeout=timeout)
            dev.broadcast(small[:1] if dev.rank == 0 else None, timeout=timeout)  # (one page of one scratch)
            if n <= WARM_MAX_PEERS:  # (each device reads a page of every peer's scratch)
                dev.all_gather(small[:1], timeout=timeout)
            if big is not None:  # (named: the default takes the ring below 64 KiB of scratch)
                dev.all_reduce(big, algorithm="shm", timeout=timeout)
        if n <= WARM_MAX_PEERS:  # the cheap calls, until CPython has specialised their code (see above)
            for _ in range(QUICKEN_ROUNDS - 2):
                dev.barrier(timeout=timeout)
                dev.all_reduce(small[:1], timeout=timeout)
        if big is not None:
            _map_peers(core.scratch_table, big_bytes)
        _warm_reductions()
        core.pool.reserve(result_reserve_bytes(n))
    finally:
        ep.shuffle = shuffle
        _forget(core)


def _map_peers(scratch_table: np.ndarray, nbytes: int) -> None:
    """Read one byte of every page of the first ``nbytes`` of every peer's scratch, which the
    warm-up's all_reduce has written: the pages are then mapped here too.  That all_reduce reads
    from each peer only the slice this device reduces and the slice the peer reduced, so a user's
    all_reduce of another size still took a minor fault per 64 KiB (the kernel maps 16 pages per
    fault) of each peer's slices it had not read: 46 faults per device in the first 512 KiB
    all_reduce at 16 devices, 0–1 in the next."""
    int(scratch_table[:, :nbytes:_PAGE].max())  # every device's rows (ours is mapped already)


def _map_doorbells(ep: Any) -> None:
    """Read every device's doorbell once, so that its page is mapped here (see the module docstring)."""
    for bell in ep.doorbells:
        try:
            bell.get_value()
        except NotImplementedError:  # (macOS has no sem_getvalue)
            return


def _warm_reductions() -> None:
    """Run every reduce op's numpy loops once, here, on a column and on rows of the common float
    dtypes — the paths the shared-memory collectives reduce with (``shm.reduce_rows``).  numpy
    resolves and caches a ufunc's loop for a dtype on its first call in a process: a device's first
    all_reduce with op="max" of one float took ~270 µs of CPU at 16 devices on 2 cores, ~245 µs
    after this (its repeats ~65).  Also the stable argsort of float64 by which the last member of a
    fence orders its wake-ups (transport/arrivals.py): a device's first ring faulted in that code
    of numpy's library (seen by perf in the second barrier at 32 devices)."""
    from virtualpar.collectives.ops import REDUCE_OPS
    from virtualpar.collectives.shm import reduce_rows

    for ufunc in {op.ufunc for op in REDUCE_OPS.values()}:
        for dtype in (np.float64, np.float32):
            for k in (1, 2):
                reduce_rows(ufunc, np.ones((2, k), dtype), np.empty(k, dtype))
    np.zeros(2).argsort(kind="stable")


def _forget(core: Any) -> None:
    """Wipe what the warm-up left on this device (the driver zeroes the shared counters and clocks)."""
    core.clock.reset()
    core.publish_clock()
    core.recorder.reset()
    core.events.clear()
    core.op_seq = 0
    core.last_op = ""
    core.group_seq.clear()
    core.endpoint.renumber()
    core.pool.clear()  # the big result's buffer: warm only for that one size, n of them held for nothing
