"""Shared-memory all_to_all: every member copies its piece of every peer's array straight out of
the peer's scratch.

Member j's array is split as ``numpy.array_split(x_j, n, axis=split_dim)``; piece r goes to member
r, which concatenates the pieces it receives along ``concat_dim`` in rank order (``direct.py``'s
contract).  Here each member copies into its own scratch the pieces its peers need (all but its
own); after a fence member r copies piece r out of every member's scratch; a second fence keeps
each scratch until the last reader is done.  With M the bytes of the array, per member::

    copy in     (n−1)/n·M        copy out   (n−1)/n·M       fences   2, n−1 wake-ups each

where the pairwise exchange makes n−1 steps, each a message copied into a channel and out of it
and a wake-up per member: at 128 devices and 64 KiB the exchange took 0.7–1.1 s.

Along ``split_dim`` ≠ 0 the pieces are not contiguous: the array is laid out with ``split_dim``
first (one copy), so that piece c is one block of the flattened array.  Arrays larger than the
scratch go ``scratch_bytes`` at a time, two fences per round; those of at most
``fence_payload_bytes`` ride in one fence (``SharedComm.fence_exchange``), each member taking its
piece of the n rows.  Groups of
``shm.STRIDED_MIN_MEMBERS`` or more evenly spaced members read every member's scratch as one
strided view: one numpy copy takes piece r of all n members.  Every member's array must have the
same shape and dtype (the contract check, on by default, names a member whose call differs).

Bytes are counted as if each read were a message: member j "sends" each peer r piece r of its
array — the pairwise exchange's figures.  The modelled clock is charged as that exchange (n−1
``sendrecv`` steps, ``sim.exchange``): what runs where no memory is shared.
"""

from __future__ import annotations

import numpy as np

from virtualpar.collectives import shm
from virtualpar.collectives.comm import SharedComm
from virtualpar.errors import UsageError

__all__ = ["all_to_all"]


def all_to_all(comm: SharedComm, x: np.ndarray, split_dim: int = 0, concat_dim: int = 0) -> np.ndarray:
    """All_to_all through shared scratch memory; see the module docstring for the protocol and cost."""
    n, r = comm.size, comm.rank
    x = np.asarray(x)
    if n == 1:
        return np.concatenate([x], axis=concat_dim)
    front = np.moveaxis(x, split_dim, 0)  # piece c: items [e[c], e[c+1]) of the flattened array
    source = np.ascontiguousarray(front).reshape(-1)
    inner = int(np.prod(front.shape[1:], dtype=np.int64))
    b = shm.split_bounds(front.shape[0], n)
    e = [k * inner for k in b]
    got = comm.empty((n, e[r + 1] - e[r]), x.dtype)  # row j: piece r of member j, flattened
    if 0 < source.nbytes <= comm.fence_payload_bytes:  # one fence carries every member's array
        got[...], rounds = comm.fence_exchange(source)[:, e[r] : e[r + 1]], 1
    else:
        rounds = _through_scratch(comm, source, e, got)
    blocks = got.reshape((n, b[r + 1] - b[r]) + front.shape[1:])  # block j, split_dim first
    if split_dim == concat_dim == 0:  # the blocks one after the other are the result
        result = blocks.reshape((n * (b[r + 1] - b[r]),) + front.shape[1:])
    else:
        pieces = [np.moveaxis(block, 0, split_dim) for block in blocks]
        shape = list(pieces[0].shape)
        shape[concat_dim] *= n
        result = np.concatenate(pieces, axis=concat_dim, out=comm.empty(tuple(shape), x.dtype))
    itemsize = x.dtype.itemsize
    piece_nbytes = [int(k) * itemsize for k in np.diff(e)]
    comm.account_all(np.asarray(piece_nbytes, np.int64), messages=rounds)  # peer j read piece j of ours
    comm.model_pairwise_all_to_all(piece_nbytes)
    return result


def _through_scratch(comm: SharedComm, source: np.ndarray, e: list[int], got: np.ndarray) -> int:
    """Copy items [e[r], e[r+1]) of every member's ``source`` into row j of ``got``,
    ``scratch_bytes`` at a time: copy in, fence, copy out, fence per round.  Returns the rounds."""
    n, r = comm.size, comm.rank
    itemsize = source.dtype.itemsize
    capacity = comm.scratch_bytes // itemsize
    if capacity < 1:
        raise UsageError(
            f"all_to_all algorithm 'shm' needs scratch memory of at least one {source.dtype} element per device, "
            f"but the cluster has scratch_bytes={comm.scratch_bytes}; start it with a larger scratch_bytes "
            "or choose algorithm='direct'")
    table = comm.scratch_rows() if n >= shm.STRIDED_MIN_MEMBERS else None
    if table is not None:
        rows = table[:, : capacity * itemsize].view(source.dtype)
    else:
        rows = [comm.scratch(j)[: capacity * itemsize].view(source.dtype) for j in range(n)]
    mine, total, rounds = rows[r], source.size, 0
    for start in range(0, max(total, 1), capacity):  # an empty array still takes one (empty) round
        m = min(capacity, total - start)
        chunk = source[start : start + m]
        lo, hi = min(max(e[r] - start, 0), m), min(max(e[r + 1] - start, 0), m)  # our piece, in this chunk
        if table is not None:
            mine[:m] = chunk  # our own piece too: one strided copy reads every row
        else:
            mine[:lo] = chunk[:lo]
            mine[hi:m] = chunk[hi:]
        comm.fence()  # every member's chunk is in its scratch (the contract check rides on the first)
        if hi > lo:
            dst = got[:, start + lo - e[r] : start + hi - e[r]]
            if table is not None:
                dst[...] = rows[:, lo:hi]
            else:
                for j in range(n):
                    dst[j] = chunk[lo:hi] if j == r else rows[j][lo:hi]
        comm.fence()  # nobody reads our scratch any more: it may be reused
        rounds += 1
    return rounds
