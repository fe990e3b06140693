"""Ring collectives: bandwidth-optimal all_reduce, all_gather and reduce_scatter.

The n members form a ring ``r → r+1 (mod n)``; each step every member sends one chunk to its right
neighbour while receiving one from its left (``sendrecv``), so every link is busy every step and no
member ever sends more than its share.  With M the size in bytes of the full array:

    reduce_scatter   n−1 steps of M/n bytes   → (n−1)/n·M bytes sent per member
    all_gather       n−1 steps of M/n bytes   → (n−1)/n·M
    all_reduce       2(n−1) steps of M/n      → 2(n−1)/n·M  (reduce_scatter then all_gather)

which meets the lower bound for all_reduce on any topology where each member has one outgoing link
at a time (Patarasuk & Yuan, "Bandwidth optimal all-reduce algorithms for clusters of
workstations", JPDC 2009).  Latency is 2(n−1)·α, linear in n: for small messages prefer ``tree``.

Chunk c of the reduction is accumulated along the ring starting at member c+1 and ending at its
owner c, so each element is computed exactly once and then copied: every member gets the same bits.
"""

from __future__ import annotations

import numpy as np

from virtualpar.collectives.comm import Comm, sendrecv
from virtualpar.collectives.ops import combine, finalize

__all__ = ["all_reduce", "all_gather", "reduce_scatter"]


def all_reduce(comm: Comm, x: np.ndarray, op: str = "sum") -> np.ndarray:
    """Ring all_reduce: reduce-scatter then all-gather of n chunks; 2(n−1) steps of M/n bytes.

    The flattened array is split into n chunks like ``numpy.array_split`` (some are empty when
    ``x.size < n``; they are still sent, as 0-byte messages, so every member takes 2(n−1) steps).
    Member r sends every chunk but its own in the first phase and every chunk but chunk r+1 in the
    second: 2M − |chunk r| − |chunk r+1| bytes, exactly 2(n−1)/n·M when n divides the size.

    Example for n = 3, chunks a, b, c, member r holds a_r, b_r, c_r::

        reduce-scatter  step 0:  r0 ─c0→ r1     r1 ─a1→ r2     r2 ─b2→ r0
                        step 1:  r0 ─b2+b0→ r1  r1 ─c0+c1→ r2  r2 ─a1+a2→ r0
                        now r0 owns a = a0+a1+a2, r1 owns b, r2 owns c
        all-gather      step 0:  r0 ─a→ r1      r1 ─b→ r2      r2 ─c→ r0
                        step 1:  r0 ─c→ r1      r1 ─a→ r2      r2 ─b→ r0

    Source: Patarasuk & Yuan, JPDC 2009.
    """
    n, r = comm.size, comm.rank
    buf = np.array(x, copy=True, order="C")  # our own result buffer; the input is never touched
    if n == 1:
        return finalize(op, buf, 1)
    flat = buf.reshape(-1)
    chunks = np.array_split(flat, n)  # contiguous views into buf
    right, left = (r + 1) % n, (r - 1) % n

    # Reduce-scatter: at step s send chunk r−s−1 (raw at s = 0, partial sum afterwards) and add our
    # contribution to chunk r−s−2 as it passes through; after n−1 steps chunk r is complete here.
    for s in range(n - 1):
        send_c, recv_c = (r - s - 1) % n, (r - s - 2) % n
        incoming = sendrecv(comm, chunks[send_c], right, left)
        combine(op, chunks[recv_c], incoming)
    finalize(op, chunks[r], n)

    # All-gather: at step s forward chunk r−s (our own at s = 0) and receive chunk r−s−1 straight
    # into its place in the result.
    for s in range(n - 1):
        send_c, recv_c = (r - s) % n, (r - s - 1) % n
        sendrecv(comm, chunks[send_c], right, left, out=chunks[recv_c])
    return buf


def all_gather(comm: Comm, x: np.ndarray, dim: int = 0) -> np.ndarray:
    """Ring all_gather (allgatherv): n−1 steps; pieces may differ in size along ``dim``.

    Member r contributes ``x`` (its piece r); the result is the concatenation of all pieces along
    ``dim`` in rank order.  Each member sends every piece but that of its right neighbour once:
    (n−1)/n·M bytes when the pieces are equal.  Messages carry their own shape, so uneven pieces
    need no size pre-exchange::

        step 0: r0 ─p0→ r1 ─p1→ r2 ─p2→ r0
        step 1: r0 ─p2→ r1 ─p0→ r2 ─p1→ r0      (forward what arrived last step)

    Source: Thakur, Rabenseifner & Gropp, "Optimization of collective communication operations
    in MPICH", IJHPCA 2005 (ring allgather).
    """
    n, r = comm.size, comm.rank
    x = np.asarray(x)
    if n == 1:
        return np.concatenate([x], axis=dim)
    pieces: list[np.ndarray | None] = [None] * n
    pieces[r] = x
    right, left = (r + 1) % n, (r - 1) % n
    for s in range(n - 1):
        send_p, recv_p = (r - s) % n, (r - s - 1) % n
        pieces[recv_p] = sendrecv(comm, np.ascontiguousarray(pieces[send_p]), right, left)
    return np.concatenate(pieces, axis=dim)


def reduce_scatter(comm: Comm, x: np.ndarray, dim: int = 0, op: str = "sum") -> np.ndarray:
    """Ring reduce_scatter: piece r of ``x_0 ⊕ … ⊕ x_{n−1}`` on member r; n−1 steps, (n−1)/n·M bytes.

    Every member holds a full array ``x``; it is split along ``dim`` as
    ``numpy.array_split(x, n, axis=dim)``.  Partial sums travel the ring; at step s member r sends
    the partial of piece r−s−1 and adds its own contribution to piece r−s−2, which it receives::

        piece c:  r(c+1) ─x→ r(c+2) ─x+x→ … ─→ r(c) adds the last term and keeps the result

    Source: Patarasuk & Yuan, JPDC 2009 (first phase of the ring all_reduce).
    """
    n, r = comm.size, comm.rank
    x = np.asarray(x)
    if n == 1:
        return finalize(op, np.array(x, copy=True), 1)
    pieces = np.array_split(x, n, axis=dim)  # views of the input: only read
    right, left = (r + 1) % n, (r - 1) % n
    partial: np.ndarray | None = None
    for s in range(n - 1):
        send_p, recv_p = (r - s - 1) % n, (r - s - 2) % n
        outgoing = np.ascontiguousarray(pieces[send_p]) if s == 0 else partial
        # The received array is fresh and ours: accumulate into it instead of copying our piece.
        partial = combine(op, sendrecv(comm, outgoing, right, left), pieces[recv_p])
    return finalize(op, partial, n)
