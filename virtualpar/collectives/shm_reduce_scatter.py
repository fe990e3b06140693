"""Shared-memory reduce_scatter: member r reduces piece r straight out of its peers' memory.

The first half of the shared-memory all_reduce (``shm.py``) is a reduce_scatter already: there
member r reduces slice r of every member's array.  Here the slices are the pieces
``numpy.array_split(x, n, axis=dim)`` gives (the ring's), and the reduced piece is the result, so
nothing is published and nobody copies anything out.  Each member copies into its own scratch the
pieces its peers need (all but its own); after a fence member r reduces piece r of every member's
array — in rank order, ``x_0 ⊕ x_1 ⊕ … ⊕ x_{n−1}``, its own term read in place — into its result;
a second fence keeps each scratch until the last reader is done.  With M the bytes of the array,
per member and per call::

    copy in     (n−1)/n·M       reduce     M/n·n = M read, M/n written
    fences      2 (one for an array small enough to ride in a fence), n−1 wake-ups each

where the ring makes n−1 steps, each a message of M/n copied into a channel and out of it and
each a wake-up per member: at 128 devices and 64 KiB the ring took 360–560 ms, the all_reduce
through shared memory 50 ms.

Along ``dim`` ≠ 0 the pieces are not contiguous: the array is laid out with ``dim`` first (one
copy), so that piece c is one block of the flattened array, and the reduced piece is moved back.
Arrays larger than the scratch go in rounds of scratch/n items of every piece (two fences each:
``shm_pieces.py``); those of at most ``fence_payload_bytes`` ride in one fence
(``SharedComm.fence_exchange``) and each member reduces its piece of the n rows.  Groups of
``shm.STRIDED_MIN_MEMBERS`` or more evenly spaced members read every member's scratch as one
strided view, as the all_reduce does.  Every element is computed by
one member in one order, so the result is the same from run to run; the ring adds in another
order (starting after the piece's owner), so the two may differ in the last bit of a float sum.

Bytes are counted as if each read of a peer's piece were a message from that peer: member j
"sends" each peer r piece r of its input, (n−1)/n·M bytes per member for equal pieces — the ring's
figure.  The modelled clock is charged as the ring reduce_scatter of these pieces (what real
hardware runs: no accelerator shares memory).
"""

from __future__ import annotations

import numpy as np

from virtualpar.collectives import shm
from virtualpar.collectives.comm import SharedComm
from virtualpar.collectives.ops import REDUCE_OPS, finalize
from virtualpar.collectives.shm_pieces import piece_rounds, round_count

__all__ = ["reduce_scatter"]


def reduce_scatter(comm: SharedComm, x: np.ndarray, dim: int = 0, op: str = "sum") -> np.ndarray:
    """Reduce_scatter through shared scratch memory; see the module docstring for the protocol and cost."""
    n, r = comm.size, comm.rank
    x = np.asarray(x)
    if n == 1:
        return finalize(op, np.array(x, copy=True), 1)
    front = np.moveaxis(x, dim, 0)  # dim first: piece c is items [e[c], e[c+1]) of the flattened array
    source = np.ascontiguousarray(front).reshape(-1)
    inner = int(np.prod(front.shape[1:], dtype=np.int64))
    b = shm.split_bounds(front.shape[0], n)
    e = [k * inner for k in b]
    result = comm.empty((b[r + 1] - b[r],) + front.shape[1:], x.dtype)  # piece r, dim first
    out = result.reshape(-1)
    ufunc = REDUCE_OPS[op].ufunc
    if 0 < source.nbytes <= comm.fence_payload_bytes:  # one fence carries every member's array
        rows, rounds = comm.fence_exchange(source), 1
        if out.size:
            shm.reduce_rows(ufunc, rows[:, e[r] : e[r + 1]], out)
    else:
        rounds = round_count(comm, e, source.dtype.itemsize)
        for lo, hi, terms in piece_rounds(comm, source, e, "reduce_scatter", "ring"):
            shm.reduce_rows(ufunc, terms, out[lo:hi])
    finalize(op, out, n)
    itemsize = x.dtype.itemsize
    comm.account_all(np.diff(e) * itemsize, messages=rounds)  # peer j read piece j of ours
    comm.model_ring_reduce_scatter([int(k) * itemsize for k in np.diff(e)])
    return np.ascontiguousarray(np.moveaxis(result, 0, dim)) if dim else result
