"""Tree collectives: latency-optimal all_reduce (recursive doubling), binomial broadcast and reduce.

These take ⌈log2 n⌉ rounds instead of the ring's n−1 steps, but move the whole array M each round,
so they win for small messages (latency-bound) and lose for large ones (bandwidth-bound).
Source: Thakur, Rabenseifner & Gropp, "Optimization of collective communication operations in
MPICH", IJHPCA 19(1), 2005.
"""

from __future__ import annotations

import numpy as np

from virtualpar.collectives.comm import Comm, sendrecv
from virtualpar.collectives.ops import combine, finalize
from virtualpar.sim.schedules import tree_children

__all__ = ["all_reduce", "broadcast", "reduce"]


def all_reduce(comm: Comm, x: np.ndarray, op: str = "sum") -> np.ndarray:
    """Recursive-doubling all_reduce: log2(p) exchange rounds of M bytes, p = 2^⌊log2 n⌋.

    Cost: ``log2 p`` rounds of M bytes each way when n is a power of two (log2(n)·M bytes sent per
    member); otherwise the e = n − p extra members first fold their array into member ``r − p``
    (1 message of M) and get the result back at the end (1 more), so 2 + log2 p rounds in all.
    Round k pairs member r with ``r XOR 2^k``; after it, both hold the reduction of their aligned
    block of 2^(k+1) members::

        n = 4     round 0: 0↔1  2↔3        round 1: 0↔2  1↔3
        n = 6     fold: 4→0 5→1;  rounds on 0..3;  unfold: 0→4 1→5

    Why every member gets the same bits: both partners of a round compute
    ``lower_block ⊕ upper_block`` with the lower-ranked block as first operand (the operand order
    matters for NaN payloads and for max/min of ±0), and by induction both blocks' values are already
    bit-identical on their members; the extra members receive a copy.  So every member evaluates the
    same fixed expression tree over ranks.
    """
    n, r = comm.size, comm.rank
    acc = np.array(x, copy=True, order="C")
    if n == 1:
        return finalize(op, acc, 1)
    p = 1 << (n.bit_length() - 1)  # largest power of two ≤ n
    extra = n - p
    if r >= p:  # fold in, then wait for the result
        comm.send(acc, r - p)
        return comm.recv(r - p, out=acc)
    if r < extra:
        combine(op, acc, comm.recv(r + p))  # r < r + p: our block is the lower operand
    mask = 1
    while mask < p:
        partner = r ^ mask
        incoming = sendrecv(comm, acc, partner, partner)
        if partner < r:  # keep lower ⊕ upper: accumulate ours into the (fresh) incoming array
            acc = combine(op, incoming, acc)
        else:
            combine(op, acc, incoming)
        mask <<= 1
    finalize(op, acc, n)
    if r < extra:
        comm.send(acc, r + p)
    return acc


def broadcast(comm: Comm, x: np.ndarray | None, root: int = 0) -> np.ndarray:
    """Binomial-tree broadcast from ``root``: ⌈log2 n⌉ rounds; each non-root receives M once.

    With v = (rank − root) mod n, member v receives from v − 2^j (2^j its lowest set bit) and then
    sends to v + 2^i for i = j−1 … 0, largest subtree first (the root sends for every i).  The root
    sends up to ⌈log2 n⌉·M bytes, inner members fewer, leaves none.  ``x`` is only read on the
    root; other members may pass None (the message carries shape and dtype)::

        n = 8 (v):  round 0: 0→4   round 1: 0→2 4→6   round 2: 0→1 2→3 4→5 6→7
    """
    n, r = comm.size, comm.rank
    v = (r - root) % n
    data = np.array(x, copy=True) if v == 0 else comm.recv((v - (v & -v) + root) % n)  # from v − lowbit(v)
    for child in tree_children(v, n):  # the same order the modelled clock prices (sim/schedules.py)
        comm.send(data, (child + root) % n)
    return data


def reduce(comm: Comm, x: np.ndarray, root: int = 0, op: str = "sum") -> np.ndarray | None:
    """Binomial-tree reduce to ``root``: ⌈log2 n⌉ rounds; every non-root sends M exactly once.

    The mirror image of ``broadcast``: in round k, members whose v = (rank − root) mod n has lowest
    set bit 2^k send their partial to v − 2^k and stop; the others add what they receive.  Only the
    root computes the final value, so there is nothing to keep bit-identical.  Returns the result
    on the root and None elsewhere::

        n = 8 (v):  round 0: 1→0 3→2 5→4 7→6   round 1: 2→0 6→4   round 2: 4→0
    """
    n, r = comm.size, comm.rank
    v = (r - root) % n
    acc = np.array(x, copy=True, order="C")
    mask = 1
    while mask < n:
        if v & mask:
            comm.send(acc, (v - mask + root) % n)
            return None
        if v + mask < n:
            combine(op, acc, comm.recv((v + mask + root) % n))
        mask <<= 1
    return finalize(op, acc, n)
