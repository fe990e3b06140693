"""Which algorithm a collective runs when the caller does not choose: by size, group and machine.

Like MPICH's and NCCL's tuning tables, the choice depends on the message: small all_reduces are
bound by per-message latency, where the binomial ``tree`` (2⌈log2 n⌉ messages) beats the ring's
2(n−1); large ones are bound by memory bandwidth, where reducing straight out of shared memory
(``shm``) beats any message algorithm.  ``benchmarks/bench_algorithms.py`` sweeps 2 to 64
devices and 1 KiB to 4 MiB (table in benchmarks/README.md): since fences wake only n−1 members,
``shm`` is faster *here* than the tree at every size once a group has more than 2 members — but
it is charged to the modelled clock as the algorithm real hardware would run for that size — the
ring from 64 KiB, the recursive-doubling tree below — so the default takes ``shm`` at every size
for every group of 2 or more.  (Pairs below 8 KiB took the tree until fences became one shared
word per group kind: a paired sweep on 2026-11-23 put ``shm`` at 0.72–0.93× the tree's time for a
pair from 8 bytes to 64 KiB, alone and inside a 16-device cluster.)  A barrier is one fence
(charged exactly as the dissemination barrier).  An all_gather and a broadcast run ``shm`` for
every group of 2 or more (the same sweep with ``--collective all_gather`` / ``broadcast``: best at
every size from 2 to 64 devices; the all_gather 2.5–4× faster than the ring); their choice ignores
the size, because all_gather pieces may differ in size, and only a broadcast's root has an array,
while the group must agree.  A reduce_scatter runs ``shm`` in groups of 3 or more at every size
(``--collective reduce_scatter``, 2026-11-26: 1.5–8.8× faster than the ring from 4 to 64
devices, 1 KiB to 4 MiB) and in pairs from 64 KiB (1.4–3.3×); below that a pair's ring is one
message each way and ties with the fence or beats it (two runs of 9 rounds, 8 bytes to 8 KiB:
0.051–0.059 against 0.056–0.059 ms, and 0.051–0.058 against 0.058–0.077).  An all_to_all runs
``shm`` in every group of 2 or more (``--collective all_to_all``: 1.6–12.8× faster than the
pairwise exchange from 4 to 64 devices at every size; pairs tie up to 64 KiB, 0.049 against
0.052 ms at 8 bytes, and ``shm`` is 1.7–3.3× faster from 512 KiB).  Every device of a group
computes the same choice from the same shape, dtype and group size, so the choice never splits a
group.
"""

from __future__ import annotations

from virtualpar.collectives.registry import DEFAULT_ALGORITHMS
from virtualpar.collectives.shm import RING_MIN_BYTES

__all__ = ["default_algorithm", "SHM_MIN_BYTES"]

SHM_MIN_BYTES = RING_MIN_BYTES  # from here messages run (and shm is charged as) the ring; below, the tree


def default_algorithm(collective: str, nbytes: int, size: int, shared_memory: bool = False) -> str:
    """The algorithm for ``collective`` on ``nbytes`` per member in a group of ``size``.

    ``shared_memory``: the members can read each other's scratch (a ``SharedComm``).
    """
    if collective == "barrier" and shared_memory and size > 1:
        return "shm"  # one fence over shared counters, no messages
    if collective in ("all_gather", "broadcast", "all_to_all") and shared_memory and size > 1:
        return "shm"  # copied straight out of the owner's scratch: 2 fences (or 1), no messages
    if collective == "reduce_scatter" and shared_memory and \
            (size > 2 or size == 2 and nbytes >= SHM_MIN_BYTES):
        return "shm"  # a pair below 64 KiB: one message each way costs what a fence does
    if collective == "all_reduce":
        if shared_memory and size > 1:
            return "shm"
        return "tree" if nbytes < SHM_MIN_BYTES else "ring"
    return DEFAULT_ALGORITHMS[collective]
