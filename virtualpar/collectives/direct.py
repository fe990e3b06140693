"""Direct (one-hop) collectives: every message goes straight from its source to its destination.

Simple and latency-friendly (one step, or n−1 pairwise steps), but all_reduce here moves
(n−1)·M bytes per member — n/2 times the ring's 2(n−1)/n·M — and is kept for teaching comparisons.
gather, scatter and all_to_all are naturally direct: every byte must travel from source to
destination anyway.  Source for the schedules: Thakur, Rabenseifner & Gropp, "Optimization of
collective communication operations in MPICH", IJHPCA 2005.
"""

from __future__ import annotations

import os

import numpy as np

from virtualpar.collectives.comm import Comm, sendrecv
from virtualpar.collectives.ops import combine, finalize
from virtualpar.errors import UsageError

__all__ = ["all_reduce", "all_gather", "gather", "scatter", "all_to_all", "barrier",
           "check_all_reduce_memory"]

HELD_PER_TERM = 3  # bytes of memory per byte of the terms in flight: measured, see check_all_reduce_memory


def _machine_bytes() -> int:
    """Physical memory, or the memory limit of this process's cgroup (v2 ``memory.max``, v1
    ``memory.limit_in_bytes``) if lower: the same for every device of a cluster (forked together).
    Only the process's own cgroup is read, where ``/proc/self/cgroup`` says it is mounted: a limit
    set on a parent, or a cgroup the container cannot see by that path, leaves RAM."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:
        with open("/proc/self/cgroup") as f:
            lines = [line.rstrip("\n").split(":", 2) for line in f]
    except OSError:
        return total
    lines = [line for line in lines if len(line) == 3]  # hierarchy:controllers:path
    for hier, controllers, path in lines:
        if hier == "0":
            limit = f"/sys/fs/cgroup{path.rstrip('/')}/memory.max"
        elif "memory" in controllers.split(","):
            limit = f"/sys/fs/cgroup/memory{path.rstrip('/')}/memory.limit_in_bytes"
        else:
            continue
        try:
            with open(limit) as f:
                total = min(total, int(f.read()))
        except (OSError, ValueError):  # no such file, or "max"
            pass
    return total


MACHINE_BYTES: int | None = None  # _machine_bytes(), worked out on the first check


def _exchange_with_all(comm: Comm, x: np.ndarray) -> list[np.ndarray]:
    """Send ``x`` to every peer and receive every peer's array; returns them indexed by rank.

    All receives are posted before any send so the exchange cannot deadlock on bounded buffers;
    sends go to r+1, r+2, … so that not everyone hits member 0 first.
    """
    n, r = comm.size, comm.rank
    x = np.asarray(x, order="C")  # not ascontiguousarray: it turns a 0-d array into 1-d
    recvs = {(r - k) % n: comm.irecv((r - k) % n) for k in range(1, n)}
    sends = [comm.isend(x, (r + k) % n) for k in range(1, n)]
    arrays = [x if peer == r else recvs[peer].wait() for peer in range(n)]
    for req in sends:
        req.wait()
    return arrays


def all_reduce(comm: Comm, x: np.ndarray, op: str = "sum") -> np.ndarray:
    """Direct all_reduce: one step, (n−1)·M bytes sent per member; every member sums all n arrays.

    Every member evaluates ``((x_0 ⊕ x_1) ⊕ x_2) ⊕ …`` in rank order, the same expression with the
    same operand order everywhere, so the results are bit-identical::

        r0 ⇄ r1, r0 ⇄ r2, r1 ⇄ r2  (everyone sends everything to everyone)
    """
    arrays = _exchange_with_all(comm, np.asarray(x))
    # A received array is fresh and ours to accumulate into; our own input must not be touched.
    acc = np.array(arrays[0], copy=True) if comm.rank == 0 else arrays[0]
    for contribution in arrays[1:]:
        combine(op, acc, contribution)
    return finalize(op, acc, comm.size)


def check_all_reduce_memory(where: str, n: int, nbytes: int, devices: int) -> None:
    """Refuse a direct all_reduce of ``nbytes`` over groups of ``n`` members of a cluster of
    ``devices`` on one machine that would need more than 80% of its memory (``MACHINE_BYTES``).
    Every member receives the n−1 other arrays before it adds them (rank order, for the same bits
    everywhere), and a virtual cluster's transport takes a large message as soon as it is offered,
    so each member holds ~(n−1)·M bytes of terms at once, and all the groups of a mesh axis call
    together: ``devices``·(n−1)·M in all, ``HELD_PER_TERM`` times that measured with the buffers
    around them (128 devices reducing 512 KiB needed more than this 24 GiB machine had, and the
    kernel killed a device).  The figures are the same on every member, so every member refuses
    alike (no member waits for another)."""
    global MACHINE_BYTES
    if MACHINE_BYTES is None:
        MACHINE_BYTES = _machine_bytes()
    need = HELD_PER_TERM * devices * (n - 1) * nbytes
    if need > 0.8 * MACHINE_BYTES:
        def size(b: float) -> str:
            return f"{b / 2**30:.1f} GiB" if b >= 2**30 else f"{b / 2**20:.1f} MiB"
        raise UsageError(
            f"{where}: algorithm 'direct' would hold ~{size(need)} at once (each of {devices} devices keeps "
            f"{n - 1} array{'s' if n > 2 else ''} of {nbytes} bytes from its group until it has them all), "
            f"more than 80% of this machine's {size(MACHINE_BYTES)}; use the default algorithm ('shm') or "
            "'ring', which hold about one array each")


def all_gather(comm: Comm, x: np.ndarray, dim: int = 0) -> np.ndarray:
    """Direct all_gather (allgatherv): one step, each member sends its piece to all n−1 peers.

    Same (n−1)/n·M bytes per member as the ring for equal pieces, but n−1 messages at once instead of
    n−1 sequential steps.  Result: all pieces concatenated along ``dim`` in rank order.
    """
    return np.concatenate(_exchange_with_all(comm, np.asarray(x)), axis=dim)


def gather(comm: Comm, x: np.ndarray, root: int = 0, dim: int = 0) -> np.ndarray | None:
    """Direct gather: every non-root sends its piece to ``root`` (1 message); root concatenates.

    Pieces may differ in size along ``dim``.  The root receives (n−1) pieces, i.e. (n−1)/n·M bytes
    for equal pieces.  Returns the concatenation in rank order on the root, None elsewhere.
    """
    n, r = comm.size, comm.rank
    x = np.asarray(x)
    if r != root:
        comm.send(np.ascontiguousarray(x), root)
        return None
    pieces = [x if peer == root else comm.recv(peer) for peer in range(n)]
    return np.concatenate(pieces, axis=dim)


def scatter(comm: Comm, x: np.ndarray | None, root: int = 0, dim: int = 0) -> np.ndarray:
    """Direct scatter: root splits ``x`` with ``numpy.array_split`` along ``dim``; piece i goes to i.

    The root sends n−1 pieces ((n−1)/n·M bytes for equal pieces); everyone else receives one.
    ``x`` is only read on the root (others may pass None).  Returns this member's piece (a new array).
    """
    n, r = comm.size, comm.rank
    if r != root:
        return comm.recv(root)
    pieces = np.array_split(np.asarray(x), n, axis=dim)
    sends = [comm.isend(np.ascontiguousarray(pieces[peer]), peer) for peer in range(n) if peer != root]
    for req in sends:
        req.wait()
    return np.array(pieces[root], copy=True)


def all_to_all(comm: Comm, x: np.ndarray, split_dim: int = 0, concat_dim: int = 0) -> np.ndarray:
    """Pairwise all_to_all: n−1 steps; piece j of member i ends up as block i of member j's result.

    ``x`` is split with ``numpy.array_split(x, n, axis=split_dim)``; at step k member r sends piece
    r+k to member r+k and receives from r−k (``sendrecv``, so no step can deadlock).  Each member
    sends all but its own piece: (n−1)/n·M bytes for equal pieces.  The received blocks are
    concatenated along ``concat_dim`` in rank order::

        n = 3   step 1: 0→1 1→2 2→0    step 2: 0→2 1→0 2→1
    """
    n, r = comm.size, comm.rank
    pieces = np.array_split(np.asarray(x), n, axis=split_dim)
    blocks: list[np.ndarray | None] = [None] * n
    blocks[r] = pieces[r]
    for k in range(1, n):
        dst, src = (r + k) % n, (r - k) % n
        blocks[src] = sendrecv(comm, np.ascontiguousarray(pieces[dst]), dst, src)
    return np.concatenate(blocks, axis=concat_dim)


_TOKEN = np.empty(0, dtype=np.uint8)


def barrier(comm: Comm) -> None:
    """Dissemination barrier: ⌈log2 n⌉ rounds of one empty (0-byte) message per member.

    In round k member r signals r + 2^k and waits for r − 2^k; after the last round every member
    has (transitively) heard from every other, so none leaves before all have entered.
    Source: Hensgen, Finkel & Manber, "Two algorithms for barrier synchronization", IJPP 1988.
    """
    n, r = comm.size, comm.rank
    step = 1
    while step < n:
        sendrecv(comm, _TOKEN, (r + step) % n, (r - step) % n)
        step <<= 1
