"""Which algorithm a collective runs when the caller does not choose: by size, group and machine.

Like MPICH's and NCCL's tuning tables, the choice depends on the message: small all_reduces are
bound by per-message latency, where the binomial ``tree`` (2⌈log2 n⌉ messages) beats the ring's
2(n−1); large ones are bound by memory bandwidth, where reducing straight out of shared memory
(``shm``) beats any message algorithm.  The thresholds were measured with
``benchmarks/bench_collectives.py`` on a 2-core VM (see benchmarks/README.md); every device of a
group computes the same choice from the same shape, dtype and group size, so the choice never
splits a group.
"""

from __future__ import annotations

from virtualpar.collectives.registry import DEFAULT_ALGORITHMS

__all__ = ["default_algorithm", "SHM_MIN_BYTES"]

SHM_MIN_BYTES = 64 << 10  # all_reduce at or above this goes through shared memory when there is some


def default_algorithm(collective: str, nbytes: int, size: int, shared_memory: bool = False) -> str:
    """The algorithm for ``collective`` on ``nbytes`` per member in a group of ``size``.

    ``shared_memory``: the members can read each other's scratch (a ``SharedComm``).
    """
    if collective == "all_reduce":
        if shared_memory and size > 1 and nbytes >= SHM_MIN_BYTES:
            return "shm"
        return "tree" if nbytes < SHM_MIN_BYTES else "ring"
    return DEFAULT_ALGORITHMS[collective]
